"""Choose exit layer, draft length and confidence threshold from held-out acceptance and costs.

Greedy rounds are replayed on held-out sequences of the model's own output: at each position we
know whether the (calibrated) exit's greedy token equals the full model's and how confident the
exit was, so the tokens a round commits and what it costs follow exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.costs import CostModel


@dataclass(frozen=True)
class Candidate:
    exit_layer: int
    num_draft_tokens: int
    threshold: float | None
    acceptance: float           # α: accepted / drafted
    tokens_per_round: float     # τ
    cost_ratio: float           # c: draft step / full step
    predicted_speedup: float
    formula_speedup: float      # τ / (γ c + 1), the DESIGN.md estimate


def replay(match: np.ndarray, confidence: np.ndarray, segment: np.ndarray, gamma: int,
           threshold: float | None, draft_cost: float, verify_cost) -> tuple[int, int, int, float, int]:
    """(committed tokens, drafted, accepted, cost in seconds, rounds) over all held-out segments."""
    committed = drafted_total = accepted_total = rounds = 0
    cost = 0.0
    for seg in np.unique(segment):
        ok, conf = match[segment == seg], confidence[segment == seg]
        j, n = 0, len(ok)
        while j < n:
            drafted, accepted, failed = 0, 0, False
            for i in range(min(gamma, n - j - 1)):
                if threshold is not None and conf[j + i] < threshold:
                    break
                drafted += 1
                if not failed and ok[j + i]:
                    accepted += 1
                else:
                    failed = True
            shallow_steps = drafted + 1
            cost += shallow_steps * draft_cost + verify_cost(drafted + 1)
            committed += accepted + 1
            drafted_total, accepted_total, rounds = drafted_total + drafted, accepted_total + accepted, rounds + 1
            j += accepted + 1
    return committed, drafted_total, accepted_total, cost, rounds


def evaluate(exit_layer: int, match, confidence, segment, costs: CostModel,
             gammas=range(1, 9), thresholds=(None, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)) -> list[Candidate]:
    full = costs.full_step_s
    draft_cost = costs.draft_step_s(exit_layer)
    c = draft_cost / full
    out = []
    for gamma in gammas:
        for threshold in thresholds:
            committed, drafted, accepted, cost, rounds = replay(
                match, confidence, segment, gamma, threshold, draft_cost,
                lambda rows: costs.verify_s(exit_layer, rows),
            )
            alpha = accepted / drafted if drafted else 0.0
            tau = committed / rounds
            speedup = committed * full / cost
            out.append(Candidate(exit_layer, gamma, threshold, alpha, tau, c, speedup,
                                 tau / (gamma * c + 1)))
    return out


def best(candidates: list[Candidate]) -> Candidate:
    return max(candidates, key=lambda c: c.predicted_speedup)


def table(candidates: list[Candidate], measured: dict | None = None) -> str:
    """Markdown table: one row per exit layer (its best γ and threshold)."""
    measured = measured or {}
    rows = ["| k | γ | threshold | α | τ | c | formula | predicted | measured |",
            "|---|---|---|---|---|---|---|---|---|"]
    by_exit: dict[int, Candidate] = {}
    for cand in candidates:
        if cand.exit_layer not in by_exit or cand.predicted_speedup > by_exit[cand.exit_layer].predicted_speedup:
            by_exit[cand.exit_layer] = cand
    for k, c in sorted(by_exit.items()):
        m = measured.get((k, c.num_draft_tokens))
        rows.append(
            f"| {k} | {c.num_draft_tokens} | {c.threshold or '-'} | {c.acceptance:.2f} | "
            f"{c.tokens_per_round:.2f} | {c.cost_ratio:.2f} | {c.formula_speedup:.2f}× | "
            f"{c.predicted_speedup:.2f}× | {f'{m:.2f}×' if m else '-'} |"
        )
    return "\n".join(rows)
