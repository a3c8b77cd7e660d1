"""The feature head's held-out acceptance against the training tokens it saw, on one machine.

Usage: python lab/scripts/feature_head_curve.py MODEL --data TRAIN.jsonl --held HELD.jsonl
           [--budgets 100000,300000] [--epochs 4] [--draft-vocab 4096] [--intermediate-size 768]
           [--freeze-lm-head] [--bundle BUNDLE]

`--bundle`: teacher-force with that bundle's graphs (exported with --features), as
`train-head --bundle` does, instead of the PyTorch model.

The target is teacher-forced once over the largest budget (cached as `train-head` caches it); each
budget trains a fresh head on that many leading positions for the same number of epochs and
replays greedy drafting over the target's own replies to the held-out prompts. Prints one line per
budget: acceptance per draft position, tau at gamma 4, training time.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path


def _report(steps: int):
    def report(step, loss, agree, eta):
        if step % 50 == 0:
            print(f"  step {step}/{steps} loss {loss:.3f} agree {' '.join(f'{a:.2f}' for a in agree)} "
                  f"ETA {eta / 60:.1f} min")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--held", type=Path, required=True)
    parser.add_argument("--budgets", default="100000,300000")
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--draft-vocab", type=int, default=4096)
    parser.add_argument("--intermediate-size", type=int, default=768)
    parser.add_argument("--held-prompts", type=int, default=32)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--freeze-lm-head", action="store_true",
                        help="keep the LM head and final norm at the target's own (EAGLE-1 froze its LM head)")
    parser.add_argument("--bundle", type=Path, default=None, help="teacher-force with this bundle's graphs")
    args = parser.parse_args()
    import torch

    from specdeploy.export.arch import load
    from specdeploy.export import train_head as pipeline
    from specdeploy.feature_head.data import Features, read_conversations, render
    from specdeploy.feature_head.evaluate import acceptance
    from specdeploy.feature_head.model import TokenEmbedding
    from specdeploy.feature_head.train import TrainConfig, train

    budgets = [int(b) for b in args.budgets.split(",")]
    torch.set_num_threads(torch.get_num_threads())
    model, tokenizer = load(args.model)
    config = pipeline.TrainHeadConfig(source=args.model, data=args.data, output=Path("/dev/null"), tokens=max(budgets),
                                      draft_vocab_size=args.draft_vocab, intermediate_size=args.intermediate_size,
                                      bundle=args.bundle)
    layers = pipeline.HeadConfig.for_target(model.config).feature_layers
    texts = [render(tokenizer, c) for c in read_conversations(args.data)]
    taught, generate, close = pipeline.choose_teacher(config, model, tokenizer, layers, print)
    started = time.perf_counter()
    every = pipeline._features(taught, tokenizer, config, texts, layers, print)
    print(f"features: {len(every):,} positions in {time.perf_counter() - started:.0f} s")
    held = read_conversations(args.held)[: args.held_prompts]
    replies, scored = pipeline._replies(generate, taught, tokenizer, held, layers, print)
    close()
    embed = TokenEmbedding(model)
    for budget in budgets:
        data = Features(**{f.name: getattr(every, f.name)[:budget] for f in dataclasses.fields(Features)})
        steps = max(50, int(args.epochs * len(data) / (8 * 256)))
        head = pipeline.new_head(model, dataclasses.replace(config, tokens=budget), data)
        if args.freeze_lm_head:
            head.lm_head.requires_grad_(False)
            head.norm.requires_grad_(False)
        started = time.perf_counter()
        head = train(head, embed, data, TrainConfig(steps=steps, ttt_steps=args.ttt_steps), report=_report(steps))
        took = time.perf_counter() - started
        measured = acceptance(head, embed, replies, 4, scored)
        print(f"{budget:>9,} tokens, {steps} steps, {took / 60:.1f} min: {measured.line()}")


if __name__ == "__main__":
    main()
