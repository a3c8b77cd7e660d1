"""Costs of draft and verify passes, timed on the real graphs of a bundle.

One bundle exported at exit k0 gives the per-layer cost of a shallow step and of a deep pass over
S rows, and the head costs; costs at any other exit follow from the layer counts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..runtime.split_model import SplitModel


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return float(np.median(times))


@dataclass(frozen=True)
class CostModel:
    num_layers: int
    shallow_layer_s: float           # one layer, one row
    deep_layer_s: dict[int, float]   # rows -> one layer over that many rows
    head_s: dict[int, float]         # rows -> full head
    draft_head_s: float              # draft head, one row

    @property
    def full_step_s(self) -> float:
        return self.num_layers * self.shallow_layer_s + self.head_s[1]

    def draft_step_s(self, exit_layer: int) -> float:
        return exit_layer * self.shallow_layer_s + self.draft_head_s

    def verify_s(self, exit_layer: int, rows: int) -> float:
        rows = min(rows, max(self.deep_layer_s))
        return (self.num_layers - exit_layer) * self.deep_layer_s[rows] + self.head_s[rows]

    def to_dict(self) -> dict:
        return {"full_step_ms": round(1000 * self.full_step_s, 3),
                "shallow_layer_ms": round(1000 * self.shallow_layer_s, 4),
                "deep_layer_ms": {str(k): round(1000 * v, 4) for k, v in self.deep_layer_s.items()},
                "head_ms": {str(k): round(1000 * v, 4) for k, v in self.head_s.items()},
                "draft_head_ms": round(1000 * self.draft_head_s, 4)}


def measure(model: SplitModel, max_rows: int, repeats: int = 15) -> CostModel:
    m = model.manifest
    k, layers = m.exit_layer, m.model.num_layers
    base = 32  # time at a realistic valid length
    prompt = list(range(3, 3 + base))
    model.deep(model.shallow(prompt, 0).copy(), 0)
    one = model.shallow([5], base).copy()                      # [1, H]
    shallow = _median_time(lambda: model.shallow([5], base), repeats)
    deep, head = {}, {}
    for rows in range(1, max_rows + 1):
        hidden = np.repeat(one, rows, axis=0)                   # [rows, H]
        deep[rows] = _median_time(lambda h=hidden: model.deep(h, base), repeats) / (layers - k)
        head[rows] = _median_time(lambda h=hidden: model.logits(h), repeats)
    draft_head = _median_time(lambda: model.draft_logits(one), repeats)
    return CostModel(layers, shallow / k, deep, head, draft_head)
