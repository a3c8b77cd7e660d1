"""The draft vocabulary: the tokens that cover most of the model's own next-token mass.

A draft head over this subset costs a fraction of the full LM head. Exactness is unaffected: the
draft distribution is zero outside the subset and the verifier's residual covers every token.
"""
from __future__ import annotations

import numpy as np

from .data import Activations


def choose(acts: Activations, vocab_size: int, size: int) -> np.ndarray:
    """Sorted ids of the `size` tokens with the most teacher probability mass (all if size >= V)."""
    if size >= vocab_size:
        return np.arange(vocab_size, dtype=np.int64)
    mass = np.zeros(vocab_size)
    np.add.at(mass, acts.teacher_ids.ravel(), acts.teacher_probs.ravel())
    mass[acts.greedy] += 1.0  # the greedy token weighs most
    # break ties by id so frequent low ids (common sub-words) come first
    order = np.lexsort((np.arange(vocab_size), -mass))
    return np.sort(order[:size]).astype(np.int64)


def coverage(acts: Activations, vocab_ids: np.ndarray) -> float:
    """Share of the teacher's greedy tokens inside the subset."""
    return float(np.isin(acts.greedy, vocab_ids).mean())
