"""Two-sample chi-square test helpers for "speculative sampling == plain sampling" checks."""
import numpy as np

from specdeploy.config import GenerationConfig

CHI2_999_10DOF = 31.26  # 0.999 quantile, 10 degrees of freedom (at most 11 cells)


def histogram(engine, prompt, runs: int, max_new_tokens: int = 2, **options) -> dict:
    counts = {}
    for seed in range(runs):
        out = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=max_new_tokens, seed=seed,
                                                           ignore_eos=True, **options))
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts


def homogeneity_chi2(first: dict, second: dict, cells: int = 10) -> float:
    """Chi-square statistic that both histograms come from one distribution (top cells + rest)."""
    keys = sorted(set(first) | set(second), key=lambda k: -(first.get(k, 0) + second.get(k, 0)))[:cells]
    a = np.array([first.get(k, 0) for k in keys] + [sum(v for k, v in first.items() if k not in keys)], float)
    b = np.array([second.get(k, 0) for k in keys] + [sum(v for k, v in second.items() if k not in keys)], float)
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    return float((((a - ea) ** 2) / ea + ((b - eb) ** 2) / eb).sum())
