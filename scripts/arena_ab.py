"""ONNX Runtime's CPU arena on vs off (the runtime's default), tokens/s interleaved in one run.

Usage: python scripts/arena_ab.py BUNDLE [--repeats 3] [--max-tokens 64]
Two engines over BUNDLE, one with the arena back on; each prompt (one per bench category, chat
template, 64 tokens, EOS ignored; prompts cut to fit the bundle's context) runs plain and speculative on both, alternating which goes first.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    from specdeploy.backends import onnxruntime as backend
    from specdeploy.config import GenerationConfig
    from specdeploy.prompts import BENCH_PROMPTS
    from specdeploy.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    default_options = backend.session_options

    def with_arena(*a, **k):
        options = default_options(*a, **k)
        options.enable_cpu_mem_arena = True
        return options

    engines = {"no arena (default)": Engine(args.bundle)}
    backend.session_options = with_arena
    engines["arena"] = Engine(args.bundle)
    backend.session_options = default_options
    modes = {"plain": False, "speculative": True}
    totals = {(e, m): [0, 0.0] for e in engines for m in modes}
    for repeat in range(args.repeats):
        for prompts in BENCH_PROMPTS.values():
            order = list(engines.items())[:: 1 if repeat % 2 == 0 else -1]
            for label, engine in order:
                ids = engine.encode_prompt([{"role": "user", "content": prompts[0]}])
                ids = ids[: engine.manifest.max_context - args.max_tokens]
                for mode, speculative in modes.items():
                    config = GenerationConfig(max_new_tokens=args.max_tokens, speculative=speculative, ignore_eos=True)
                    began = time.perf_counter()
                    tokens = engine.generate_ids(ids, config)
                    totals[label, mode][0] += len(tokens)
                    totals[label, mode][1] += time.perf_counter() - began
    for mode in modes:
        rates = {label: totals[label, mode][0] / totals[label, mode][1] for label in engines}
        base = rates["no arena (default)"]
        print(f"{mode:12s} " + "  ".join(f"{label}: {rate:6.1f} tok/s ({rate / base:.3f}x)" for label, rate in rates.items()))


if __name__ == "__main__":
    from specdeploy.errors import run_script

    run_script(main)
