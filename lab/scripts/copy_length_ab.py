"""Priced lookup copies vs copying all a match offers, timed interleaved in one run, per category.

Usage: python lab/scripts/copy_length_ab.py BUNDLE [--prompts-per-category 2] [--max-tokens 64] [--repeats 2]
All run the bundle's default source (hybrid) at greedy and are checked identical to plain decoding;
"copy all" is the lookup behaviour before copies were priced, "pooled" the pricing before contested
matches (runtime/drafting.find_continuation) had acceptance classes of their own. Each mode keeps
its own measurements. Prints α / τ / speedup vs plain.
"""
from __future__ import annotations

import argparse

from specdeploy import Engine, GenerationConfig
from specdeploy.constants import MAX_DRAFT_TOKENS
from specdeploy.prompts import bench_prompts
from policies import CopyAll, Pooled
from specdeploy.runtime.copy_length import CopyLength
from specdeploy.runtime.timing import run_modes


class _Switch:
    """The engine, with the lookup length policy each mode's config asks for."""

    def __init__(self, engine: Engine, lengths: dict[int, CopyLength]):
        self.engine, self.lengths = engine, lengths
        self.lookup = engine.decoder.drafters["lookup"]
        self.length = self.lookup.length  # the default's

    def generate_ids(self, ids, config, stats):
        self.lookup.length = self.lengths.get(id(config), self.length)
        return self.engine.generate_ids(ids, config, stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--prompts-per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    base = dict(max_new_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    modes = {"plain": GenerationConfig(speculative=False, **base),
             "copy all": GenerationConfig(speculative=True, **base),
             "pooled": GenerationConfig(speculative=True, **base),
             "priced": GenerationConfig(speculative=True, **base)}
    totals = {name: [0, 0.0] for name in modes}
    with Engine(args.bundle) as engine:
        switch = _Switch(engine, {id(modes["copy all"]): CopyAll(), id(modes["pooled"]): Pooled()})
        for category, prompts in bench_prompts().items():
            ids = [engine.encode_prompt([{"role": "user", "content": p}])
                   for p in prompts[: args.prompts_per_category]]
            results = run_modes(switch, ids, modes, args.repeats)
            plain = results["plain"]
            if any(r.outputs != plain.outputs for r in results.values()):
                raise SystemExit(f"greedy speculative output differs from plain on {category}")
            for name, r in results.items():
                totals[name][0] += r.tokens
                totals[name][1] += r.tokens / r.tokens_per_second
            cells = [f"{name}: α {r.acceptance_rate:.2f} τ {r.tokens_per_round:.2f} "
                     f"{r.speedup_over(plain):.2f}×"
                     for name, r in results.items() if name != "plain"]
            print(f"{category:14s} plain {plain.tokens_per_second:5.1f} tok/s | " + " | ".join(cells), flush=True)
        rounds = switch.length.costs.seconds(MAX_DRAFT_TOKENS + 1)  # what the default's pricing saw
    rate = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    print("overall        " + " | ".join(f"{name} {rate[name] / rate['plain']:.2f}×" for name in modes))
    if rounds is not None:  # decayed mean seconds of a round by the rows it verified
        print("round ms by verify rows 1..5: " + " / ".join(f"{1e3 * t:.1f}" for t in rounds[:5]))


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
