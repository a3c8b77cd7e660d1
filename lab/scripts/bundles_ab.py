"""Two or more bundles of one model side by side: tokens/s of plain and speculative decoding and peak
memory, alternated in one run.

Usage: python lab/scripts/bundles_ab.py BUNDLE BUNDLE [...] [--repeats 3] [--max-tokens 64]
Each bundle runs in a process of its own (sides.py), the order rotating every repeat; each process
decodes one prompt per bench category (chat template when the bundle has one, EOS ignored) plain
and speculative and reports its peak resident memory. Prints each bundle's median tokens/s, its
ratio to the first bundle's, and its median peak. What it was written for: int4 in blocks of 32
with two-row matmuls against blocks of 16 (quantize --int4-block 16), the same fp32 bundle quantized
twice.
"""
from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import numpy as np


def _side(bundle: Path, max_tokens: int) -> None:
    """One process's measurement: tokens/s of each mode and the peak, as JSON on stdout."""
    from sides import category_prompts, mode_rates
    from specdeploy.runtime.engine import Engine

    with Engine(bundle) as engine:
        rates = mode_rates(engine, category_prompts(engine, max_tokens), max_tokens)
    rates["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, nargs="*")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--side", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return _side(args.side, args.max_tokens)
    from sides import alternate
    from specdeploy.bundle import manifest as manifest_io

    if len(args.bundles) < 2:
        parser.error("give two bundles or more")

    for bundle in args.bundles:
        manifest_io.read(bundle)  # a missing or bad bundle: one line, before any process starts
    sides = [str(b) for b in args.bundles]
    runs = alternate(__file__, sides, args.repeats, ["--max-tokens", str(args.max_tokens)])
    first = sides[0]
    for mode in ("plain", "speculative"):
        rates = {side: float(np.median([r[mode] for r in runs[side]])) for side in sides}
        for side in sides:
            print(f"{mode:12s} {side}: {rates[side]:6.1f} tok/s ({rates[side] / rates[first]:.3f}x)")
    for side in sides:
        print(f"peak memory  {side}: {float(np.median([r['peak_mb'] for r in runs[side]])):7.1f} MB")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
