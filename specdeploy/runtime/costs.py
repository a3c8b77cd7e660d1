"""Costs of draft and verify passes, timed on the real graphs of a bundle (no torch needed).

One bundle exported at exit k0 gives the per-layer cost of a one-row step and of a pass over
S rows, and the head costs; costs at any other exit follow from the layer counts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .split_model import SplitModel


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
    layer_step_s: float              # one layer, one row
    layer_rows_s: dict[int, float]   # rows -> one layer over that many rows
    head_s: dict[int, float]         # rows -> full head
    draft_head_s: float              # draft head, one row

    @property
    def full_step_s(self) -> float:
        return self.num_layers * self.layer_step_s + self.head_s[1]

    def draft_step_s(self, exit_layer: int) -> float:
        return exit_layer * self.layer_step_s + self.draft_head_s

    def verify_s(self, exit_layer: int, rows: int) -> float:
        rows = min(rows, max(self.layer_rows_s))
        return (self.num_layers - exit_layer) * self.layer_rows_s[rows] + self.head_s[rows]

    def to_dict(self) -> dict:
        return {"full_step_ms": round(1000 * self.full_step_s, 3),
                "layer_step_ms": round(1000 * self.layer_step_s, 4),
                "layer_rows_ms": {str(k): round(1000 * v, 4) for k, v in self.layer_rows_s.items()},
                "head_ms": {str(k): round(1000 * v, 4) for k, v in self.head_s.items()},
                "draft_head_ms": round(1000 * self.draft_head_s, 4)}


def measure(model: SplitModel, max_rows: int, repeats: int = 15) -> CostModel:
    m = model.manifest
    k, layers = m.exit_layer, m.model.num_layers
    base = 32  # time at a realistic valid length
    prompt = list(range(3, 3 + base))
    model.verify_pass(model.draft_pass(prompt, 0).copy(), 0)
    one = model.draft_pass([5], base).copy()                      # [1, H]
    draft = _median_time(lambda: model.draft_pass([5], base), repeats)
    verify, head = {}, {}
    for rows in range(1, max_rows + 1):
        hidden = np.repeat(one, rows, axis=0)                   # [rows, H]
        verify[rows] = _median_time(lambda h=hidden: model.verify_pass(h, base), repeats) / (layers - k)
        head[rows] = _median_time(lambda h=hidden: model.logits(h), repeats)
    draft_head = _median_time(lambda: model.draft_logits(one), repeats)
    return CostModel(layers, draft / k, verify, head, draft_head)
