"""Time to the first token of a long prompt: bundles against llama.cpp on the same file, interleaved.

Usage: .venv-peers/bin/python lab/scripts/first_token.py MODEL.gguf BUNDLE [BUNDLE ...] [--prompt-tokens 500] [--repeats 3]

The prompt is the bench's prose repeated to --prompt-tokens ids (the same ids for every runtime),
prefilled and one token sampled greedily; llama.cpp's cache is emptied before each run. What a
voice or chat product feels first. Needs llama-cpp-python (scripts/setup_peers.sh).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from prefill_decode_split import ours, theirs


def prompt_ids(engine, length: int) -> list[int]:
    from specdeploy import prompts

    text = " ".join(prompts.PASSAGES)
    ids = engine.tokenizer.encode(text)
    return (ids * (length // len(ids) + 1))[:length]


def main() -> None:
    import llama_cpp

    from specdeploy.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engines = {b.name: Engine(b) for b in args.bundles}
    ids = prompt_ids(next(iter(engines.values())), args.prompt_tokens)
    llm = llama_cpp.Llama(model_path=str(args.model), n_ctx=args.prompt_tokens + 64, n_threads=2, n_threads_batch=2,
                          verbose=False)
    times = {name: [] for name in [*engines, "llama.cpp"]}
    for repeat in range(args.repeats):
        for name, engine in (engines.items() if repeat % 2 == 0 else reversed(engines.items())):
            times[name].append(ours(engine, ids, 1))
        times["llama.cpp"].append(theirs(llm, ids, 0)[0])
    base = statistics.median(times["llama.cpp"])
    print(f"{len(ids)}-token prompt, median of {args.repeats}: seconds to the first token")
    print("| runtime | first token s | llama.cpp / it |")
    print("|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {statistics.median(seconds):.2f} | {base / statistics.median(seconds):.2f}× |")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
