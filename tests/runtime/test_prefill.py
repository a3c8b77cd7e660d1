"""Chunked prefill: a prompt goes through the graphs in passes of at most `prefill_chunk` rows, each
attending to the KV rows the passes before it wrote; on a row-independent bundle the result is the
one-pass prefill bit for bit."""
import numpy as np
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.constants import DEFAULT_PREFILL_CHUNK
from specdeploy.errors import ConfigError
from specdeploy.runtime.decoder import Decoder
from specdeploy.runtime.engine import Engine

PROMPT = [int(t) for t in np.random.default_rng(11).integers(2, 96, 45)]


def test_passes_cover_the_prompt_once_in_chunks(tiny_bundle, monkeypatch):
    with Engine(tiny_bundle, prefill_chunk=16) as engine:
        passes = []
        draft_pass = engine.model.draft_pass
        monkeypatch.setattr(engine.model, "draft_pass",
                            lambda tokens, start: passes.append((start, list(tokens))) or draft_pass(tokens, start))
        engine.generate_ids(PROMPT, GenerationConfig(max_new_tokens=1, speculative=False))
    assert [(start, len(rows)) for start, rows in passes] == [(0, 16), (16, 16), (32, 13)]
    assert [t for _, rows in passes for t in rows] == PROMPT


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_is_the_one_pass_prefill_bit_for_bit(tiny_bundle, chunk):
    with Engine(tiny_bundle, prefill_chunk=len(PROMPT)) as one, Engine(tiny_bundle, prefill_chunk=chunk) as chunked:
        whole = one.model.prefill(PROMPT, len(PROMPT)).copy()             # [1, H]
        parts = chunked.model.prefill(PROMPT, chunk).copy()               # [1, H]
        assert np.array_equal(whole, parts)
        for speculative in (False, True):  # the KV the chunks wrote serves every later step alike
            config = GenerationConfig(max_new_tokens=24, speculative=speculative, ignore_eos=True)
            assert chunked.generate_ids(PROMPT, config) == one.generate_ids(PROMPT, config)


def test_default_chunk_and_a_backend_with_fewer_rows(tiny_bundle):
    with Engine(tiny_bundle) as engine:
        assert engine.decoder.prefill_chunk == min(DEFAULT_PREFILL_CHUNK, engine.model.max_context)
        engine.model.max_rows = 8  # as a TensorRT engine built for 8 rows a call
        assert Decoder(engine.model).prefill_chunk == 8


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_a_bad_chunk_is_refused_naming_the_option(tiny_bundle, bad):
    with pytest.raises(ConfigError, match="prefill_chunk=.* must be a whole number of rows >= 1"):
        Engine(tiny_bundle, prefill_chunk=bad)
