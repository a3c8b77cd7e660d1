"""Which passes bring pages of a bundle's weights file back into resident memory while decoding.

    python lab/scripts/embedding_pages.py BUNDLE [--tokens 10]

After load the runtime hands back the file pages the sessions packed (`residency.page_out`); what a
decode step reads from the file's mappings comes back. This runs draft passes of one token
repeated, then of --tokens distinct tokens, then verify passes and LM-head passes, and prints the
file-backed resident memory of the weights file (its smaps entries) after each: where the growth
comes from, and how much a distinct token costs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def resident_kb(name: str) -> int:
    """Resident KB of this process's mappings of files called `name`."""
    current, total = "", 0
    with open("/proc/self/smaps") as lines:
        for line in lines:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                current = fields[5] if len(fields) > 5 else ""
            elif fields[0] == "Rss:" and current.endswith("/" + name):
                total += int(fields[1])
    return total


def main() -> None:
    from specdeploy.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--tokens", type=int, default=10)
    args = parser.parse_args()
    with Engine(args.bundle) as engine:
        model, name = engine.model, engine.manifest.weights
        vocab = engine.manifest.model.vocab_size
        print(f"after load: {resident_kb(name):,} KB of {name} resident")
        for i in range(args.tokens):
            model.draft_pass([500 % vocab], i)
        print(f"{args.tokens} draft passes of one token: {resident_kb(name):,} KB")
        before = resident_kb(name)
        for i in range(args.tokens):
            model.draft_pass([(1000 + 997 * i) % vocab], args.tokens + i)
        grown = resident_kb(name) - before
        print(f"{args.tokens} draft passes of distinct tokens: {resident_kb(name):,} KB "
              f"({grown / args.tokens:,.0f} KB a distinct token)")
        hidden = model.draft_pass([500 % vocab], 2 * args.tokens)
        for _ in range(args.tokens):
            model.verify_pass(hidden, 2 * args.tokens)
        print(f"{args.tokens} verify passes: {resident_kb(name):,} KB")
        rows = np.random.default_rng(0).standard_normal((1, engine.manifest.model.hidden_size)).astype(np.float32)
        for _ in range(args.tokens):
            model.logits(rows)
        print(f"{args.tokens} LM-head passes: {resident_kb(name):,} KB")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
