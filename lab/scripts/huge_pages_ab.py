"""Packed weights on 2 MB pages (the runtime's default on Linux >= 6.1) vs left on 4 KB pages, tokens/s alternated in one run.

Usage: python lab/scripts/huge_pages_ab.py BUNDLE [--repeats 3] [--max-tokens 64] [--load-order N [--small-pages]]
Each side runs in a process of its own (huge pages are a property of a process's memory: two
engines of one process share its heap), the sides alternating and swapping order every repeat;
each process decodes one prompt per bench category (chat template when the bundle has one, EOS
ignored) plain and speculative. Prints each side's median tokens/s and the ratio, and its median
peak resident memory (the process's, loading and both modes).
--load-order N: instead, BUNDLE loaded N times in one process (on 4 KB pages with --small-pages),
plain decoding interleaved, order reversed every repeat; prints each engine's speed relative to
the first loaded (what a same-process comparison of engines is biased by).
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np

SIDES = ("huge", "4 KB")


def _side(bundle: Path, side: str, max_tokens: int) -> None:
    """One process's measurement: tokens/s of each mode, as JSON on stdout."""
    from specdeploy.backends import onnxruntime as backend
    from sides import category_prompts, mode_rates
    from specdeploy.runtime.engine import Engine

    if side != "huge":
        backend.collapse_new = lambda before: 0
    with Engine(bundle) as engine:
        rates = mode_rates(engine, category_prompts(engine, max_tokens), max_tokens)
    rates["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(rates))


def _load_order(bundle: Path, count: int, small_pages: bool, repeats: int, max_tokens: int) -> None:
    from specdeploy.backends import onnxruntime as backend
    from sides import category_prompts
    from specdeploy.config import GenerationConfig
    from specdeploy.runtime.engine import Engine

    if small_pages:
        backend.collapse_new = lambda before: 0
    engines = [Engine(bundle) for _ in range(count)]
    prompts = category_prompts(engines[0], max_tokens)
    config = GenerationConfig(max_new_tokens=max_tokens, speculative=False, ignore_eos=True)
    seconds = [0.0] * count
    for repeat in range(repeats):
        for ids in prompts:
            for i in range(count)[:: 1 if repeat % 2 == 0 else -1]:
                began = time.perf_counter()
                engines[i].generate_ids(ids, config)
                seconds[i] += time.perf_counter() - began
    print("speed by load order, relative to the first: " + " / ".join(f"{seconds[0] / s:.3f}" for s in seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--load-order", type=int, metavar="N")
    parser.add_argument("--small-pages", action="store_true")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return _side(args.bundle, args.side, args.max_tokens)
    from specdeploy.bundle import manifest as manifest_io

    manifest_io.read(args.bundle)  # a missing or bad bundle: one line, before any process starts
    if args.load_order:
        return _load_order(args.bundle, args.load_order, args.small_pages, args.repeats, args.max_tokens)
    from sides import alternate

    runs = alternate(__file__, SIDES, args.repeats, [str(args.bundle), "--max-tokens", str(args.max_tokens)])
    for mode in ("plain", "speculative"):
        rates = {side: float(np.median([r[mode] for r in runs[side]])) for side in SIDES}
        print(f"{mode:12s} huge pages: {rates['huge']:6.1f} tok/s  4 KB pages: {rates['4 KB']:6.1f} tok/s  "
              f"({rates['huge'] / rates['4 KB']:.3f}x)")
    peaks = {side: float(np.median([r["peak_mb"] for r in runs[side]])) for side in SIDES}
    print(f"peak memory  huge pages: {peaks['huge']:6.1f} MB     4 KB pages: {peaks['4 KB']:6.1f} MB")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
