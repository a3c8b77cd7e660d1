"""The exit adapter: a residual linear map trained to make the early exit predict like the model.

Zero-initialised, so an untrained adapter is the plain exit. It is trained by distillation: soft
cross-entropy between the exit's distribution (through the model's own final norm and LM head,
restricted to the draft vocabulary) and the full model's top-k next-token distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .data import Activations


class ExitAdapter(torch.nn.Module):
    """h -> h + W h + b; ~H^2 parameters (0.25% of SmolLM2-135M)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, hidden_size)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden):
        return hidden + self.proj(hidden)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch_size: int = 256
    learning_rate: float = 2e-3
    seed: int = 0


def _targets(acts: Activations, vocab_ids: np.ndarray) -> torch.Tensor:
    """Teacher distribution over the draft vocabulary [N, V'] (mass outside it dropped)."""
    position = np.full(int(vocab_ids.max()) + 1 if len(vocab_ids) else 1, -1, np.int64)
    position[vocab_ids] = np.arange(len(vocab_ids))
    ids = np.where(acts.teacher_ids < len(position), acts.teacher_ids, 0)
    cols = position[ids]                                   # [N, top_k], -1 outside the subset
    rows = np.repeat(np.arange(len(cols))[:, None], cols.shape[1], axis=1)
    keep = cols >= 0
    dense = np.zeros((len(cols), len(vocab_ids)), np.float32)
    np.add.at(dense, (rows[keep], cols[keep]), acts.teacher_probs[keep])
    dense /= np.maximum(dense.sum(1, keepdims=True), 1e-9)
    return torch.from_numpy(dense)


def train(model, acts: Activations, exit_layer: int, vocab_ids: np.ndarray,
          config: TrainConfig = TrainConfig()) -> ExitAdapter:
    torch.manual_seed(config.seed)
    hidden = torch.from_numpy(acts.hidden[exit_layer])            # [N, H]
    targets = _targets(acts, vocab_ids)                            # [N, V']
    weight = model.lm_head.weight.detach()[torch.from_numpy(vocab_ids)]  # [V', H]
    norm = model.model.norm
    adapter = ExitAdapter(hidden.shape[1])
    opt = torch.optim.AdamW(adapter.parameters(), lr=config.learning_rate, weight_decay=0.0)
    for p in norm.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(config.seed)
    for _ in range(config.steps):
        batch = torch.randint(0, len(hidden), (min(config.batch_size, len(hidden)),), generator=gen)
        logits = norm(adapter(hidden[batch])) @ weight.t()        # [B, V']
        loss = -(targets[batch] * torch.log_softmax(logits, -1)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return adapter.eval()


@torch.no_grad()
def draft_predictions(model, acts: Activations, exit_layer: int, vocab_ids: np.ndarray,
                      adapter: ExitAdapter | None) -> tuple[np.ndarray, np.ndarray]:
    """(draft greedy token [N] in full-vocabulary ids, draft top probability [N])."""
    hidden = torch.from_numpy(acts.hidden[exit_layer])
    if adapter is not None:
        hidden = adapter(hidden)
    weight = model.lm_head.weight[torch.from_numpy(vocab_ids)]
    probs = torch.softmax(model.model.norm(hidden) @ weight.t(), -1)  # [N, V']
    top = probs.max(-1)
    return vocab_ids[top.indices.numpy()], top.values.numpy()
