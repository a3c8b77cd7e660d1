"""Logit warping and sampling: pure functions over numpy arrays.

Warping (temperature, top-k, top-p, min-p) is applied identically to the target and draft rows, so the
exactness guarantee holds for the warped target distribution.
"""
from __future__ import annotations

import numpy as np

from ..config import SamplingParams


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities [N, V] from logits [N, V] after temperature, top-k, top-p and min-p."""
    x = logits.astype(np.float64) / params.temperature  # [N, V]
    if params.top_k is not None and params.top_k < x.shape[-1]:
        kth = np.partition(x, -params.top_k, axis=-1)[:, -params.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    probs = np.exp(x)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p is not None and params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p:  # after top-p, as Hugging Face and vLLM order them: min_p of the row's top token
        probs = np.where(probs >= params.min_p * probs.max(axis=-1, keepdims=True), probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def _top_p(probs: np.ndarray, top_p: float, first: int = 256) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (per row).

    That set is a prefix of the row sorted by probability, so only the most likely `first` tokens
    are sorted (a partition finds them), more only where they do not reach top_p: a full sort of
    the vocabulary costs a millisecond a row."""
    out = np.zeros_like(probs)
    for r, row in enumerate(probs):
        k = min(first, row.size)
        while True:
            ids = np.argpartition(-row, k - 1)[:k] if k < row.size else np.arange(row.size)
            ids = ids[np.argsort(-row[ids], kind="stable")]               # [k] most likely first
            cumulative = np.cumsum(row[ids])
            if cumulative[-1] >= top_p or k == row.size:
                break
            k = min(row.size, 8 * k)
        keep = (cumulative - row[ids]) < top_p  # always keeps the top token
        out[r, ids[keep]] = row[ids[keep]]
    return out / out.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token id from a probability row [V] (inverse CDF, no per-call allocation of V ints)."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"),
                   len(probs) - 1))
