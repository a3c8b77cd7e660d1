"""Training the feature head by distillation from the target, with EAGLE-3's training-time test.

At step 0 each position t reads the target's features at t and the embedding of token t + 1 and
learns the target's distribution for token t + 2. At step j it reads, in place of the target's
features, its own step j - 1 output for the same t — what drafting feeds it — with the embedding of
token t + j + 1, and learns the target's distribution j positions further on. A step-j query sees
what the head's KV cache holds while drafting: the step-0 entries of positions <= t (computed from
the target's features), then its own chain's entries for this t, one per step (the "diagonal").
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .data import Features
from .model import FeatureHead, rotary


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000
    sequence: int = 256             # positions per window
    batch: int = 8                  # windows per step
    ttt_steps: int = 3              # drafting steps trained (EAGLE-3's training-time test)
    step_weight: float = 0.8        # loss weight of step j: step_weight ** j
    learning_rate: float = 1e-3
    warmup: int = 100
    seed: int = 0
    checkpoint_every: int = 200


def draft_positions(vocab_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """[V] the draft row of each target id, -1 outside the draft vocabulary."""
    where = np.full(vocab_size, -1, np.int64)
    where[vocab_ids] = np.arange(len(vocab_ids))
    return where


def window(data: Features, starts: np.ndarray, length: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    index = starts[:, None] + np.arange(length)                              # [B, S]
    arrays = {"tokens": data.tokens[index].astype(np.int64),
              "features": data.features[index].astype(np.float32).reshape(*index.shape, -1),  # [B, S, 3T]
              "teacher_ids": data.teacher_ids[index].astype(np.int64),                        # [B, S, k]
              "teacher_probs": data.teacher_probs[index].astype(np.float32),
              "segment": data.segment[index]}
    return {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}


def soft_loss(logits, teacher_ids, teacher_probs, where: torch.Tensor, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy against the teacher's top-k over the draft vocabulary, and greedy agreement.
    logits [B, S, V'], teacher_* [B, S, k], valid [B, S]."""
    rows = where[teacher_ids]                                                 # [B, S, k], -1 outside
    probs = teacher_probs * (rows >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-6)
    logp = logits.log_softmax(-1).gather(-1, rows.clamp_min(0))               # [B, S, k]
    loss = -(probs * logp).sum(-1)[valid].mean()
    agree = (logits.argmax(-1) == rows[..., 0])[valid].float().mean()
    return loss, agree


def unrolled(head: FeatureHead, embed: torch.nn.Module, batch: dict, steps: int):
    """Yields (step, logits [B, S, V'], valid [B, S], teacher slice) for steps 0..steps-1."""
    layer, attn = head.midlayer, head.midlayer.self_attn
    tokens, seg = batch["tokens"], batch["segment"]
    b, s = tokens.shape
    hidden = head.fc(batch["features"])                                      # [B, S, H]
    positions = torch.arange(s, device=tokens.device)[None].expand(b, s)
    same = seg[:, :, None] == seg[:, None, :]                                 # [B, S, S]
    mask0 = (same & torch.ones(s, s, dtype=torch.bool, device=tokens.device).tril())[:, None]  # [B, 1, S, S]
    chain_k, chain_v, k0 = [], [], None
    for j in range(steps):
        span = s - j - 1                                                      # positions t with token t+j+1
        embeds = embed(tokens[:, j + 1:])                                     # [B, span, H]
        cos, sin = rotary(positions[:, :span] + j, head.config.head_dim, head.config.rope_theta)
        x, residual = layer.inputs(hidden[:, :span], embeds)
        q, k, v = attn.project(x, cos, sin)
        if j == 0:
            k0, v0 = k, v
            attended = attn.attend(q, k0, v0, mask0[:, :, :span, :span])
        else:
            attended = _with_chain(attn, q, k0[:, :, :span], v0[:, :, :span], mask0[:, :, :span, :span],
                                   [c[:, :, :span] for c in chain_k] + [k], [c[:, :, :span] for c in chain_v] + [v])
        if j > 0:
            chain_k.append(k)
            chain_v.append(v)
        out = layer.finish(attended, residual)                               # [B, span, H]
        valid = seg[:, j + 1:] == seg[:, :span]
        yield j, head.logits(out), valid, slice(j + 1, s)
        hidden = out


def _with_chain(attn, q, k0, v0, mask0, keys: list, values: list):
    """Attention over the step-0 entries (masked) and one chain entry per earlier step at the same
    position (q, k, v [B, heads or kv_heads, S, D])."""
    groups = attn.heads // attn.kv_heads
    k0, v0 = k0.repeat_interleave(groups, 1), v0.repeat_interleave(groups, 1)
    keys = [k.repeat_interleave(groups, 1) for k in keys]
    values = [v.repeat_interleave(groups, 1) for v in values]
    scale = attn.head_dim ** -0.5
    scores0 = (q @ k0.transpose(-1, -2) * scale).masked_fill(~mask0, torch.finfo(q.dtype).min)  # [B, h, S, S]
    diagonal = torch.stack([(q * k).sum(-1) * scale for k in keys], -1)                        # [B, h, S, j]
    weights = torch.cat([scores0, diagonal], -1).softmax(-1)
    s = scores0.shape[-1]
    out = weights[..., :s] @ v0 + sum(weights[..., s + i, None] * v for i, v in enumerate(values))
    return attn.o_proj(out.transpose(1, 2).flatten(2))


def _lr(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return config.learning_rate * (step + 1) / config.warmup
    done = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.learning_rate * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def train(head: FeatureHead, embed: torch.nn.Module, data: Features, config: TrainConfig,
          checkpoint: Path | None = None, report=None) -> FeatureHead:
    """Trains `head` in place; resumes from `checkpoint` where one is saved, and saves to it."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    device = head.fc.weight.device
    vocab = head.d2t.cpu().numpy() + np.arange(len(head.d2t))
    where = torch.from_numpy(draft_positions(vocab, head.config.vocab_size)).to(device)
    trainable = list(head.parameters())
    opt = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0, betas=(0.9, 0.95))
    step = 0
    if checkpoint is not None and checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False, map_location=device)
        if saved["config"] == asdict(config):
            head.load_state_dict(saved["head"])
            opt.load_state_dict(saved["optimizer"])
            step, rng = saved["step"], saved["rng"]
    embed.requires_grad_(False)
    head.train()
    start_time, start_step = time.perf_counter(), step
    while step < config.steps:
        for group in opt.param_groups:
            group["lr"] = _lr(step, config)
        starts = rng.integers(0, len(data) - config.sequence, config.batch)
        batch = window(data, starts, config.sequence, device)
        total, agreement = 0.0, []
        for j, logits, valid, later in unrolled(head, embed, batch, config.ttt_steps):
            loss, agree = soft_loss(logits, batch["teacher_ids"][:, later], batch["teacher_probs"][:, later],
                                    where, valid)
            total = total + config.step_weight ** j * loss
            agreement.append(float(agree))
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        step += 1
        if report is not None:
            rate = (step - start_step) / (time.perf_counter() - start_time)
            report(step, float(total.detach()), agreement, (config.steps - step) / max(rate, 1e-9))
        if checkpoint is not None and (step % config.checkpoint_every == 0 or step == config.steps):
            torch.save({"config": asdict(config), "head": head.state_dict(), "optimizer": opt.state_dict(),
                        "step": step, "rng": rng}, checkpoint)
    return head.eval()
