"""Two lookup n-gram ranges timed interleaved in one run, per category (greedy, checked identical).

Usage: python lab/scripts/lookup_ngram_ab.py BUNDLE [--a 2 4] [--b 1 4] [--prompts-per-category 4]
       [--max-tokens 64] [--repeats 3]
Prints one line per category: α / τ / speedup vs plain for each range.
"""
from __future__ import annotations

import argparse

from specdeploy import Engine, GenerationConfig
from specdeploy.prompts import bench_prompts
from specdeploy.runtime.timing import run_modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--a", nargs=2, type=int, default=(2, 4))
    parser.add_argument("--b", nargs=2, type=int, default=(1, 4))
    parser.add_argument("--prompts-per-category", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = dict(max_new_tokens=args.max_tokens, temperature=0.0)
    ranges = {f"{a}..{b}": (a, b) for a, b in (args.a, args.b)}
    modes = {"plain": GenerationConfig(speculative=False, **base)}
    modes.update({name: GenerationConfig(draft_source="lookup", lookup_ngram=ngram, **base)
                  for name, ngram in ranges.items()})
    with Engine(args.bundle) as engine:
        for category, prompts in bench_prompts().items():
            ids = [engine.encode_prompt([{"role": "user", "content": p}])
                   for p in prompts[: args.prompts_per_category]]
            results = run_modes(engine, ids, modes, args.repeats)
            plain = results.pop("plain")
            if any(r.outputs != plain.outputs for r in results.values()):
                raise SystemExit(f"greedy lookup output differs from plain on {category}")
            cells = [f"lookup {name}: α {r.acceptance_rate:.2f} τ {r.tokens_per_round:.2f} "
                     f"{r.speedup_over(plain):.2f}×" for name, r in results.items()]
            print(f"{category:14s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
