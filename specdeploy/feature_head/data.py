"""Training text for the feature head, and what the target computes over it.

Conversations come as JSONL, one per line, in any of the forms users keep them in:
`{"messages": [{"role": "user", "content": ...}, ...]}` (OpenAI's chat format),
`{"conversations": [{"from": "human", "value": ...}, ...]}` (ShareGPT's), or `{"text": ...}`.
The target is teacher-forced (by the exported bundle's graphs or the PyTorch model: teachers.py)
over each conversation rendered with its chat template; for every
position we keep the residual stream entering the three feature layers (fp16 where it fits) and the target's
top-k next-token distribution: everything the head is trained against, so training never runs
the target again. Cached on disk under a fingerprint of the model file, the text and the settings.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..jsonl import read_objects

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}
EXAMPLE = '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}'


def _messages(value, where: str) -> list[dict] | str:
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return value["text"]
    turns = value.get("messages") or value.get("conversations") if isinstance(value, dict) else None
    if not isinstance(turns, list) or not turns:
        raise ConfigError(f"{where}: expected a conversation like {EXAMPLE}")
    out = []
    for turn in turns:
        role = ROLES.get(str(turn.get("role", turn.get("from", ""))).lower()) if isinstance(turn, dict) else None
        content = turn.get("content", turn.get("value")) if isinstance(turn, dict) else None
        if role is None or not isinstance(content, str):
            raise ConfigError(f"{where}: a turn needs a role (user / assistant / system) and text content, "
                              f"like {EXAMPLE}")
        out.append({"role": role, "content": content})
    return out


def read_conversations(path: Path) -> list[list[dict] | str]:
    """Every conversation of a JSONL file (a list of turns, or plain text)."""
    return [_messages(value, f"{path}:{number}") for number, value in read_objects(path, EXAMPLE)]


def render(tokenizer, conversation: list[dict] | str) -> str:
    """The whole conversation as the target reads it (its chat template, where it has one)."""
    if isinstance(conversation, str):
        return conversation
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(conversation, tokenize=False)
    return "\n".join(m["content"] for m in conversation)


@dataclass(frozen=True)
class FeatureConfig:
    feature_layers: tuple[int, int, int]
    max_tokens: int = 512          # per conversation (longer ones are cut)
    top_k: int = 16                # of the target's next-token distribution
    max_total_tokens: int = 300_000


@dataclass
class Features:
    """Token-aligned arrays over conversations laid end to end; `segment` says which one."""
    tokens: np.ndarray          # [N] int32
    features: np.ndarray        # [N, 3, T] fp16 (fp32 where fp16 overflows): the residual stream entering each feature layer
    teacher_ids: np.ndarray     # [N, k] int32: the target's likeliest next tokens at each position
    teacher_probs: np.ndarray   # [N, k] fp16: their probabilities, renormalised over the k
    segment: np.ndarray         # [N] int32

    def __len__(self) -> int:
        return len(self.tokens)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **asdict(self))

    @classmethod
    def load(cls, path: Path) -> "Features":
        with np.load(path) as z:
            return cls(**{k: z[k] for k in z.files})


def fingerprint(model_path: Path, texts: list[str], config: FeatureConfig) -> str:
    stat = Path(model_path).resolve().stat()
    blob = json.dumps([str(Path(model_path).resolve()), stat.st_size, int(stat.st_mtime), texts, asdict(config)],
                      sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


FP16_MAX = 65504.0


def compact(features: np.ndarray) -> np.ndarray:
    """fp16 where the values fit it (half the memory and disk), else fp32: Gemma's residual stream
    carries channels in the tens of thousands, which fp16 would store as infinities (its head
    trained to NaN)."""
    return features.astype(np.float16) if np.abs(features).max() < FP16_MAX else features.astype(np.float32)


def teacher_force(teacher, tokenizer, texts: list[str | list[int]], config: FeatureConfig, progress=None) -> Features:
    """`teacher` (feature_head/teachers.py) over each text (or token ids): the features at its
    feature layers and the target's top-k distribution."""
    parts: dict[str, list] = {"tokens": [], "features": [], "teacher_ids": [], "teacher_probs": [], "segment": []}
    total = 0
    for index, text in enumerate(texts):
        ids = (text if isinstance(text, list) else
               tokenizer(text, add_special_tokens=False)["input_ids"])[: config.max_tokens]
        if len(ids) < 4:
            continue
        features, top_ids, top_probs = teacher(ids, config.top_k)          # [S, 3, T], [S, k], [S, k]
        parts["tokens"].append(np.asarray(ids[: len(top_ids)], np.int32))
        parts["features"].append(compact(features))
        parts["teacher_ids"].append(top_ids)
        parts["teacher_probs"].append(top_probs.astype(np.float16))
        parts["segment"].append(np.full(len(top_ids), index, np.int32))
        total += len(top_ids)
        if progress is not None:
            progress(len(top_ids))
        if total >= config.max_total_tokens:
            break
    if not parts["tokens"]:
        raise ConfigError("no conversation had 4 or more tokens; give the head conversations to learn from")
    return Features(**{k: np.concatenate(v) for k, v in parts.items()})
