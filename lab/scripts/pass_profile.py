"""What grows with rows: a full-depth pass's kernel time by op type over one row and over R rows.

Usage: python lab/scripts/pass_profile.py BUNDLE [--rows 8] [--repeats 10] [--top 12]
Loads BUNDLE with profiling on (step_profile.py's engine), then runs the verify pass and the LM
head `--repeats` times over one row and as often over R rows, at a valid length of 32 as the cost
model does (runtime/costs.py). Per op type it prints the kernel microseconds a pass over one row,
over R rows, their ratio, and what the op adds for the R-1 extra rows as a share of the one-row
pass: the column that says where a cheaper verify row must come from. Profiling adds its own cost
to every kernel, the small ones most: read the large ops' ratios.
"""
from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np
from step_profile import profiled_engine


def phase_times(path: str, repeats: int) -> list[collections.Counter]:
    """Kernel microseconds by op type of the last two phases of `repeats` runs each in one
    session's profile: a run executes every node once, so a phase is repeats x nodes events."""
    events = [e for e in json.loads(Path(path).read_text())
              if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    events.sort(key=lambda e: e["ts"])
    per_run = len({e["name"] for e in events})
    size = repeats * per_run
    phases = [events[len(events) - 2 * size: len(events) - size], events[len(events) - size:]]
    counted = []
    for phase in phases:
        micros = collections.Counter()
        for event in phase:
            micros[event["args"].get("op_name", "?")] += event["dur"] / repeats
        counted.append(micros)
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = profiled_engine(args.bundle, str(Path(tmp) / "pass"))
        model, base = engine.model, 32
        model.verify_pass(model.draft_pass(list(range(3, 3 + base)), 0).copy(), 0)
        one = model.draft_pass([5], base).copy()                               # [1, H]
        for rows in (1, args.rows):
            hidden = np.repeat(one, rows, axis=0)                                # [rows, H]
            for _ in range(args.repeats):
                model.logits(model.verify_pass(hidden, base))
        files = {name: stage.session.end_profiling() for name, stage in engine.model.stages.items()}
        single, many = collections.Counter(), collections.Counter()
        for name in ("verify", "head"):
            if name in files:
                a, b = phase_times(files[name], args.repeats)
                single.update(a)
                many.update(b)
    one_pass = sum(single.values())
    print(f"{args.bundle.name}: kernels of a full-depth pass (verify graph and head), µs: one row "
          f"{one_pass:.0f}, {args.rows} rows {sum(many.values()):.0f} ({sum(many.values()) / one_pass:.2f}x)")
    print(f"{'op':34s} {'1 row':>9s} {f'{args.rows} rows':>9s} {'ratio':>6s} {'extra rows, share of a 1-row pass':>34s}")
    for op, _ in sorted(many.items(), key=lambda kv: kv[1] - single[kv[0]], reverse=True)[: args.top]:
        grown = (many[op] - single[op]) / one_pass
        print(f"{op:34s} {single[op]:9.0f} {many[op]:9.0f} {many[op] / max(single[op], 1e-9):6.2f} {grown:34.3f}")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
