"""The most any lookup drafter could gain on these outputs: a clairvoyant bound, priced on this machine.

Lookup can only propose what followed an earlier occurrence of the last n tokens. Replaying the
plain greedy output, a clairvoyant drafter picks, every round, the occurrence whose continuation
the output follows longest and drafts exactly the tokens that will be accepted. Because a copy
that holds for `a` tokens from one position still holds for `a - 1` from the next, taking the
longest copy every round needs the fewest rounds any lookup drafter (any candidate choice or draft
length within the same n range and γ) could need. Pricing its rounds with verify passes timed on
the bundle's own graphs gives the best speedup copying can reach here; with verify rows costed at
zero it is simply its tokens per round. Measured lookup speedups are read against it.
"""
from __future__ import annotations

import numpy as np

from ..runtime.costs import CostModel


def best_copy(history: np.ndarray, future: np.ndarray, ngram: tuple[int, int], num_draft_tokens: int) -> int:
    """Longest prefix of `future` that any earlier occurrence of a suffix n-gram of `history` continues."""
    best, length = 0, len(history)
    limit = min(num_draft_tokens, len(future))
    for n in range(ngram[0], min(ngram[1], length - 1) + 1):
        windows = np.lib.stride_tricks.sliding_window_view(history[: length - 1], n)  # [N-n, n]
        for hit in np.flatnonzero((windows == history[length - n :]).all(axis=1)):
            copied = history[hit + n : hit + n + limit]
            agree = int(np.cumprod(copied == future[: len(copied)]).sum())
            best = max(best, agree)
    return best


def clairvoyant_rounds(prompt: list[int], output: list[int], ngram: tuple[int, int], num_draft_tokens: int) -> list[int]:
    """Accepted drafts per round when every round copies the best continuation, exactly as long as it holds.

    As in decoding, the first output token comes from the prefill and each round adds its accepted
    drafts plus one verified token, drafting at most `num_draft_tokens` and never past the output's end.
    """
    tokens = np.asarray(list(prompt) + list(output), np.int64)
    start, position, rounds = len(prompt), 1, []
    while position < len(output):
        room = min(num_draft_tokens, len(output) - position - 1)
        accepted = best_copy(tokens[: start + position], tokens[start + position :], ngram, room)
        rounds.append(accepted)
        position += accepted + 1
    return rounds


def pass_cost(costs: CostModel, rows: int) -> float:
    """Seconds of one full-depth pass over `rows` rows: a verify pass that starts at layer 0."""
    return costs.verify_s(0, rows)


def bound(rounds: list[int], costs: CostModel) -> dict:
    """Tokens per round and the speedup bound of a round schedule, against one-token plain steps."""
    tokens = sum(rounds) + len(rounds)
    plain = tokens * pass_cost(costs, 1)
    spent = sum(pass_cost(costs, accepted + 1) for accepted in rounds)
    return {"tokens": tokens, "rounds": len(rounds), "tokens_per_round": round(tokens / len(rounds), 3),
            "speedup_bound": round(plain / spent, 3)}


def copy_bounds(cases: dict[str, list[tuple[list[int], list[int]]]], costs: CostModel,
                ngram: tuple[int, int], num_draft_tokens: int) -> dict:
    """Per category and overall: the clairvoyant lookup bound over (prompt ids, plain output) pairs."""
    out, everything = {}, []
    for category, pairs in cases.items():
        rounds = [r for prompt, output in pairs if output for r in clairvoyant_rounds(prompt, output, ngram, num_draft_tokens)]
        everything += rounds
        if rounds:
            out[category] = bound(rounds, costs)
    if everything:
        out["overall"] = bound(everything, costs)
    return out
