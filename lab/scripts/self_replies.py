"""The target's own greedy replies to the first user turn of each conversation, as training text.

EAGLE and Medusa train on text the target itself generates: the head then learns the distribution
it will be asked to predict while drafting, not the one of the text's original author. Batched
Hugging Face generation, left-padded; writes `{"messages": [user, assistant]}` lines.

    python lab/scripts/self_replies.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
        data/conversations/sharegpt-train.jsonl -o data/conversations/self-replies.jsonl --count 2000
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdeploy.export.arch import load
from specdeploy.feature_head.data import read_conversations


def prompts(path: Path, count: int, skip: int) -> list[str]:
    out = []
    for conversation in read_conversations(path)[skip:]:
        if isinstance(conversation, list) and conversation[0]["role"] == "user" and conversation[0]["content"].strip():
            out.append(conversation[0]["content"][:1000])
        if len(out) == count:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = load(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = sorted(prompts(args.data, args.count, args.skip), key=lambda t: len(tokenizer(t)["input_ids"]))
    start, made = time.perf_counter(), 0
    with args.output.open("w") as out:
        for i in range(0, len(texts), args.batch):
            batch = texts[i:i + args.batch]
            rendered = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                      add_generation_prompt=True) for t in batch]
            enc = tokenizer(rendered, return_tensors="pt", padding=True, truncation=True, max_length=256,
                            add_special_tokens=False)
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=args.tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            for prompt, row in zip(batch, ids[:, enc["input_ids"].shape[1]:]):
                reply = tokenizer.decode(row, skip_special_tokens=True)
                made += int((row != tokenizer.pad_token_id).sum())
                out.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                                   {"role": "assistant", "content": reply}]}) + "\n")
            out.flush()
            rate = made / (time.perf_counter() - start)
            print(f"{i + len(batch)}/{len(texts)} prompts, {made:,} reply tokens, {rate:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
