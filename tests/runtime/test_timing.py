from specdeploy.config import GenerationConfig
from specdeploy.runtime.timing import ModeResult, paired_speedup, run_modes


def test_speedup_pairs_each_repeat_with_its_own_baseline():
    """The machine slowed for plain in repeat 3 and for the mode in repeats 2 and 3 (a slow spell
    that began during repeat 2); within repeats 1 and 3 both ran alike, the mode 10% faster."""
    plain, mode = [1.0, 1.0, 2.0], [1.0 / 1.1, 2.0, 2.0 / 1.1]
    assert abs(paired_speedup(100, mode, 100, plain) - 1.1) < 1e-12
    # (a ratio of each mode's own median time would pair plain's 1.0 with the mode's 1.82: 0.55x)


def test_speedup_counts_tokens_and_skips_unmeasured_repeats():
    assert abs(paired_speedup(120, [1.0, 1.0], 100, [1.0, 1.0]) - 1.2) < 1e-12
    assert abs(paired_speedup(100, [0.0, 0.5], 100, [1.0, 1.0]) - 2.0) < 1e-12
    assert paired_speedup(100, [], 100, []) == 0.0
    assert paired_speedup(100, [1.0], 0, [1.0]) == 0.0


def test_mode_result_speedup_over_plain_is_paired():
    plain = ModeResult(seconds=[1.0, 3.0, 2.0], outputs=[[1] * 10])
    fast = ModeResult(seconds=[0.5, 1.5, 1.0], outputs=[[1] * 10])
    assert fast.speedup_over(plain) == 2.0


class _Engine:
    def __init__(self):
        self.calls = []

    def generate_ids(self, prompt, config, stats):
        self.calls.append((prompt[0], config.max_new_tokens))
        return [7]


def test_modes_run_interleaved_per_prompt_in_reverse_order_on_odd_repeats():
    engine = _Engine()
    modes = {"a": GenerationConfig(max_new_tokens=1), "b": GenerationConfig(max_new_tokens=2)}
    results = run_modes(engine, [[10], [20]], modes, repeats=2)
    assert engine.calls == [(10, 1), (10, 2), (20, 1), (20, 2), (10, 2), (10, 1), (20, 2), (20, 1)]
    assert all(len(r.seconds) == 2 and r.outputs == [[7], [7]] for r in results.values())
