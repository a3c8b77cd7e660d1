"""Log-probabilities of chosen tokens and their most likely alternatives, from the bundle's own logits.

The values are the log-softmax of the full model's raw logits (before penalties, grammar,
temperature or truncation), as OpenAI's API and lm-evaluation-harness read them. A verify row is
bitwise the one-row step, so they are the same with and without speculation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[R, V] float64 log-probabilities of logits rows [R, V]."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def token_logprobs(logits: np.ndarray, tokens, top: int) -> list[TokenLogprob]:
    """Row i's log-probability of tokens[i], with its `top` most likely tokens, for logits [R, V]."""
    logp = log_softmax(logits)                                                # [R, V]
    out = []
    for row, token in zip(logp, tokens):
        best: tuple[tuple[int, float], ...] = ()
        if top:
            ids = np.argpartition(-row, top - 1)[:top]
            ids = ids[np.argsort(-row[ids], kind="stable")]
            best = tuple((int(i), float(row[i])) for i in ids)
        out.append(TokenLogprob(int(token), float(row[token]), best))
    return out
