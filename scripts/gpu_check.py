"""GPU check: export -> (build) -> generate on the GPU -> compare with ONNX Runtime on the CPU.

Prints a short table per bundle (fp32, and the int4 one with its TensorRT form): tokens/s plain vs
speculative, acceptance, the max logit difference of the GPU path against the CPU bundle, and
whether the GPU graphs are bitwise row-independent (runtime.row_check). Uses native TensorRT when
`tensorrt` imports (int4/int8 from the DequantizeLinear form), else ONNX Runtime's CUDA provider
(MatMulNBits) when onnxruntime-gpu is installed; says which it could not run. On the GPU every
decoding pass carries one padded row count (Engine's fixed_rows, the GPU default: docs/gpus.md), so
"greedy identical" there checks the identity rule on this GPU.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

from specdeploy.prompts import PASSAGES
from specdeploy.config import GenerationConfig
from specdeploy.errors import SpecDeployError
from specdeploy.runtime import row_check
from specdeploy.quantization.quality import teacher_forced_logits
from specdeploy.runtime.engine import Engine

PROMPTS = ["Explain why the sky is blue.", f"Summarise in two sentences:\n\n{PASSAGES[0]}"]


def gpu_route() -> tuple[str, str] | None:
    try:
        import tensorrt  # noqa: F401

        return "tensorrt", "cuda"
    except ImportError:
        pass
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return "onnxruntime", "cuda"
    return None


MAX_NEW_TOKENS = 96  # tokens a measured generation (--max-tokens)


def measure(engine: Engine) -> dict:
    out = {}
    for name, cfg in (("plain", GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, speculative=False)),
                      ("speculative", GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, draft_source="hybrid"))):
        tokens = seconds = drafted = accepted = 0
        for prompt in PROMPTS:
            result = engine.generate([{"role": "user", "content": prompt}], cfg)
            tokens += result.stats.generated_tokens
            seconds += result.stats.decode_s + result.stats.prefill_s
            drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
        out[name] = (tokens / seconds, accepted / drafted if drafted else 0.0)
    return out


def gpu_row(cpu_bundle: Path, route, ids, reference):
    backend, provider = route
    gpu_bundle = cpu_bundle.with_name(cpu_bundle.name + "-gpu")
    shutil.rmtree(gpu_bundle, ignore_errors=True)
    shutil.copytree(cpu_bundle, gpu_bundle)
    if backend == "tensorrt":
        from specdeploy.backends.tensorrt.build import build_engines

        began = time.time()
        build_engines(gpu_bundle)
        print(f"{cpu_bundle.name}: engines built in {time.time() - began:.0f} s")
    with Engine(gpu_bundle, backend=backend, provider=provider) as gpu:
        diff = float(np.abs(teacher_forced_logits(gpu, ids) - reference).max())
        rows = row_check.check_model(gpu.model, provider)
        return f"gpu {backend}/{provider}", measure(gpu), diff, row_check.describe(rows)


def check(bundle: str, route) -> list:
    cpu_bundle = Path(bundle)
    with Engine(cpu_bundle) as cpu:
        ids = cpu.encode_prompt(PASSAGES[1])
        reference = teacher_forced_logits(cpu, ids)
        rows = [("cpu onnxruntime", measure(cpu), 0.0, row_check.describe(row_check.check_model(cpu.model)))]
    if route is not None:
        try:
            rows.append(gpu_row(cpu_bundle, route, ids, reference))
        except SpecDeployError as exc:  # e.g. graphs not row-independent on this GPU: the finding
            print(f"{cpu_bundle.name} on the GPU: {exc}")
    return rows


def main(bundles: list[str]) -> int:
    route = gpu_route()
    if route is None:
        print("no TensorRT and no onnxruntime-gpu here: only the CPU rows could be measured")
    print("| bundle | path | plain tok/s | speculative tok/s | acceptance | max |logit diff| vs CPU | rows |")
    print("|---|---|---|---|---|---|---|")
    for bundle in bundles:
        for name, m, diff, rows in check(bundle, route):
            print(f"| {Path(bundle).name} | {name} | {m['plain'][0]:.1f} | {m['speculative'][0]:.1f} | "
                  f"{m['speculative'][1]:.2f} | {diff:.2e} | {rows} |")
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="*", default=["engine.plan"], help="bundles to check (default engine.plan)")
    parser.add_argument("--max-tokens", type=int, default=MAX_NEW_TOKENS, help="tokens a generation (default 96)")
    args = parser.parse_args()
    MAX_NEW_TOKENS = args.max_tokens
    try:
        sys.exit(main(args.bundles))
    except SpecDeployError as exc:  # a bundle that is not there or not whole: one line, not a traceback
        sys.exit(f"error: {exc}")
