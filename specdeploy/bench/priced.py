"""A run's rounds priced at the pass costs timed in the same run: speedups without its timing noise.

Where little is copied (chat, QA), a mode changes a few rounds in a hundred, less than the wall
time of the same code moves between runs on a shared VM (±5%): one int4 run measured lookup at
1.07× plain on chat with 47 one-token copies, 12 accepted, when those rounds cannot save 1%.
Greedy output is the same in every mode, so the modes differ only in their rounds: pricing each
round with the median pass costs of this run (the lookup bound's) says what the rounds themselves
gain or lose. The drafter's own work between passes (tens of µs a round) is not priced, nor is
anything else the wall time sees; the measured speedup stays the target, this says how far a
measured figure is noise.
"""
from __future__ import annotations

from ..runtime.costs import CostModel
from .bound import pass_cost


def round_s(costs: CostModel, exit_layer: int, source: str, drafted: int) -> float:
    """Seconds of one round at the timed pass costs.

    A plain step is one full-depth pass over one row; a lookup round one over the pending token and
    its copies (draft graph, verify graph and head each over all rows at once). An early-exit round
    runs the draft graph row by row (the pending token and each draft, the draft head on each draft)
    and then verifies every row from the exit layer.
    """
    if source == "early_exit":
        drafting = (drafted + 1) * exit_layer * costs.layer_step_s + drafted * costs.draft_head_s
        return drafting + costs.verify_s(exit_layer, drafted + 1)
    return pass_cost(costs, drafted + 1)


def priced_s(round_sizes: dict[str, dict[int, int]], costs: CostModel, exit_layer: int) -> float:
    """Seconds of a generation's rounds (`GenerationStats.round_sizes`) at the timed pass costs."""
    return sum(count * round_s(costs, exit_layer, source, drafted)
               for source, sizes in round_sizes.items() for drafted, count in sizes.items())


def priced_speedups(categories, costs: CostModel, exit_layer: int) -> dict:
    """Per greedy category and overall: each mode's priced speedup over plain decoding's rounds."""
    out, totals = {}, {}
    for category in categories:
        if category.temperature != 0:
            continue
        seconds = {name: priced_s(mode.totals.round_sizes, costs, exit_layer) for name, mode in category.modes.items()}
        if seconds["plain"] <= 0:
            continue  # one-token outputs: the prefill made them, no round to price
        for name, value in seconds.items():
            totals[name] = totals.get(name, 0.0) + value
        out[category.category] = _speedups(seconds)
    if totals:
        out["overall"] = _speedups(totals)
    return out


def _speedups(seconds: dict[str, float]) -> dict[str, float]:
    plain = seconds["plain"]
    return {name: round(plain / value, 3) for name, value in seconds.items() if name != "plain" and value > 0}
