"""Rejection sampling must reproduce the target distribution exactly (chi-square tests)."""
import numpy as np
import pytest

from specdeploy.runtime.acceptance import accept_greedy, accept_sampled
from specdeploy.config import SamplingParams
from specdeploy.runtime.sampling import sample, warp

CHI2_CRIT_999 = {7: 24.32, 15: 37.70}  # chi-square 0.999 quantiles by degrees of freedom


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "sampled a token with zero target probability"
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


def first_token_counts(p, q, draft_token_fn, trials, seed):
    rng = np.random.default_rng(seed)
    counts = np.zeros(p.shape[-1])
    for _ in range(trials):
        x = draft_token_fn(rng)
        m, token = accept_sampled([x], None if q is None else q[None], np.stack([p, p]), rng)
        counts[x if m == 1 else token] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_acceptance_matches_target_distribution(seed):
    rng = np.random.default_rng(100 + seed)
    p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8) * 0.3)
    counts = first_token_counts(p, q, lambda r: sample(q, r), 20000, seed)
    assert chi_square(counts, p) < CHI2_CRIT_999[7]


def test_one_hot_drafts_are_exact_at_any_temperature():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(16))
    counts = first_token_counts(p, None, lambda r: 3, 20000, 0)  # lookup always proposes token 3
    assert chi_square(counts, p) < CHI2_CRIT_999[15]


def test_draft_vocabulary_subset_is_exact():
    """A draft with zero mass outside a subset still yields the target (residual covers the rest)."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(8))
    q = np.zeros(8)
    q[:4] = rng.dirichlet(np.ones(4))
    counts = first_token_counts(p, q, lambda r: sample(q, r), 20000, 1)
    assert chi_square(counts, p) < CHI2_CRIT_999[7]


def test_chi_square_detects_a_wrong_sampler():
    """Control: accepting every draft (no rejection) is caught by the same test."""
    rng = np.random.default_rng(4)
    p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8) * 0.3)
    counts = np.bincount([sample(q, rng) for _ in range(20000)], minlength=8).astype(float)
    assert chi_square(counts, p) > CHI2_CRIT_999[7]


def test_greedy_acceptance_stops_at_first_mismatch():
    logits = np.zeros((4, 10))
    logits[0, 2] = logits[1, 5] = logits[2, 7] = logits[3, 1] = 1.0
    assert accept_greedy([2, 5, 7], logits) == (3, 1)
    assert accept_greedy([2, 6, 7], logits) == (1, 5)
    assert accept_greedy([], logits[:1]) == (0, 2)


def test_warp_top_k_and_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert np.allclose(warp(logits, SamplingParams(1.0, top_k=2)), [[0.625, 0.375, 0, 0]])
    assert np.allclose(warp(logits, SamplingParams(1.0, top_p=0.7)), [[0.625, 0.375, 0, 0]])
    assert np.allclose(warp(logits, SamplingParams(1.0, top_p=0.4)), [[1, 0, 0, 0]])
    assert np.allclose(warp(logits, SamplingParams(1.0)), [[0.5, 0.3, 0.15, 0.05]])


def test_sampling_params_are_validated():
    from specdeploy.errors import ConfigError

    for bad in (dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ConfigError):
            SamplingParams(**{"temperature": 1.0, **bad})
