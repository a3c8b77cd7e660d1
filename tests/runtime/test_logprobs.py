"""Log-probabilities: the full model's log-softmax, the same with and without speculation, and a
prompt's own (teacher-forced) log-probabilities the ones a generation reports."""
import numpy as np
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.runtime.logprobs import log_softmax, token_logprobs

pytestmark = pytest.mark.unit
PROMPT = [int(t) for t in np.random.default_rng(8).integers(2, 96, 9)]


def logprobs_of(engine, **options):
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=3, **options)
    return [lp for step in engine.decoder.generate(PROMPT, config) for lp in step.logprobs]


def test_top_alternatives_are_the_most_likely_in_order():
    logits = np.array([[0.1, 2.0, -1.0, 1.5]], np.float32)
    (entry,) = token_logprobs(logits, [3], top=2)
    expected = log_softmax(logits)[0]
    assert entry.logprob == pytest.approx(expected[3])
    assert [t for t, _ in entry.top] == [1, 3]
    assert np.exp(expected).sum() == pytest.approx(1.0)


def assert_same(a, b):
    assert [e.token for e in a] == [e.token for e in b]
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-5)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]


@pytest.mark.parametrize("options", [dict(draft_source="hybrid"), dict(draft_source="early_exit", num_draft_tokens=3)])
def test_speculation_reports_plain_decodings_logprobs(tiny_engine, options):
    plain = logprobs_of(tiny_engine, speculative=False)
    assert_same(logprobs_of(tiny_engine, **options), plain)
    assert all(e.token == e.top[0][0] for e in plain)  # greedy: each chosen token is the most likely


@pytest.mark.parametrize("options", [dict(speculative=False), dict(draft_source="early_exit", num_draft_tokens=3)])
def test_prompt_logprobs_are_what_generation_reported(tiny_engine, options):
    """Scoring the prompt and the generated tokens as one prompt gives the values generation reported
    (sampled: speculation or not, each token's value is the model's, not the sampler's)."""
    generated = logprobs_of(tiny_engine, temperature=1.0, seed=2, **options)
    scored = tiny_engine.prompt_logprobs(PROMPT + [e.token for e in generated], top=3)
    assert scored[0] is None and len(scored) == len(PROMPT) + len(generated)
    assert_same(scored[len(PROMPT):], generated)


def test_streamed_pieces_carry_one_entry_per_token(tiny_engine):
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, logprobs=0, speculative=False)
    pieces = list(tiny_engine.stream_ids(PROMPT, config))
    entries = [e for p in pieces for e in p.logprobs]
    assert len(entries) == 10 and all(e.top == () for e in entries)
