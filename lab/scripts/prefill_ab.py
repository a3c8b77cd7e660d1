"""Chunked prefill: a long prompt's prefill speed and peak memory at several chunk sizes and in one
pass, alternated in one run.

Usage: python lab/scripts/prefill_ab.py BUNDLE [--prompt-tokens 1900] [--chunks 64,128,256,512] [--repeats 3]
Each chunk size runs in a process of its own (peak memory belongs to a process), the sizes rotating
order every repeat; each process loads the bundle, prefills a short prompt untimed, then prefills
the long prompt (every bench prompt's text repeated, chat template when the bundle has one) and
samples one token, plain. Prints each size's median prefill tokens/s with its ratio to one pass,
and its peak resident memory (the spread over repeats).
"""
from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import numpy as np

ONE_PASS = "one pass"


def _side(bundle: Path, side: str, prompt_tokens: int) -> None:
    """One process's measurement, as JSON on stdout."""
    from sides import long_prompt
    from specdeploy.config import GenerationConfig
    from specdeploy.runtime.engine import Engine
    from specdeploy.runtime.stats import GenerationStats

    chunk = prompt_tokens if side == ONE_PASS else int(side)
    with Engine(bundle, prefill_chunk=chunk) as engine:
        ids, config = long_prompt(engine, prompt_tokens), GenerationConfig(max_new_tokens=1, speculative=False)
        engine.generate_ids(ids[:32], config)  # warm
        stats = GenerationStats()
        engine.generate_ids(ids, config, stats)
    print(json.dumps({"tokens_s": prompt_tokens / stats.prefill_s,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _report(runs: dict) -> None:
    base = float(np.median([r["tokens_s"] for r in runs[ONE_PASS]]))
    for side, side_runs in runs.items():
        rate = float(np.median([r["tokens_s"] for r in side_runs]))
        peaks = [r["peak_mb"] for r in side_runs]
        label = side if side == ONE_PASS else f"chunk {side}"
        print(f"{label:10s} prefill {rate:7.1f} tok/s ({rate / base:.3f}x one pass)  "
              f"peak {min(peaks):6.1f}-{max(peaks):6.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--prompt-tokens", type=int, default=1900)
    parser.add_argument("--chunks", default="64,128,256,512", help="chunk sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return _side(args.bundle, args.side, args.prompt_tokens)
    from sides import alternate
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.errors import ConfigError

    manifest = manifest_io.read(args.bundle)  # a missing or bad bundle: one line, before any process starts
    if not 32 < args.prompt_tokens < manifest.max_context:
        raise ConfigError(f"--prompt-tokens {args.prompt_tokens} must be above 32 and below this bundle's "
                          f"{manifest.max_context}-token context")
    chunks = args.chunks.split(",")
    if not all(c.isdigit() and int(c) >= 1 for c in chunks):
        raise ConfigError(f"--chunks {args.chunks!r}: give chunk sizes as whole numbers >= 1, e.g. 128,256")
    sides = [str(int(c)) for c in chunks] + [ONE_PASS]
    _report(alternate(__file__, sides, args.repeats, [str(args.bundle), "--prompt-tokens", str(args.prompt_tokens)]))


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
