"""Interleaved, repeated timing of generation modes on one engine: speedups paired by repeat.

Modes run back to back on the same prompt before moving on, so machine noise hits all of them
alike, in reverse order on odd repeats, so no mode always runs first after a prompt change. A
speedup is the median over repeats of the ratio *within* each repeat: a VM whose speed moves by
a fifth between repeats (the Intel VM of lab/notes/benchmarks-history.md) moves both sides of that ratio alike,
where a ratio of each mode's own median time can pair one mode's fast repeat with the other's
slow one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..config import GenerationConfig
from .stats import GenerationStats


@dataclass
class ModeResult:
    """One mode's totals over the prompts (first repeat) and its wall time per repeat."""

    totals: GenerationStats = field(default_factory=GenerationStats)
    seconds: list[float] = field(default_factory=list)   # per repeat, summed over prompts
    first_token_s: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / float(np.median(self.seconds)) if self.seconds else 0.0

    def speedup_over(self, plain: "ModeResult") -> float:
        """Tokens/s relative to `plain`, paired by repeat: median of per-repeat ratios."""
        return paired_speedup(self.tokens, self.seconds, plain.tokens, plain.seconds)

    drafted = property(lambda self: self.totals.drafted)
    accepted = property(lambda self: self.totals.accepted)
    rounds = property(lambda self: self.totals.rounds)
    by_source = property(lambda self: self.totals.by_source)
    acceptance_rate = property(lambda self: self.totals.acceptance_rate)
    tokens_per_round = property(lambda self: self.totals.tokens_per_round)


def repeat_speedups(tokens: int, seconds: list[float], base_tokens: int, base_seconds: list[float]) -> list[float]:
    """(tokens / seconds[r]) / (base_tokens / base_seconds[r]) for each repeat r both sides measured."""
    if not base_tokens:
        return []
    return [tokens * b / (base_tokens * s) for s, b in zip(seconds, base_seconds) if s > 0 and b > 0]


def paired_speedup(tokens: int, seconds: list[float], base_tokens: int, base_seconds: list[float]) -> float:
    """Median of the per-repeat speedups; 0 if unmeasured."""
    ratios = repeat_speedups(tokens, seconds, base_tokens, base_seconds)
    return float(np.median(ratios)) if ratios else 0.0


def run_modes(engine, prompts: list[list[int]], modes: dict[str, GenerationConfig],
              repeats: int = 3, progress=None) -> dict[str, ModeResult]:
    """Tokens/s, acceptance and outputs of each mode over the prompts (first repeat's counts)."""
    results = {name: ModeResult() for name in modes}
    for repeat in range(repeats):
        elapsed = {name: 0.0 for name in modes}
        order = list(modes.items())[:: -1 if repeat % 2 else 1]
        for prompt in prompts:
            for name, config in order:
                stats = GenerationStats()
                began = time.perf_counter()
                out = engine.generate_ids(prompt, config, stats)
                elapsed[name] += time.perf_counter() - began
                if repeat == 0:
                    _record(results[name], out, stats)
                if progress:
                    progress()
        for name in modes:
            results[name].seconds.append(elapsed[name])
    return results


def _record(result: ModeResult, out: list[int], stats: GenerationStats) -> None:
    result.outputs.append(out)
    result.totals.merge(stats)
    result.first_token_s.append(stats.first_token_s or 0.0)
