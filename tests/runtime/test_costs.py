"""Pass costs timed in turn: ratios between row counts hold while the machine's speed drifts."""
from types import SimpleNamespace

import numpy as np
import pytest

from specdeploy.runtime import costs


class DriftingModel:
    """A split model whose passes take `rows` seconds (the head half that) at a speed that slows by
    `drift` every pass, on a clock only it advances."""

    def __init__(self, drift: float):
        self.manifest = SimpleNamespace(exit_layer=2, model=SimpleNamespace(num_layers=6))
        self.drift, self.passes, self.now = drift, 0, 0.0

    def _spend(self, seconds: float) -> None:
        self.now += seconds * (1.0 + self.drift * self.passes)
        self.passes += 1

    def draft_pass(self, tokens, start):
        self._spend(0.5 * len(tokens))
        return np.zeros((len(tokens), 4), np.float32)  # [S, H]

    def verify_pass(self, hidden, start):
        self._spend(float(len(hidden)))
        return hidden

    def logits(self, hidden):
        self._spend(0.5 * len(hidden))
        return np.zeros((len(hidden), 8), np.float32)  # [S, V]

    draft_logits = logits


@pytest.fixture
def drifting(monkeypatch):
    model = DriftingModel(drift=0.002)
    monkeypatch.setattr(costs.time, "perf_counter", lambda: model.now)
    return model


def _blocked_ratio(model, rows: int, repeats: int) -> float:
    """What timing one row count's passes after the other's measured (the form replaced)."""
    def median(fn):
        times = []
        for _ in range(repeats):
            began = model.now
            fn()
            times.append(model.now - began)
        return float(np.median(times))
    one = median(lambda: model.verify_pass(np.zeros((1, 4)), 0))
    return median(lambda: model.verify_pass(np.zeros((rows, 4)), 0)) / one


def test_row_ratios_hold_while_the_machine_slows(drifting):
    measured = costs.measure(drifting, max_rows=5, repeats=15)
    for rows in range(2, 6):
        assert measured.layer_rows_s[rows] / measured.layer_rows_s[1] == pytest.approx(rows, rel=0.01)
        assert measured.head_s[rows] / measured.head_s[1] == pytest.approx(rows, rel=0.01)
    # the same drift, timed one row count after the other, prices five rows 2% dear and more
    assert _blocked_ratio(DriftingModel(drift=0.002), 5, 15) > 5 * 1.02


def test_every_call_is_timed_in_turn_each_repeat(drifting):
    order = []
    times = costs.interleaved_times({name: (lambda n=name: order.append(n)) for name in "abc"}, repeats=3)
    assert order == list("abc") + list("abc") + list("cba") + list("abc")  # warm-up, then in turn
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3, "c": 3}
