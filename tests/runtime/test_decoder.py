"""Exactness of the decoding loop on a tiny random model: speculative == plain."""
import numpy as np
import pytest

from distribution import CHI2_999_10DOF, histogram, homogeneity_chi2
from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError, ContextLengthError
from specdeploy.runtime.stats import GenerationStats


def ids(engine, prompt, **kw):
    stats = GenerationStats()
    out = engine.generate_ids(prompt, GenerationConfig(ignore_eos=True, **kw), stats)
    return out, stats


@pytest.mark.parametrize("source", ["early_exit", "lookup", "hybrid"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculative_equals_plain(tiny_engine, source, gamma):
    rng = np.random.default_rng(gamma)
    for _ in range(4):
        prompt = [int(t) for t in rng.integers(2, 96, rng.integers(1, 20))]
        plain, _ = ids(tiny_engine, prompt, max_new_tokens=40, speculative=False)
        spec, stats = ids(tiny_engine, prompt, max_new_tokens=40, num_draft_tokens=gamma, draft_source=source)
        assert spec == plain
        assert stats.generated_tokens == 40


@pytest.mark.parametrize("ngram", [(1, 1), (1, 6), (3, 8)])
def test_lookup_ngram_range_is_exact_and_changes_what_is_drafted(tiny_engine, ngram, monkeypatch):
    # what the range finds, copied in full: the measured copy length may decline copies on a random model
    monkeypatch.setattr(tiny_engine.decoder.drafters["lookup"].length, "choose", lambda match, offered: offered)
    prompt = [int(t) for t in np.random.default_rng(7).integers(2, 96, 24)]
    plain, _ = ids(tiny_engine, prompt, max_new_tokens=40, speculative=False)
    spec, stats = ids(tiny_engine, prompt, max_new_tokens=40, draft_source="lookup", lookup_ngram=ngram)
    assert spec == plain
    if ngram[0] == 1:  # single tokens of a 96-word vocabulary recur in 64 tokens: drafts happen
        assert stats.drafted > 0
    _, strict = ids(tiny_engine, prompt, max_new_tokens=40, draft_source="lookup", lookup_ngram=(2, 4))
    _, loose = ids(tiny_engine, prompt, max_new_tokens=40, draft_source="lookup")  # default (1, 4)
    assert loose.by_source["lookup"][0] > strict.by_source.get("lookup", (0, 0))[0]  # rounds it drafted


def test_seeded_sampling_repeats_whatever_ran_before(tiny_engine):
    config = GenerationConfig(max_new_tokens=30, temperature=0.9, seed=5, ignore_eos=True, draft_source="hybrid")
    first = tiny_engine.generate_ids([4, 5, 6], config)
    for seed in range(3):  # other traffic moves the hybrid's speed estimates
        tiny_engine.generate_ids([7, 8], GenerationConfig(max_new_tokens=30, draft_source="hybrid", seed=seed))
    assert tiny_engine.generate_ids([4, 5, 6], config) == first


def test_early_exit_rounds_draft_and_roll_back(tiny_engine):
    _, stats = ids(tiny_engine, [7, 8, 9], max_new_tokens=60, num_draft_tokens=4, draft_source="early_exit")
    assert stats.drafted > 0 and stats.accepted < stats.drafted  # some rejections happened


def test_plain_mode_runs_one_token_per_round(tiny_engine):
    out, stats = ids(tiny_engine, [3, 4], max_new_tokens=10, speculative=False)
    assert len(out) == 10 and stats.drafted == 0 and stats.tokens_per_round == 1.0


def _prompt_that_reaches_eos(engine) -> tuple[list[int], list[int]]:
    """A prompt whose plain output (EOS ignored) contains EOS (id 1), and that output."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        prompt = [int(t) for t in rng.integers(2, 96, 4)]
        full, _ = ids(engine, prompt, max_new_tokens=60, speculative=False)
        if 1 in full and full.index(1) > 0:
            return prompt, full
    raise AssertionError("no prompt of 200 reaches EOS on the tiny model; pick another seed")


@pytest.mark.parametrize("speculative", [False, True])
def test_eos_stops_generation_just_before_it(tiny_engine, speculative):
    prompt, full = _prompt_that_reaches_eos(tiny_engine)
    stats = GenerationStats()
    out = tiny_engine.generate_ids(prompt, GenerationConfig(max_new_tokens=60, speculative=speculative), stats)
    assert out == full[: full.index(1)]  # everything up to EOS, EOS itself not emitted
    result = tiny_engine.generate(tiny_engine.tokenizer.decode(prompt), max_new_tokens=60, speculative=speculative)
    assert result.finish_reason == "stop"


def test_context_overflow_is_refused(tiny_engine):
    with pytest.raises(ContextLengthError, match="max context 128"):
        tiny_engine.generate_ids([3] * 100, GenerationConfig(max_new_tokens=40))
    with pytest.raises(ConfigError, match="empty"):
        tiny_engine.generate_ids([], GenerationConfig(max_new_tokens=4))


def test_generation_fills_the_context_exactly(tiny_engine):
    plain, _ = ids(tiny_engine, [3, 4, 5], max_new_tokens=125, speculative=False)
    spec, _ = ids(tiny_engine, [3, 4, 5], max_new_tokens=125, num_draft_tokens=6)
    assert spec == plain and len(spec) == 125


def test_sampled_speculative_matches_plain_distribution(tiny_engine):
    """First two sampled tokens over many seeds: speculative and plain agree (chi-square)."""
    plain = histogram(tiny_engine, [10, 11, 12], 600, temperature=1.0, speculative=False)
    spec = histogram(tiny_engine, [10, 11, 12], 600, temperature=1.0, num_draft_tokens=2, draft_source="early_exit")
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


def test_only_greedy_rounds_feed_the_drafters_timing(tiny_engine):
    """Timed choices are made at greedy only; sampled rounds (which also warp) must not skew them."""
    hybrid = tiny_engine.decoder.drafters["hybrid"]
    timed = lambda: hybrid.plain.rounds + hybrid.probe.rate.rounds + hybrid.full.rate.rounds  # noqa: E731
    before = (timed(), hybrid.lookup.length.costs.weight.copy())
    tiny_engine.generate_ids([4, 5, 6, 4, 5], GenerationConfig(max_new_tokens=12, temperature=0.9, seed=1,
                                                               ignore_eos=True, draft_source="hybrid"))
    assert timed() == before[0]
    assert (hybrid.lookup.length.costs.weight == before[1]).all()
    tiny_engine.generate_ids([9, 10, 11], GenerationConfig(max_new_tokens=12, temperature=0.0,
                                                           ignore_eos=True, draft_source="hybrid"))
    assert timed() > before[0]  # the control: greedy rounds are timed
