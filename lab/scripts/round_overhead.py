"""What the default drafter's per-round choices cost, between passes, while it decodes.

Usage: python lab/scripts/round_overhead.py BUNDLE [--category qa] [--prompts 4] [--max-tokens 64]
Greedy hybrid decoding of the category's bench prompts (chat template); the lookup search, the
copy-length pricing and the whole draft() call that ends in a plain step are timed where they
run, between passes (caches cold), and set against the mean round; then every kind of round
(source, rows verified, tokens emitted) with its count and mean time.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path


def _timed(owner, name: str, totals: dict, label: str) -> None:
    """Wrap owner.name so each call adds (1, seconds) under label; a draft() adds only None results."""
    inner = getattr(owner, name)

    def call(*args, **kwargs):
        began = time.perf_counter()
        result = inner(*args, **kwargs)
        if label != "draft() -> plain step" or result is None:
            totals[label][0] += 1
            totals[label][1] += time.perf_counter() - began
        return result

    setattr(owner, name, call)


def _by_kind(decoder_class, model, kinds: dict) -> None:
    """Time each round under (source, rows its verify pass carried, tokens it emitted)."""
    rounds, verify = decoder_class._round, model.verify_pass
    rows = [0]

    def counted_verify(hidden, start):
        rows[0] = len(hidden)
        return verify(hidden, start)

    def timed_round(self, *args):
        began = time.perf_counter()
        emitted, valid, pending = rounds(self, *args)
        kind = kinds[emitted.source, rows[0], len(emitted.tokens)]
        kind[0] += 1
        kind[1] += time.perf_counter() - began
        return emitted, valid, pending

    model.verify_pass, decoder_class._round = counted_verify, timed_round


def main() -> None:
    from specdeploy.config import GenerationConfig
    from specdeploy.prompts import BENCH_PROMPTS
    from specdeploy.runtime import copy_length, decoder, drafting
    from specdeploy.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--category", default="qa", choices=sorted(BENCH_PROMPTS))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    totals = defaultdict(lambda: [0, 0.0])
    _timed(drafting, "find_continuation", totals, "lookup search")
    _timed(copy_length.CopyLength, "choose", totals, "copy-length choice")
    _timed(drafting.HybridDrafter, "draft", totals, "draft() -> plain step")
    _timed(decoder.Decoder, "_round", totals, "round (all kinds)")
    engine = Engine(args.bundle)
    kinds = defaultdict(lambda: [0, 0.0])
    _by_kind(decoder.Decoder, engine.model, kinds)
    config = GenerationConfig(draft_source="hybrid", max_new_tokens=args.max_tokens)
    for prompt in BENCH_PROMPTS[args.category][: args.prompts]:
        ids = engine.encode_prompt([{"role": "user", "content": prompt}])
        engine.generate_ids(ids[: engine.manifest.max_context - args.max_tokens], config)
    count, seconds = totals["round (all kinds)"]
    mean_round = seconds / max(count, 1)
    for label, (calls, spent) in totals.items():
        mean = spent / max(calls, 1)
        print(f"{label:24s} {calls:6d} calls  {1e6 * mean:8.1f} us  {100 * mean / mean_round:6.2f}% of a round")
    print("rounds by kind: source, rows verified, tokens emitted")
    for (source, rows, emitted), (calls, spent) in sorted(kinds.items()):
        print(f"  {source:10s} {rows:2d} rows {emitted:2d} tokens {calls:6d} rounds  {1e3 * spent / calls:7.2f} ms")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
