"""Exactness of the decoding loop on a tiny random model: speculative == plain."""
import numpy as np
import pytest

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


def test_early_exit_rounds_draft_and_roll_back(tiny_engine):
    _, stats = ids(tiny_engine, [7, 8, 9], max_new_tokens=60, num_draft_tokens=4)
    assert stats.drafted > 0 and stats.accepted < stats.drafted  # some rejections happened
    assert stats.rounds < 60 or stats.accepted == 0


def test_plain_mode_runs_one_token_per_round(tiny_engine):
    out, stats = ids(tiny_engine, [3, 4], max_new_tokens=10, speculative=False)
    assert len(out) == 10 and stats.drafted == 0 and stats.tokens_per_round == 1.0


def test_eos_stops_generation(tiny_engine):
    out = tiny_engine.generate_ids([3, 4], GenerationConfig(max_new_tokens=100, speculative=False))
    assert 1 not in out


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
    """Second-token distribution over many seeds: spec and plain must agree (chi-square)."""
    prompt = [10, 11, 12]

    def histogram(**kw):
        counts = {}
        for seed in range(600):
            out, _ = ids(tiny_engine, prompt, max_new_tokens=3, temperature=1.0, seed=seed, **kw)
            counts[tuple(out[:2])] = counts.get(tuple(out[:2]), 0) + 1
        return counts

    plain = histogram(speculative=False)
    spec = histogram(num_draft_tokens=2)
    keys = sorted(set(plain) | set(spec), key=lambda k: -(plain.get(k, 0) + spec.get(k, 0)))
    top = keys[:10]
    a = np.array([plain.get(k, 0) for k in top] + [sum(v for k, v in plain.items() if k not in top)])
    b = np.array([spec.get(k, 0) for k in top] + [sum(v for k, v in spec.items() if k not in top)])
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    # two-sample chi-square homogeneity test
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = (((a - ea) ** 2) / ea + ((b - eb) ** 2) / eb).sum()
    assert stat < 31.26  # 0.999 quantile for 10 degrees of freedom (at most 11 cells)
