"""Prefix reuse: a prompt is prefilled from the first token where it leaves the last sequence's
kept KV rows, and the generation is the generation of a fresh engine, token for token."""
import numpy as np
import pytest

from specdeploy.config import GenerationConfig
from specdeploy.runtime.engine import Engine
from specdeploy.runtime.stats import GenerationStats

pytestmark = pytest.mark.unit
RNG = np.random.default_rng(3)
TURN_1 = [int(t) for t in RNG.integers(2, 96, 20)]


def run(engine, prompt, **options):
    stats = GenerationStats()
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True, **options)
    return engine.generate_ids(prompt, config, stats), stats


@pytest.mark.parametrize("options", [dict(speculative=False), dict(draft_source="hybrid"),
                                     dict(temperature=0.9, seed=4, draft_source="early_exit")])
def test_a_conversation_reuses_its_history_and_gives_a_fresh_engines_tokens(tiny_bundle, options):
    with Engine(tiny_bundle) as kept, Engine(tiny_bundle) as fresh:
        reply, first = run(kept, TURN_1, **options)
        assert first.cached_tokens == 0
        turn_2 = TURN_1 + reply + [int(t) for t in RNG.integers(2, 96, 7)]
        out, stats = run(kept, turn_2, **options)
        # every row but the new words' and the reply's last token's (sampled, never fed)
        assert stats.cached_tokens == len(TURN_1) + len(reply) - 1
        fresh.decoder.reuse = False
        assert out == run(fresh, turn_2, **options)[0]


def test_a_different_prompt_reuses_only_the_common_start(tiny_engine):
    run(tiny_engine, TURN_1)
    changed = TURN_1[:8] + [(TURN_1[8] + 1) % 96] + TURN_1[9:]
    _, stats = run(tiny_engine, changed)
    assert stats.cached_tokens == 8
    _, again = run(tiny_engine, changed)
    assert again.cached_tokens == len(changed) - 1  # the last token is prefilled again, for its logits


def test_rows_another_pass_overwrote_are_not_reused(tiny_engine):
    run(tiny_engine, TURN_1)
    tiny_engine.model.draft_pass([5, 6], 3)  # a pass writing rows 3..4, as a check or a probe would
    assert tiny_engine.model.kept == 3
    _, stats = run(tiny_engine, TURN_1)
    assert stats.cached_tokens == 3


def test_a_generation_stopped_midway_keeps_what_it_committed(tiny_bundle):
    with Engine(tiny_bundle) as kept, Engine(tiny_bundle) as fresh:
        steps = kept.decoder.generate(TURN_1, GenerationConfig(max_new_tokens=30, ignore_eos=True))
        taken = [t for _, step in zip(range(3), steps) for t in step.tokens]
        steps.close()  # the client went away
        turn_2 = TURN_1 + taken + [7, 8]
        out, stats = run(kept, turn_2, draft_source="lookup")
        assert stats.cached_tokens >= len(TURN_1) + len(taken) - 1
        fresh.decoder.reuse = False
        assert out == run(fresh, turn_2, draft_source="lookup")[0]


def test_a_bundle_with_a_feature_head_prefills_every_prompt_whole(head_bundle):
    with Engine(head_bundle[0]) as engine:
        run(engine, TURN_1)
        _, stats = run(engine, TURN_1 + [4, 5])
        assert stats.cached_tokens == 0
