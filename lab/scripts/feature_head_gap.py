"""Where a trained feature head's acceptance stops: its training text against held-out text.

Replays greedy drafting (gamma 4) over three sets with one head: conversations it was trained on,
held-out conversations of the same source (both teacher-forced as written), and the model's own
greedy replies to held-out prompts (what `train-head` reports). A gap between the first two is
generalisation (more text helps); a gap between the last two is the kind of text.

    python lab/scripts/feature_head_gap.py models/SmolLM2-135M-Instruct.Q4_1.gguf heads/smollm2-300k \
        --train data/conversations/sharegpt-train.jsonl --held data/conversations/sharegpt-held.jsonl
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("head", type=Path)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--held", type=Path, required=True)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=8000)
    args = parser.parse_args()
    import torch

    from specdeploy.export.arch import load
    from specdeploy.export.train_head import _replies, torch_replies
    from specdeploy.feature_head import eagle3
    from specdeploy.feature_head.data import FeatureConfig, read_conversations, render, teacher_force
    from specdeploy.feature_head.evaluate import acceptance
    from specdeploy.feature_head.model import FeatureHead, TokenEmbedding
    from specdeploy.feature_head.teachers import TorchTeacher

    model, tokenizer = load(args.model)
    config, tensors = eagle3.read(args.head)
    head = FeatureHead(config)
    head.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    head.eval()
    embed = TokenEmbedding(model)
    settings = FeatureConfig(config.feature_layers, max_total_tokens=args.tokens)
    for name, path in (("training text", args.train), ("held-out text", args.held)):
        texts = [render(tokenizer, c) for c in read_conversations(path)[: args.conversations]]
        data = teacher_force(TorchTeacher(model, config.feature_layers), tokenizer, texts, settings)
        print(f"{name} ({len(data):,} positions): {acceptance(head, embed, data, 4).line()}", flush=True)
    held = read_conversations(args.held)[: args.conversations // 2]
    replies, scored = _replies(torch_replies(model, tokenizer, 64, "cpu"), TorchTeacher(model, config.feature_layers),
                               tokenizer, held, config.feature_layers, print)
    print(f"the model's greedy replies to held-out prompts: {acceptance(head, embed, replies, 4, scored).line()}")


if __name__ == "__main__":
    main()
