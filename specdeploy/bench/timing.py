"""Interleaved, repeated timing of generation modes on one engine (median of repeats).

Modes run back to back on the same prompt before moving on, so machine noise hits all of them
alike; the speedup is a ratio measured in one run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..config import GenerationConfig
from ..runtime.stats import GenerationStats


@dataclass
class ModeResult:
    tokens: int = 0
    seconds: list[float] = field(default_factory=list)   # per repeat, summed over prompts
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    first_token_s: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    by_source: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / float(np.median(self.seconds)) if self.seconds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


def run_modes(engine, prompts: list[list[int]], modes: dict[str, GenerationConfig],
              repeats: int = 3, progress=None) -> dict[str, ModeResult]:
    """Tokens/s, acceptance and outputs of each mode over the prompts (first repeat's counts)."""
    results = {name: ModeResult() for name in modes}
    for repeat in range(repeats):
        elapsed = {name: 0.0 for name in modes}
        for prompt in prompts:
            for name, config in modes.items():
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
    result.tokens += len(out)
    result.outputs.append(out)
    result.drafted += stats.drafted
    result.accepted += stats.accepted
    result.rounds += stats.rounds
    result.first_token_s.append(stats.first_token_s or 0.0)
    for source, (r, d, a) in stats.by_source.items():
        entry = result.by_source.setdefault(source, [0, 0, 0])
        entry[0], entry[1], entry[2] = entry[0] + r, entry[1] + d, entry[2] + a
