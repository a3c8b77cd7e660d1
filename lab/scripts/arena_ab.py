"""ONNX Runtime's CPU memory: one arena shared by the sessions (the runtime's default) vs an arena per
session vs none (glibc malloc); tokens/s and peak memory, alternated in one run.

Usage: python lab/scripts/arena_ab.py BUNDLE [--repeats 3] [--max-tokens 64] [--long-prompt TOKENS]
Each side runs in a process of its own (the shared arena belongs to the process, and two engines of
one process share its heap), the sides rotating order every repeat; each process decodes one
prompt per bench category (chat template when the bundle has one, EOS ignored) plain and
speculative, then, with --long-prompt, one prompt of that many tokens plain. Prints each side's
median tokens/s with its ratio to the default, the peak resident memory after the category
prompts (the spread over repeats: without an arena it moves between identical runs), and the
long prompt's peak and what stays resident after it.
"""
from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import numpy as np

SIDES = ("shared", "session", "none")
LABELS = {"shared": "shared arena (default)", "session": "arena per session", "none": "no arena (malloc)"}


def _rss_mb() -> float:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) / 1024


def _side(bundle: Path, side: str, max_tokens: int, long_prompt: int) -> None:
    """One process's measurement, as JSON on stdout."""
    import sides
    from specdeploy.config import GenerationConfig
    from specdeploy.runtime.engine import Engine

    sides.use_arena(side)
    with Engine(bundle) as engine:
        out = sides.mode_rates(engine, sides.category_prompts(engine, max_tokens), max_tokens)
        out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if long_prompt:
            ids = sides.long_prompt(engine, long_prompt)
            engine.generate_ids(ids, GenerationConfig(max_new_tokens=max_tokens, speculative=False))
            out["long_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out["long_after_mb"] = _rss_mb()
    print(json.dumps(out))


def _report(runs: dict, long_prompt: int) -> None:
    for mode in ("plain", "speculative"):
        rates = {side: float(np.median([r[mode] for r in runs[side]])) for side in SIDES}
        print(f"{mode:12s} " + "  ".join(f"{LABELS[s]}: {rates[s]:6.1f} tok/s ({rates[s] / rates['shared']:.3f}x)"
                                         for s in SIDES))
    for key, label in (("peak_mb", "peak memory"), ("long_peak_mb", f"{long_prompt}-token prompt peak"),
                       ("long_after_mb", "resident after it")):
        if key in runs[SIDES[0]][0]:
            print(f"{label:12s} " + "  ".join(
                f"{LABELS[s]}: {min(r[key] for r in runs[s]):6.1f}-{max(r[key] for r in runs[s]):6.1f} MB"
                for s in SIDES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--long-prompt", type=int, default=0, metavar="TOKENS")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return _side(args.bundle, args.side, args.max_tokens, args.long_prompt)
    from specdeploy.bundle import manifest as manifest_io
    from specdeploy.errors import ConfigError

    manifest = manifest_io.read(args.bundle)  # a missing or bad bundle: one line, before any process starts
    if args.long_prompt + args.max_tokens > manifest.max_context:
        raise ConfigError(f"--long-prompt {args.long_prompt} leaves no room for {args.max_tokens} new "
                         f"tokens in this bundle's {manifest.max_context}-token context; lower it")
    from sides import alternate

    runs = alternate(__file__, SIDES, args.repeats, [str(args.bundle), "--max-tokens", str(args.max_tokens),
                                                      "--long-prompt", str(args.long_prompt)])
    _report(runs, args.long_prompt)


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
