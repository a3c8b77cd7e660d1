"""The greedy identity every bundle promises, as one check the tests share."""
import numpy as np

from specdeploy.config import GenerationConfig


def assert_early_exit_equals_plain(engine, seeds: int = 3, tokens: int = 32, vocab: int = 96) -> None:
    """Greedy speculative decoding from the early exit gives plain decoding's tokens, for `seeds`
    random 8-token prompts."""
    base = dict(max_new_tokens=tokens, ignore_eos=True)
    for seed in range(seeds):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(2, vocab, 8)]
        plain = engine.generate_ids(prompt, GenerationConfig(speculative=False, **base))
        assert engine.generate_ids(prompt, GenerationConfig(draft_source="early_exit", **base)) == plain
