"""Exact acceptance of a round's draft tokens: the whole algorithm, top to bottom.

Greedy: accept x_i iff it equals argmax p_i. Sampled: accept x_i with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from norm(max(0, p_i - q_i)); if every
draft is accepted, sample the bonus token from p_{γ+1}. A draft without a distribution (copied from
the context) is a one-hot proposal, q_i(x_i) = 1, which keeps the test exact at any temperature.
"""
from __future__ import annotations

import numpy as np

from .sampling import sample


def accept_greedy(draft_tokens: list[int], target_logits: np.ndarray) -> tuple[int, int]:
    """(accepted count m, next token) from target logits [γ+1, V]."""
    targets = target_logits.argmax(axis=-1)  # [γ+1]
    for i, token in enumerate(draft_tokens):
        if token != targets[i]:
            return i, int(targets[i])
    return len(draft_tokens), int(targets[len(draft_tokens)])


def accept_sampled(
    draft_tokens: list[int],
    draft_probs: np.ndarray | None,   # [γ, V] warped draft distributions, or None for one-hot drafts
    target_probs: np.ndarray,         # [γ+1, V] warped target distributions
    rng: np.random.Generator,
) -> tuple[int, int]:
    """(accepted count m, correction or bonus token) by rejection sampling."""
    for i, token in enumerate(draft_tokens):
        p = target_probs[i]
        q_token = 1.0 if draft_probs is None else draft_probs[i, token]
        if rng.random() * q_token < p[token]:
            continue
        if draft_probs is None:
            residual = p.copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(p - draft_probs[i], 0.0)
        total = residual.sum()
        return i, sample(residual / total if total > 0 else p, rng)
    return len(draft_tokens), sample(target_probs[len(draft_tokens)], rng)
