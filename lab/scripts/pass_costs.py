"""How steady the timed pass costs are: the cost model measured again and again, two ways, in turn.

Usage: python lab/scripts/pass_costs.py BUNDLE [--runs 8] [--max-rows 5]
Each run measures the cost model of `runtime/costs.py` (every pass timed in turn within each
repeat, rows priced against the one-row pass of the same repeat) and, alternating with it, the
form it replaced (fifteen passes over one row count, then fifteen over the next); each prints what
a pass over 2..max rows costs in one-row passes, then their mean, spread and range per form.
What the bench's bound and priced tables, the replay's measured prices and calibration's autotune
take from the machine: a spread here is a price there.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def blocked_ratios(model, max_rows: int, repeats: int = 15) -> list[float]:
    """Full-depth pass over r rows / over one row, priced as costs.measure prices it (the verify
    graph's layers scaled to the model's, plus the head), each row count timed after the one before."""
    m = model.manifest
    scale, base = m.model.num_layers / (m.model.num_layers - m.exit_layer), 32
    model.verify_pass(model.draft_pass(list(range(3, 3 + base)), 0).copy(), 0)
    one = model.draft_pass([5], base).copy()                    # [1, H]
    seconds = []
    for rows in range(1, max_rows + 1):
        hidden = np.repeat(one, rows, axis=0)                 # [rows, H]
        seconds.append(scale * _median_time(lambda h=hidden: model.verify_pass(h, base), repeats)
                       + _median_time(lambda h=hidden: model.logits(h), repeats))
    return [s / seconds[0] for s in seconds[1:]]


def interleaved_ratios(model, max_rows: int) -> list[float]:
    from specdeploy.bench.bound import pass_cost
    from specdeploy.runtime.costs import measure

    costs = measure(model, max_rows)
    return [pass_cost(costs, rows) / pass_cost(costs, 1) for rows in range(2, max_rows + 1)]


def main() -> None:
    from specdeploy import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--max-rows", type=int, default=5)
    args = parser.parse_args()
    forms = {"in turn (costs.measure)": interleaved_ratios, "one row count after another": blocked_ratios}
    results: dict[str, list[list[float]]] = {name: [] for name in forms}
    columns = " ".join(f"{rows:>6d}" for rows in range(2, args.max_rows + 1))
    with Engine(args.bundle) as engine:
        print(f"a pass over r rows in one-row passes, r = {columns}")
        for run in range(args.runs):
            for name, ratios in (forms.items() if run % 2 == 0 else reversed(forms.items())):
                results[name].append(ratios(engine.model, args.max_rows))
                print(f"run {run + 1} {name:28s} " + " ".join(f"{r:6.3f}" for r in results[name][-1]))
    for name, runs in results.items():
        r = np.asarray(runs)                                  # [runs, max_rows - 1]
        print(name)
        for label, row in (("mean", r.mean(0)), ("sd", r.std(0, ddof=1) if len(r) > 1 else 0 * r[0]),
                           ("min", r.min(0)), ("max", r.max(0))):
            print(f"  {label:5s} " + " ".join(f"{v:6.3f}" for v in row))


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
