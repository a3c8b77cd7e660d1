"""How often the head's greedy drafts would be accepted, replayed over the target's own text.

On text the target wrote greedily (its generations for held-out prompts), every position t is
where a round could start: the head reads the target's features at t and token t + 1 (the token
the target just produced) and drafts tokens t + 2, t + 3, ... from its own outputs. Draft j is
accepted when it equals the target's greedy token and every earlier draft was; on such a chain the
head's inputs are exactly the text's, so one teacher-forced unrolled pass replays every round at
once. Positions whose following text is not the target's greedy choice (a prompt's, or text the
target did not write) end the chain there: the replay counts only what greedy decoding would see.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .data import Features
from .model import FeatureHead
from .train import unrolled, window


@dataclass(frozen=True)
class Acceptance:
    per_position: tuple[float, ...]   # P(draft j accepted | drafts 1..j-1 accepted), j = 1..gamma
    rounds: int                       # positions a round was replayed from
    tau: float                        # tokens per round at this gamma: 1 + expected accepted drafts

    def line(self) -> str:
        rates = " ".join(f"{a:.2f}" for a in self.per_position)
        return f"acceptance per draft position {rates}; tau {self.tau:.2f} at gamma {len(self.per_position)} " \
               f"over {self.rounds} rounds"


@torch.no_grad()
def acceptance(head: FeatureHead, embed: torch.nn.Module, data: Features, gamma: int = 4,
               scored: np.ndarray | None = None) -> Acceptance:
    """Replays greedy drafting from every position of each conversation in `data`.
    scored [N] bool: positions a round may start from (default all)."""
    vocab = torch.from_numpy(head.d2t.numpy() + np.arange(len(head.d2t)))
    offered, taken = np.zeros(gamma), np.zeros(gamma)
    rounds = 0
    for segment in np.unique(data.segment):
        index = np.flatnonzero(data.segment == segment)
        if len(index) < gamma + 2:
            continue
        batch = window(data, index[:1], len(index))
        greedy = batch["teacher_ids"][0, :, 0]                                  # [S] the target's greedy
        on_path = batch["tokens"][0, 1:] == greedy[:-1]                         # [S-1] text t+1 is greedy
        chosen = torch.ones(len(index) - 1, dtype=torch.bool) if scored is None else \
            torch.from_numpy(scored[index][:-1])
        alive = on_path & chosen                  # rounds that can start at t: token t+1 is the target's
        rounds += int(alive.sum())
        for j, logits, _, later in unrolled(head, embed, batch, gamma):
            span = logits.shape[1]
            right = vocab[logits[0].argmax(-1)] == greedy[later]                # draft j+1 is the target's
            alive = alive[:span]
            offered[j] += int(alive.sum())
            taken[j] += int((alive & right).sum())
            # the next draft is replayed exactly where this one was taken and the text took it too
            alive = alive & right & torch.cat([on_path, torch.zeros(1, dtype=torch.bool)])[later]
    per_position = tuple(float(t / o) if o else 0.0 for t, o in zip(taken, offered))
    return Acceptance(per_position, rounds, 1.0 + float(np.cumprod(per_position).sum()))
