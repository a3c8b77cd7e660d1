"""Packed weights on 2 MB pages (the runtime's default on Linux >= 6.1) vs left on 4 KB pages, tokens/s interleaved in one run.

Usage: python scripts/huge_pages_ab.py BUNDLE [--repeats 3] [--max-tokens 64]
Four engines over BUNDLE, loaded in the order huge, 4 KB, 4 KB, huge (so that an effect of load
order, which two engines of one process showed before the collapse, falls on both sides alike);
each prompt (one per bench category, chat template when the bundle has one, EOS ignored) runs
plain and speculative on each, alternating the order every repeat. Prints each side's tokens/s
and the ratio.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def _engines(bundle: Path) -> list[tuple[str, object]]:
    from specdeploy.backends import onnxruntime as backend
    from specdeploy.runtime.engine import Engine

    collapse = backend.collapse_new
    engines = []
    for label in ("huge", "4 KB", "4 KB", "huge"):
        backend.collapse_new = collapse if label == "huge" else (lambda before: 0)
        engines.append((label, Engine(bundle)))
    backend.collapse_new = collapse
    return engines


def main() -> None:
    from specdeploy.config import GenerationConfig
    from specdeploy.prompts import BENCH_PROMPTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engines = _engines(args.bundle)
    chat = engines[0][1].tokenizer.chat_template is not None
    modes = {"plain": False, "speculative": None}
    totals = {(label, mode): [0, 0.0] for label in ("huge", "4 KB") for mode in modes}
    for repeat in range(args.repeats):
        for prompts in BENCH_PROMPTS.values():
            for label, engine in engines[:: 1 if repeat % 2 == 0 else -1]:
                ids = engine.encode_prompt([{"role": "user", "content": prompts[0]}] if chat else prompts[0])
                ids = ids[: engine.manifest.max_context - args.max_tokens]
                for mode, speculative in modes.items():
                    config = GenerationConfig(max_new_tokens=args.max_tokens, speculative=speculative, ignore_eos=True)
                    began = time.perf_counter()
                    tokens = engine.generate_ids(ids, config)
                    totals[label, mode][0] += len(tokens)
                    totals[label, mode][1] += time.perf_counter() - began
    for mode in modes:
        rates = {label: totals[label, mode][0] / totals[label, mode][1] for label in ("huge", "4 KB")}
        print(f"{mode:12s} huge pages: {rates['huge']:6.1f} tok/s  4 KB pages: {rates['4 KB']:6.1f} tok/s  "
              f"({rates['huge'] / rates['4 KB']:.3f}x)")


if __name__ == "__main__":
    from specdeploy.errors import run_script

    run_script(main)
