"""The clairvoyant lookup bound: replay of greedy outputs and its pricing."""
import numpy as np

from specdeploy.bench.bound import best_copy, bound, clairvoyant_rounds
from specdeploy.runtime.costs import CostModel
from specdeploy.config import GenerationConfig
from specdeploy.runtime.stats import GenerationStats


def test_clairvoyant_copy_takes_a_repeated_passage_in_long_rounds():
    passage = list(range(10, 40))
    history = np.array(passage + passage[:3])
    assert best_copy(history, np.array(passage[3:]), (2, 4), 8) == 8
    assert best_copy(history, np.array([99] + passage[4:]), (2, 4), 8) == 0
    rounds = clairvoyant_rounds(passage, passage, (2, 4), 8)
    assert sum(rounds) + len(rounds) == len(passage) - 1  # every token after the prefill's
    assert max(rounds) == 8 and len(rounds) <= 6


def test_nothing_to_copy_bounds_lookup_at_plain_speed():
    rounds = clairvoyant_rounds([1, 2], list(range(3, 30)), (2, 4), 8)
    assert rounds == [0] * 26
    result = bound(rounds, _costs())
    assert result["tokens_per_round"] == 1.0 and result["speedup_bound"] == 1.0


def test_bound_prices_rows_with_the_measured_pass_costs():
    # one round of 4 accepted drafts: 5 tokens for one 5-row pass (2.0) vs five 1-row passes (5 x 1.0)
    assert bound([4], _costs())["speedup_bound"] == 2.5


def test_real_lookup_never_takes_fewer_rounds_than_the_bound(tiny_engine, monkeypatch):
    # copy all a match offers (the measured length choice could decline every copy on a tiny model)
    monkeypatch.setattr(tiny_engine.decoder.drafters["lookup"].length, "choose", lambda match, offered: offered)
    rng = np.random.default_rng(3)
    for ngram in ((1, 2), (2, 4)):
        prompt = [int(t) for t in rng.integers(2, 96, 30)]
        base = dict(max_new_tokens=48, ignore_eos=True, temperature=0.0)
        plain = tiny_engine.generate_ids(prompt, GenerationConfig(speculative=False, **base))
        stats = GenerationStats()
        tiny_engine.generate_ids(prompt, GenerationConfig(draft_source="lookup", num_draft_tokens=4,
                                                          lookup_ngram=ngram, **base), stats)
        best = clairvoyant_rounds(prompt, plain, ngram, 4)
        assert sum(best) + len(best) == len(plain) - 1
        assert stats.accepted + stats.rounds == len(plain) - 1  # replay and decoder count alike
        assert stats.rounds >= len(best)
        if ngram == (1, 2):
            assert stats.accepted > 0 and sum(best) > 0  # the comparison is not vacuous


def _costs():
    rows = {r: (1.0 + 0.25 * (r - 1)) / 2 for r in range(1, 10)}  # per layer: 2 layers make a pass
    return CostModel(num_layers=2, layer_step_s=0.5, layer_rows_s=rows, head_s={r: 0.0 for r in rows},
                     draft_head_s=0.0)
