"""Penalties, min-p and grammars keep decoding exact: each verify row is processed from its own
prefix, so greedy speculative output is plain output and sampling keeps plain's distribution."""
import numpy as np
import pytest

from distribution import CHI2_999_10DOF, histogram, homogeneity_chi2
from specdeploy.config import GenerationConfig, Penalties, ResponseFormat, SamplingParams
from specdeploy.errors import ConfigError
from specdeploy.runtime.processors import RowProcessor
from specdeploy.runtime.sampling import warp

pytestmark = pytest.mark.unit
PENALIZED = dict(repetition_penalty=1.4, presence_penalty=0.6, frequency_penalty=0.4)


def test_penalties_follow_hugging_face_and_openai_row_by_row():
    logits = np.array([[2.0, -1.0, 0.5, 3.0, -2.0]] * 3, np.float32)    # [3, V]
    processor = RowProcessor(Penalties(2.0, 0.5, 0.25), prompt=[0], vocab_size=5)
    processor.commit([3, 3])
    out = processor.apply(logits, drafts=[1, 4])
    # row 0: 0 seen in the prompt (2 / 2); 3 seen twice in the output (3 / 2 - 0.5 - 2 * 0.25)
    assert np.allclose(out[0], [1.0, -1.0, 0.5, 3 / 2 - 1.0, -2.0])
    # row 1 also follows draft 1 (-1 * 2 - 0.5 - 0.25); row 2 also draft 4
    assert np.allclose(out[1], [1.0, -2.75, 0.5, 0.5, -2.0])
    assert np.allclose(out[2], [1.0, -2.75, 0.5, 0.5, -4.75])
    assert np.array_equal(logits[0], [2.0, -1.0, 0.5, 3.0, -2.0])  # the raw rows are left as they were


def test_min_p_keeps_tokens_near_the_most_likely():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    probs = warp(logits, SamplingParams(temperature=1.0, min_p=0.4))  # 0.4 * 0.5 = 0.2
    assert np.allclose(probs, [[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]])


@pytest.mark.parametrize("bad", [dict(repetition_penalty=0.0), dict(presence_penalty=2.5), dict(frequency_penalty=-3),
                                 dict(min_p=1.5), dict(logprobs=21)])
def test_bad_values_are_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        GenerationConfig(**bad)


@pytest.mark.parametrize("source", ["early_exit", "lookup", "hybrid"])
def test_greedy_speculative_equals_plain_with_penalties(tiny_engine, source):
    rng = np.random.default_rng(5)
    changed = 0
    for _ in range(4):
        prompt = [int(t) for t in rng.integers(2, 96, 12)]
        base = dict(max_new_tokens=40, ignore_eos=True, **PENALIZED)
        plain = tiny_engine.generate_ids(prompt, GenerationConfig(speculative=False, **base))
        assert tiny_engine.generate_ids(prompt, GenerationConfig(draft_source=source, num_draft_tokens=4,
                                                                 **base)) == plain
        unpenalized = tiny_engine.generate_ids(prompt, GenerationConfig(max_new_tokens=40, ignore_eos=True,
                                                                        speculative=False))
        changed += unpenalized != plain
    assert changed  # the penalties did change what was generated


def test_sampled_speculative_matches_plain_with_penalties_and_min_p(tiny_engine):
    options = dict(temperature=1.0, min_p=0.05, **PENALIZED)
    plain = histogram(tiny_engine, [10, 11, 12], 600, speculative=False, **options)
    spec = histogram(tiny_engine, [10, 11, 12], 600, num_draft_tokens=2, draft_source="early_exit", **options)
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


class Alternating:
    """A grammar in miniature: even and odd tokens alternate, the first even; EOS (1) after four."""

    def __init__(self, eos: int = 1, vocab: int = 96):
        self.tokens, self.eos, self.vocab = [], eos, vocab

    def _mask(self, tokens) -> np.ndarray:
        mask = np.zeros(self.vocab, bool)
        if len(tokens) >= 4:
            mask[self.eos] = True
        else:
            mask[len(tokens) % 2 :: 2] = True
            mask[self.eos] = False
        return mask

    def allowed(self, tokens):
        for i, token in enumerate(tokens):
            if not self._mask(self.tokens + tokens[:i])[token]:
                return i
        return len(tokens)

    def masks(self, drafts):
        return np.stack([self._mask(self.tokens + drafts[:i]) for i in range(len(drafts) + 1)])

    def commit(self, tokens):
        assert self.allowed(tokens) == len(tokens)
        self.tokens += tokens

    @property
    def done(self):
        return False


class FakeGrammars:
    def constraint(self, fmt):
        return Alternating()


def constrained(engine, monkeypatch, **options):
    monkeypatch.setattr(engine.decoder, "grammars", FakeGrammars())
    return GenerationConfig(max_new_tokens=16, response_format=ResponseFormat("lark", grammar="start: ..."), **options)


@pytest.mark.parametrize("source", ["early_exit", "lookup", "hybrid"])
def test_greedy_constrained_speculative_equals_constrained_plain(tiny_engine, monkeypatch, source):
    for seed in range(3):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(2, 96, 10)]
        plain = tiny_engine.generate_ids(prompt, constrained(tiny_engine, monkeypatch, speculative=False))
        spec = tiny_engine.generate_ids(prompt, constrained(tiny_engine, monkeypatch, draft_source=source))
        assert spec == plain
        assert len(plain) == 4 and [t % 2 for t in plain] == [0, 1, 0, 1]  # then EOS, not yielded


def test_sampled_constrained_speculative_matches_plain(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine.decoder, "grammars", FakeGrammars())
    options = dict(temperature=1.0, response_format=ResponseFormat("lark", grammar="start: ..."))
    plain = histogram(tiny_engine, [10, 11, 12], 600, max_new_tokens=3, speculative=False, **options)
    spec = histogram(tiny_engine, [10, 11, 12], 600, max_new_tokens=3, num_draft_tokens=2,
                     draft_source="early_exit", **options)
    assert all([t % 2 for t in out] == [0, 1, 0] for out in plain | spec)
    assert homogeneity_chi2(plain, spec) < CHI2_999_10DOF


def test_a_grammars_end_ends_the_output_even_with_ignore_eos(tiny_engine, monkeypatch):
    prompt = [int(t) for t in np.random.default_rng(4).integers(2, 96, 10)]
    plain = tiny_engine.generate_ids(prompt, constrained(tiny_engine, monkeypatch, speculative=False, ignore_eos=True))
    spec = tiny_engine.generate_ids(prompt, constrained(tiny_engine, monkeypatch, draft_source="lookup",
                                                        ignore_eos=True))
    assert spec == plain and len(plain) == 4
