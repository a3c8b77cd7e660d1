"""The A/B scripts' side: one prompt per category, both modes timed."""
from sides import category_prompts, mode_rates
from specdeploy.prompts import BENCH_PROMPTS
from specdeploy.runtime.engine import Engine


def test_a_side_times_both_modes_over_a_prompt_per_category(tiny_bundle):
    with Engine(tiny_bundle) as engine:
        prompts = category_prompts(engine, max_tokens=6)
        assert len(prompts) == len(BENCH_PROMPTS)
        assert all(0 < len(ids) <= engine.manifest.max_context - 6 for ids in prompts)
        rates = mode_rates(engine, prompts[:2], max_tokens=6)
    assert set(rates) == {"plain", "speculative"} and min(rates.values()) > 0


def test_a_long_prompt_has_exactly_the_tokens_asked_for(tiny_bundle):
    from sides import long_prompt

    with Engine(tiny_bundle) as engine:
        for tokens in (1, 40, 120):
            ids = long_prompt(engine, tokens)
            assert len(ids) == tokens and ids == long_prompt(engine, 120)[:tokens]
