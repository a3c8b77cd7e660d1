"""What a pass costs deep in the context: rows prefilled at position 0 against the same rows after a long history.

Usage: .venv/bin/python lab/scripts/prefill_depth.py BUNDLE [--depth 1405] [--repeats 7]

The chat turns a prefix reuse leaves (scripts/chat_turns.py) prefill their new message after the
whole history: each of its rows attends to every earlier one, and each decode step reads the whole
KV cache. Prints the median milliseconds of passes of 95, 78, 8 and 1 rows (with the LM head on the
last) at position 0 and at --depth.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specdeploy import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--depth", type=int, default=1405)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with Engine(args.bundle) as engine:
        model = engine.model
        vocab = engine.manifest.model.vocab_size
        tokens = [int(t) for t in np.random.default_rng(0).integers(min(100, vocab // 2), vocab, args.depth + 95)]
        model.prefill(tokens, 512)  # the history's KV rows

        def median_ms(rows: int, start: int) -> float:
            times = []
            for _ in range(args.repeats):
                began = time.perf_counter()
                model.logits(model.prefill(tokens[: start + rows], 512, start))
                times.append(time.perf_counter() - began)
            return 1000 * statistics.median(times)

        for rows in (95, 78, 8, 1):
            shallow, deep = median_ms(rows, 0), median_ms(rows, args.depth)
            print(f"{rows} rows: {shallow:.1f} ms at position 0, {deep:.1f} ms at {args.depth} ({deep / shallow:.2f}x)")


if __name__ == "__main__":
    main()
