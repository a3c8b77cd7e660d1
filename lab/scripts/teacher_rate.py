"""Positions a second teacher-forcing the target both ways train-head can: the PyTorch model (fp32)
and the bundle's own graphs (`train-head --bundle`), interleaved text by text over the same texts.

Usage: python lab/scripts/teacher_rate.py MODEL BUNDLE --data CONVERSATIONS.jsonl [--positions 20000]

BUNDLE is MODEL exported with `--features`. Prints each teacher's positions a second, their ratio,
and how far the bundle's teaching is from the fp32 model's: the share of positions whose likeliest
next token agrees, and the median relative difference of the features.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--positions", type=int, default=20_000)
    args = parser.parse_args()
    if not (args.bundle / "manifest.json").is_file():
        sys.exit(f"error: {args.bundle}: not a bundle; export MODEL with --features first")
    from specdeploy.export.arch import load
    from specdeploy.feature_head.config import HeadConfig
    from specdeploy.feature_head.data import read_conversations, render
    from specdeploy.feature_head.teachers import BundleTeacher, TorchTeacher
    from specdeploy.runtime.engine import Engine

    model, tokenizer = load(args.model)
    layers = HeadConfig.for_target(model.config).feature_layers
    teachers = {"pytorch": TorchTeacher(model, layers)}
    seconds, positions, agree, spread = {"pytorch": 0.0, "bundle": 0.0}, 0, 0, []
    with Engine(args.bundle) as engine:
        teachers["bundle"] = BundleTeacher(engine.model, layers)
        for conversation in read_conversations(args.data):
            ids = tokenizer(render(tokenizer, conversation), add_special_tokens=False)["input_ids"][:512]
            if len(ids) < 4:
                continue
            out = {}
            for name, teacher in teachers.items():
                started = time.perf_counter()
                out[name] = teacher(ids, 16)
                seconds[name] += time.perf_counter() - started
            positions += len(ids)
            agree += int((out["pytorch"][1][:, 0] == out["bundle"][1][:, 0]).sum())
            scale = np.linalg.norm(out["pytorch"][0], axis=-1) + 1e-6
            spread.append(np.median(np.linalg.norm(out["bundle"][0] - out["pytorch"][0], axis=-1) / scale))
            if positions >= args.positions:
                break
    rates = {name: positions / s for name, s in seconds.items()}
    print(f"{positions:,} positions, {len(spread)} texts, interleaved text by text")
    print(f"pytorch (fp32): {rates['pytorch']:,.0f} positions/s; bundle's graphs: {rates['bundle']:,.0f} "
          f"positions/s ({rates['bundle'] / rates['pytorch']:.1f}×)")
    print(f"the bundle's likeliest next token is the fp32 model's at {agree / positions:.1%} of positions; "
          f"features differ by {np.median(spread):.1%} (median relative)")


if __name__ == "__main__":
    main()
