"""A run's rounds priced at its timed pass costs, and the round sizes the statistics keep for it."""
import pytest

from specdeploy.bench.priced import priced_s, priced_speedups, round_s
from specdeploy.bench.runner import CategoryResult
from specdeploy.runtime.costs import CostModel
from specdeploy.runtime.stats import GenerationStats
from specdeploy.runtime.timing import ModeResult

# 4 layers at 1.0 a layer for one row, +0.5 a layer for each further row; head 1.0 (+0.5 a row); draft head 0.5
COSTS = CostModel(num_layers=4, layer_step_s=1.0, layer_rows_s={r: 1.0 + 0.5 * (r - 1) for r in range(1, 6)},
                  head_s={r: 1.0 + 0.5 * (r - 1) for r in range(1, 6)}, draft_head_s=0.5)


def test_each_kind_of_round_costs_its_passes():
    assert round_s(COSTS, 1, "plain", 0) == 5.0                     # 4 layers + head, one row
    assert round_s(COSTS, 1, "lookup", 2) == 4 * 2.0 + 2.0          # every layer and the head over 3 rows
    # exit at layer 1, 2 drafts: 3 one-row draft passes, 2 draft heads, then 3 layers + head over 3 rows
    assert round_s(COSTS, 1, "early_exit", 2) == 3 * 1.0 + 2 * 0.5 + 3 * 2.0 + 2.0


def _mode(*rounds: tuple[str, int, int]) -> ModeResult:
    stats = GenerationStats()
    for source, drafted, accepted in rounds:
        stats.record_round(source, drafted, accepted)
    return ModeResult(totals=stats)


def test_modes_are_priced_against_plain_rounds_per_category_and_overall():
    plain = _mode(*[("plain", 0, 0)] * 10)                                  # 10 tokens: 50.0
    copies = _mode(*[("plain", 0, 0)] * 4, ("lookup", 2, 2), ("lookup", 2, 2))  # 10 tokens: 20.0 + 2 x 10.0
    missed = _mode(*[("plain", 0, 0)] * 8, ("lookup", 1, 0), ("lookup", 1, 1))  # 10 tokens: 40.0 + 2 x 7.5
    sampled = CategoryResult(1.0, "s", {"plain": plain, "lookup": copies})
    result = priced_speedups([CategoryResult(0.0, "a", {"plain": plain, "lookup": copies}),
                              CategoryResult(0.0, "b", {"plain": plain, "lookup": missed}), sampled], COSTS, 1)
    assert result["a"] == {"lookup": 1.25} and result["b"] == {"lookup": pytest.approx(50 / 55, abs=1e-3)}
    assert result["overall"]["lookup"] == pytest.approx(100 / 95, abs=1e-3) and "s" not in result


def test_round_sizes_are_kept_per_source_and_merged():
    one, two = GenerationStats(), GenerationStats()
    one.record_round("lookup", 2, 1)
    one.record_round("plain", 0, 0)
    two.record_round("lookup", 2, 0)
    two.record_round("lookup", 3, 3)
    one.merge(two)
    assert one.round_sizes == {"lookup": {2: 2, 3: 1}, "plain": {0: 1}}
    assert one.to_dict()["round_sizes"]["lookup"] == {"2": 2, "3": 1}
    assert priced_s(one.round_sizes, COSTS, 1) == 2 * round_s(COSTS, 1, "lookup", 2) + round_s(
        COSTS, 1, "lookup", 3) + 5.0
