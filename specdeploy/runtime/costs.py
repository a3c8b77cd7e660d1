"""Costs of draft and verify passes, timed on the real graphs of a bundle (no torch needed).

One bundle exported at exit k0 gives the per-layer cost of a one-row step and of a pass over
S rows, and the head costs; costs at any other exit follow from the layer counts.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from .split_model import SplitModel


@contextlib.contextmanager
def passes_alone(model: SplitModel):
    """Passes timed without a feature head catching up after each verify pass (its hook detached)."""
    hook, model.after_verify = getattr(model, "after_verify", None), None
    try:
        yield
    finally:
        model.after_verify = hook


def interleaved_times(calls: dict, repeats: int) -> dict:
    """Seconds of every call in `calls` per repeat: {key: [repeats]}, the calls taken in turn.

    A VM's speed drifts by a fifth within a minute (lab/notes/benchmarks-history.md): timed one after the other,
    fifteen passes over one row and then fifteen over two set the second row against another
    moment of the machine, and twelve such measurements of one bundle priced it at 1.11 to 1.51
    steps. Taken in turn (the order reversed every other repeat), each repeat times every call at
    about the same moment, so ratios within a repeat hold while the machine moves (1.17 to 1.30).
    """
    for fn in calls.values():
        fn()  # warm-up
    keys, times = list(calls), {key: [] for key in calls}
    for repeat in range(repeats):
        for key in (keys if repeat % 2 == 0 else keys[::-1]):
            began = time.perf_counter()
            calls[key]()
            times[key].append(time.perf_counter() - began)
    return times


def _paired(times: list[float], baseline: list[float]) -> float:
    """Median seconds of `baseline` times the ratio of `times` to it, within repeats: the geometric
    mean over each two repeats (taken in opposite orders, so a steady drift cancels), then the
    median over those pairs (so one slow moment does not)."""
    ratios = np.asarray(times) / np.asarray(baseline)                      # [repeats]
    pairs = ratios[: len(ratios) // 2 * 2].reshape(-1, 2)                    # [repeats // 2, 2]
    paired = np.sqrt(pairs.prod(axis=1)) if len(pairs) else ratios
    return float(np.median(baseline) * np.median(paired))


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
    """The cost model of `model` on this machine: passes at a valid length of 32, every row count
    and head timed in turn (`interleaved_times`), rows priced against the same repeat's one row."""
    m = model.manifest
    k, layers = m.exit_layer, m.model.num_layers
    base = 32  # time at a realistic valid length
    prompt = list(range(3, 3 + base))
    model.verify_pass(model.draft_pass(prompt, 0).copy(), 0)
    one = model.draft_pass([5], base).copy()                      # [1, H]
    calls = {"draft": lambda: model.draft_pass([5], base), "draft_head": lambda: model.draft_logits(one)}
    for rows in range(1, max_rows + 1):
        hidden = np.repeat(one, rows, axis=0)                   # [rows, H]
        calls["verify", rows] = lambda h=hidden: model.verify_pass(h, base)
        calls["head", rows] = lambda h=hidden: model.logits(h)
    with passes_alone(model):
        t = interleaved_times(calls, repeats)
    verify = {rows: _paired(t["verify", rows], t["verify", 1]) / (layers - k) for rows in range(1, max_rows + 1)}
    head = {rows: _paired(t["head", rows], t["head", 1]) for rows in range(1, max_rows + 1)}
    return CostModel(layers, float(np.median(t["draft"])) / k, verify, head, float(np.median(t["draft_head"])))


def feature_head_costs(model: SplitModel, repeats: int = 15) -> dict[str, float]:
    """Milliseconds of a feature head's calls beside a plain one-row step (draft and verify passes,
    LM head), timed in turn: a round adds one projection of the verify pass's features and one head
    call per draft token (plus one to catch up)."""
    m = model.manifest
    base = 32
    model.verify_pass(model.draft_pass(list(range(3, 3 + base)), 0).copy(), 0)
    hidden = np.zeros((1, m.model.hidden_size), np.float32)                  # [1, H]
    features = np.zeros((1, len(m.feature_layers), m.model.hidden_size), np.float32)  # [1, 3, H]
    calls = {"step": lambda: model.logits(model.verify_pass(model.draft_pass([5], base), base)),
             "head_call": lambda: model.feature_head_pass(hidden, [5], base),
             "projection": lambda: model.project_features(features)}
    with passes_alone(model):
        t = interleaved_times(calls, repeats)
    return {name: round(1000 * float(np.median(v)), 3) for name, v in t.items()}
