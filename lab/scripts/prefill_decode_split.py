"""Where a bench prompt's time goes, ours against llama.cpp: the prefill and the decoded tokens apart.

Usage: .venv-peers/bin/python lab/scripts/prefill_decode_split.py BUNDLE MODEL.gguf [--max-tokens 64] [--repeats 2]

`bench --compare` divides each prompt's generated tokens by all its time, the prompt's prefill
included, so a runtime's tokens/s there mixes two speeds: the prefill (computed, many rows a
matmul) and decoding (streamed, one row). Here each runtime gets the bench's own prompt ids (the
first prompt of each category, chat template applied), interleaved prompt by prompt, greedy; ours
is timed for one token (the prefill and its first token) and for 1 + --max-tokens, llama.cpp to
its first token and then to --max-tokens more, its cache emptied before each prompt (the bench's
runner keeps the prefix shared with the prompt before, a few template tokens). Needs
llama-cpp-python (scripts/setup_peers.sh).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def ours(engine, ids: list[int], tokens: int) -> float:
    from specdeploy.config import GenerationConfig

    began = time.perf_counter()
    engine.generate_ids(ids, GenerationConfig(max_new_tokens=tokens, speculative=False, ignore_eos=True))
    return time.perf_counter() - began


def theirs(llm, ids: list[int], tokens: int) -> tuple[float, float]:
    """(seconds to the first token, seconds for the next `tokens`), greedy, as the bench's runner
    calls it but with the cache emptied first (no prefix kept from the prompt before)."""
    llm.reset()
    began = time.perf_counter()
    for n, _ in enumerate(llm.generate(ids, temp=0.0, top_k=1, reset=True), start=1):
        if n == 1:
            first = time.perf_counter()
        if n == tokens + 1:
            break
    return first - began, time.perf_counter() - first


def main() -> None:
    import llama_cpp

    from sides import category_prompts
    from specdeploy.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    engine = Engine(args.bundle)
    llm = llama_cpp.Llama(model_path=str(args.model), n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)
    prompts = category_prompts(engine, args.max_tokens + 1)
    ours(engine, prompts[0], 1)  # untimed: a cold first prefill outlasted the decode timed after it (negative ms)
    theirs(llm, prompts[0], 1)
    runs = {i: [] for i in range(len(prompts))}
    for _ in range(args.repeats):
        for i, ids in enumerate(prompts):
            first = ours(engine, ids, 1)
            decode = ours(engine, ids, args.max_tokens + 1) - first
            runs[i].append((first, decode, *theirs(llm, ids, args.max_tokens)))
    print(f"median of {args.repeats}; ms: prefill with the first token, then a decoded token")
    print("| prompt tokens | ours prefill | llama.cpp prefill | llama.cpp / ours | ours decode | llama.cpp decode | llama.cpp / ours |")
    print("|---|---|---|---|---|---|---|")
    for i, ids in enumerate(prompts):
        a, b, c, d = (statistics.median(r[j] for r in runs[i]) for j in range(4))
        b, d = b / args.max_tokens, d / args.max_tokens
        print(f"| {len(ids)} | {a * 1e3:.0f} | {c * 1e3:.0f} | {c / a:.2f}× | {b * 1e3:.1f} | {d * 1e3:.1f} | {d / b:.2f}× |")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
