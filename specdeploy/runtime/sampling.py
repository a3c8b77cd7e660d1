"""Logit warping and sampling: pure functions over numpy arrays.

Warping (temperature, top-k, top-p) is applied identically to the target and draft rows, so the
exactness guarantee holds for the warped target distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not (0.0 <= self.temperature <= 100.0):
            raise ConfigError(f"temperature={self.temperature} must be in [0, 100]; use 0 for greedy")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k={self.top_k} must be >= 1 (or unset)")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p={self.top_p} must be in (0, 1] (or unset)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities [N, V] from logits [N, V] after temperature, top-k and top-p."""
    x = logits.astype(np.float64) / params.temperature  # [N, V]
    if params.top_k is not None and params.top_k < x.shape[-1]:
        kth = np.partition(x, -params.top_k, axis=-1)[:, -params.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    probs = np.exp(x)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p is not None and params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return probs


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (per row)."""
    order = np.argsort(-probs, axis=-1)
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    cumulative = np.cumsum(sorted_probs, axis=-1)
    keep_sorted = (cumulative - sorted_probs) < top_p  # always keeps the top token
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    out = np.where(keep, probs, 0.0)
    return out / out.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token id from a probability row [V] (inverse CDF, no per-call allocation of V ints)."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"),
                   len(probs) - 1))
