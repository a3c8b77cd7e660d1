"""Calibration data: the model's own generations and the activations the exit is trained on.

For every position where a draft would be made we keep h_k at each candidate exit layer and the
full model's top-k next-token distribution. Results are cached on disk under a fingerprint of the
model file, the prompts and the settings, so re-runs are cheap.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class DataConfig:
    exits: tuple[int, ...]
    max_new_tokens: int = 96
    batch_size: int = 8
    top_k: int = 64
    temperature: float = 0.8  # odd-numbered conversations are sampled, even ones greedy
    seed: int = 0


@dataclass
class Activations:
    hidden: dict[int, np.ndarray]  # exit layer -> [N, H] h_k at each draft position
    teacher_ids: np.ndarray        # [N, top_k] the full model's most likely next tokens
    teacher_probs: np.ndarray      # [N, top_k] their probabilities (renormalised)
    segment: np.ndarray            # [N] which conversation a position belongs to

    @property
    def greedy(self) -> np.ndarray:  # [N] the full model's greedy next token
        return self.teacher_ids[:, 0]

    def save(self, path: Path) -> None:
        arrays = {f"hidden_{k}": v for k, v in self.hidden.items()}
        np.savez(path, teacher_ids=self.teacher_ids, teacher_probs=self.teacher_probs,
                 segment=self.segment, **arrays)

    @classmethod
    def load(cls, path: Path) -> "Activations":
        with np.load(path) as z:
            hidden = {int(n.split("_")[1]): z[n] for n in z.files if n.startswith("hidden_")}
            return cls(hidden, z["teacher_ids"], z["teacher_probs"], z["segment"])


def hf_attention(config) -> str:
    """Transformers' attention for running the model itself: SDPA, or eager where logits are soft-capped
    (Gemma 2), which SDPA cannot do."""
    return "eager" if getattr(config, "attn_logit_softcapping", None) else "sdpa"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEPLOY_CACHE", Path.home() / ".cache" / "specdeploy"))


def fingerprint(source: Path, conversations, config: DataConfig) -> str:
    source = Path(source).resolve()
    stat = [str(source)]
    for f in sorted(source.iterdir()) if source.is_dir() else [source]:
        stat += [f.name, str(f.stat().st_size), str(int(f.stat().st_mtime))]
    blob = json.dumps([stat, conversations, asdict(config)], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _progress(iterable, desc: str, total: int | None = None):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False)


def render(tokenizer, conversation: list[dict]) -> str:
    """A conversation as the model sees it: its chat template, or the plain text without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in conversation)


@torch.no_grad()
def generate(model, tokenizer, conversations, config: DataConfig) -> list[torch.Tensor]:
    """The model's own continuations (greedy and sampled), as full token sequences."""
    torch.manual_seed(config.seed)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    sequences = []
    batches = range(0, len(conversations), config.batch_size)
    for start in _progress(batches, "generating calibration data"):
        chunk = conversations[start : start + config.batch_size]
        texts = [render(tokenizer, c) for c in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        sampled = (start // config.batch_size) % 2 == 1
        out = model.generate(
            **enc, max_new_tokens=config.max_new_tokens, do_sample=sampled,
            temperature=config.temperature if sampled else None, top_p=None, top_k=None,
            pad_token_id=tokenizer.pad_token_id,
        )
        for row, mask in zip(out, enc["attention_mask"]):
            real = row[int((mask == 0).sum()) :]
            sequences.append((real, int(mask.sum())))
    return sequences


@torch.no_grad()
def activations(model, sequences, config: DataConfig) -> Activations:
    """h_k at every exit candidate and the teacher's top-k for positions from the last prompt token."""
    hidden = {k: [] for k in config.exits}
    ids, probs, segment = [], [], []
    for index, (tokens, prompt_len) in enumerate(_progress(sequences, "teacher activations")):
        out = model(tokens[None], output_hidden_states=True)
        first = prompt_len - 1
        for k in config.exits:
            hidden[k].append(out.hidden_states[k][0, first:-1].float().numpy())
        p = torch.softmax(out.logits[0, first:-1].float(), dim=-1)
        top = p.topk(config.top_k, dim=-1)
        ids.append(top.indices.int().numpy())
        probs.append((top.values / top.values.sum(-1, keepdim=True)).numpy())
        segment.append(np.full(top.indices.shape[0], index, np.int32))
    return Activations(
        {k: np.concatenate(v) for k, v in hidden.items()},
        np.concatenate(ids), np.concatenate(probs), np.concatenate(segment),
    )


def collect(model, tokenizer, source: Path, conversations, config: DataConfig, name: str) -> Activations:
    """Cached: generate the model's own data for `conversations` and extract activations."""
    path = cache_dir() / "calibration" / f"{name}-{fingerprint(source, conversations, config)}.npz"
    if path.is_file():
        return Activations.load(path)
    model.config._attn_implementation = hf_attention(model.config)
    acts = activations(model, generate(model, tokenizer, conversations, config), config)
    path.parent.mkdir(parents=True, exist_ok=True)
    acts.save(path)
    return acts
