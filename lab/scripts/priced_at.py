"""One bench run's drafts priced at another bundle's pass costs: what the same rounds would gain
where verify rows cost what they cost there.

Usage: python lab/scripts/priced_at.py DRAFTS_RESULTS_JSON COSTS_RESULTS_JSON
Both are `bench --quick` results (results.json). A bundle of random weights drafts nothing a real
model would (only lookup's copies of the prompt are ever accepted), so a 1.5B bundle made here
cannot say what its default mode gains; a real model's run (the example's) can say what its
rounds would gain at the 1.5B bundle's row costs. Per greedy category and speculative mode, each
draft source's rounds (`by_source`: rounds and draft tokens) are priced at their mean drafted rows
(interpolated between whole row counts) as bench/priced.py prices a round, against the plain
mode's rounds at one row each. An estimate: a 1.5B model drafts and accepts otherwise than a 135M
one, and the drafter's own work is not priced.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from specdeploy.bench.priced import round_s
from specdeploy.runtime.costs import CostModel


def cost_model(results: dict) -> tuple[CostModel, int]:
    """(the timed costs, the exit layer) of a quick bench's results."""
    costs, bundle = results["lookup_bound"]["costs"], results["bundle"]
    seconds = lambda table: {int(k): v / 1000 for k, v in table.items()}  # noqa: E731
    return CostModel(bundle["num_layers"], costs["layer_step_ms"] / 1000, seconds(costs["layer_rows_ms"]),
                     seconds(costs["head_ms"]), costs["draft_head_ms"] / 1000), bundle["exit_layer"]


def source_s(costs: CostModel, exit_layer: int, source: str, rounds: int, drafted: int) -> float:
    """Seconds of `rounds` rounds of `source` that drafted `drafted` tokens in all."""
    if not rounds:
        return 0.0
    mean = drafted / rounds
    low, high = math.floor(mean), math.ceil(mean)
    at = lambda d: round_s(costs, exit_layer, "lookup" if source == "plain" else source, d)  # noqa: E731
    return rounds * (at(low) + (mean - low) * (at(high) - at(low)))


def priced(drafts: dict, costs: CostModel, exit_layer: int) -> dict[str, dict[str, float]]:
    """category -> mode -> priced speedup over plain, and the same over all categories."""
    out, totals = {}, {}
    for category, modes in drafts["results"]["0.0"].items():
        seconds = {mode: sum(source_s(costs, exit_layer, source, s["rounds"], s["draft_tokens"])
                             for source, s in figures["by_source"].items())
                   for mode, figures in modes.items()}
        if seconds.get("plain", 0) <= 0:
            continue
        out[category] = {mode: seconds["plain"] / s for mode, s in seconds.items() if mode != "plain" and s > 0}
        for mode, s in seconds.items():
            totals[mode] = totals.get(mode, 0.0) + s
    out["overall"] = {mode: totals["plain"] / s for mode, s in totals.items() if mode != "plain" and s > 0}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", type=Path, help="the run whose rounds are priced (results.json)")
    parser.add_argument("costs", type=Path, help="the run whose pass costs price them (results.json)")
    args = parser.parse_args()
    for path in (args.drafts, args.costs):
        if not path.is_file():
            sys.exit(f"error: {path}: no such file; give two `bench --quick` results.json files")
    drafts, costs_run = (json.loads(p.read_text()) for p in (args.drafts, args.costs))
    costs, exit_layer = cost_model(costs_run)
    table = priced(drafts, costs, exit_layer)
    modes = sorted({mode for row in table.values() for mode in row})
    print(f"rounds of {drafts['bundle']['model']} priced at {costs_run['bundle']['model']}'s pass costs "
          f"(one-row step {1000 * costs.full_step_s:.1f} ms)")
    print("| category | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for category, row in table.items():
        print(f"| {category} | " + " | ".join(f"{row.get(m, float('nan')):.2f}×" for m in modes) + " |")


if __name__ == "__main__":
    main()
