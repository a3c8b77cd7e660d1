"""The identity rule for GPU kernels, in its CPU form: every pass carries the same padded row count,
and the output is what unpadded passes give (on the CPU, whose rows are independent), greedy
speculative output equal to plain for every source."""
import numpy as np
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.errors import ConfigError
from specdeploy.runtime.engine import Engine

PROMPTS = [[int(t) for t in np.random.default_rng(s).integers(2, 96, 11)] for s in range(3)]


def rows_seen(engine, monkeypatch) -> list[int]:
    seen = []
    for stage in engine.model.stages.values():
        run = stage.run

        def counted(feeds, run=run):
            seen.append(next(iter(feeds.values())).shape[1])
            return run(feeds)
        monkeypatch.setattr(stage, "run", counted)
    return seen


@pytest.mark.parametrize("source", ["early_exit", "lookup", "hybrid"])
def test_every_pass_carries_the_fixed_rows_and_the_output_is_unpadded_output(tiny_bundle, monkeypatch, source):
    with Engine(tiny_bundle, fixed_rows=5) as padded, Engine(tiny_bundle) as plain_engine:
        seen = rows_seen(padded, monkeypatch)
        for prompt in PROMPTS:
            base = dict(max_new_tokens=24, ignore_eos=True)
            plain = padded.generate_ids(prompt, GenerationConfig(speculative=False, **base))
            spec = padded.generate_ids(prompt, GenerationConfig(draft_source=source, num_draft_tokens=4, **base))
            assert spec == plain == plain_engine.generate_ids(prompt, GenerationConfig(speculative=False, **base))
            sampled = GenerationConfig(temperature=1.0, seed=3, draft_source=source, **base)
            assert padded.generate_ids(prompt, sampled) == plain_engine.generate_ids(prompt, sampled)
        decode = seen[len(seen) // 3:]  # past the first prompt's prefill (11 rows, above the fixed count)
        assert set(decode) <= {5, 11} and 5 in decode


def test_drafts_beyond_the_fixed_rows_are_refused(tiny_bundle):
    with Engine(tiny_bundle, fixed_rows=3) as engine:
        with pytest.raises(ConfigError, match="every pass carries here"):
            engine.generate_ids([5, 6], GenerationConfig(num_draft_tokens=4, max_new_tokens=4))


@pytest.mark.integration  # the head bundle's export: not the fast tier
def test_a_feature_head_drafts_alike_under_fixed_rows(head_bundle):
    bundle, _ = head_bundle
    with Engine(bundle, fixed_rows=6) as padded, Engine(bundle) as unpadded:
        for prompt in PROMPTS:
            config = GenerationConfig(draft_source="feature", max_new_tokens=20, ignore_eos=True)
            assert padded.generate_ids(prompt, config) == unpadded.generate_ids(prompt, config)
