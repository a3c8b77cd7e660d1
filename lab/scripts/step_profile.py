"""Where a plain decode step's kernel time goes, by op type (ONNX Runtime's session profiling).

Usage: python lab/scripts/step_profile.py BUNDLE [--max-tokens 64] [--top 20]
Loads BUNDLE with profiling on in every session, decodes one prompt plainly (chat template if the
bundle has one, EOS ignored), and prints per op type the kernel microseconds a step, its share of
all kernel time, and how many such kernels a step runs. Profiling adds its own cost to every
kernel, the small ones most: read the counts and the large ops' shares, not absolute time.
"""
from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path


def profiled_engine(bundle: Path, prefix: str):
    """An Engine whose ONNX Runtime sessions write profiles under `prefix`."""
    import specdeploy.backends.onnxruntime as backend
    from specdeploy.runtime.engine import Engine

    plain = backend.session_options

    def with_profiling(*args, **kwargs):
        options = plain(*args, **kwargs)
        options.enable_profiling, options.profile_file_prefix = True, prefix
        return options

    backend.session_options = with_profiling
    try:
        return Engine(bundle)
    finally:
        backend.session_options = plain


def kernel_times(files: list[str]) -> tuple[collections.Counter, collections.Counter]:
    """(microseconds, kernels) by op type, over every node event in the profiles."""
    micros, kernels = collections.Counter(), collections.Counter()
    for path in files:
        for event in json.loads(Path(path).read_text()):
            if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                op = event["args"].get("op_name", "?")
                micros[op] += event["dur"]
                kernels[op] += 1
    return micros, kernels


def main() -> None:
    from specdeploy.config import GenerationConfig
    from specdeploy.prompts import BENCH_PROMPTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = profiled_engine(args.bundle, str(Path(tmp) / "step"))
        prompt = next(iter(BENCH_PROMPTS.values()))[0]
        ids = engine.encode_prompt([{"role": "user", "content": prompt}] if engine.manifest.chat_template else prompt)
        config = GenerationConfig(max_new_tokens=args.max_tokens, speculative=False, ignore_eos=True)
        steps = len(engine.generate_ids(ids[: engine.manifest.max_context - args.max_tokens], config))
        micros, kernels = kernel_times([stage.session.end_profiling() for stage in engine.model.stages.values()])
    total = sum(micros.values())
    print(f"{steps} plain steps (and the prefill), {total / steps:.0f} µs of kernels a step, "
          f"{sum(kernels.values()) / steps:.0f} kernels a step")
    for op, us in micros.most_common(args.top):
        print(f"{op:34s} {us / steps:8.1f} µs/step  {100 * us / total:5.1f}%  {kernels[op] / steps:6.1f} a step")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
