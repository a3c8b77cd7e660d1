#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: export the example model, build/run the GPU path, compare with
# ONNX Runtime on the CPU, print the table. Budget: under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --no-deps -e . 2>/dev/null || python3 -m pip install --quiet -e .
python3 -m pip install --quiet onnx onnxscript onnxruntime tokenizers jinja2 click transformers gguf accelerate
scripts/fetch_model.sh
[ -f gpu-check.plan/manifest.json ] || python3 -m specdeploy.cli export --exit-layer 8 --max-context 1024 \
    models/SmolLM2-135M-Instruct.Q4_1.gguf --precision fp32 --output gpu-check.plan
# int4 for the GPU targets (--target tensorrt): MatMulNBits for ONNX Runtime's CUDA provider and the
# DequantizeLinear form for TensorRT, attention op by op; each quantize prints whether every operator
# has a kernel on the target's table. The default folds the Q4_1 minima into the matmuls (zero
# points, K + K/32), --exact-offsets does not.
[ -f gpu-check-int4.plan/manifest.json ] || python3 -m specdeploy.cli quantize gpu-check.plan --precision int4 \
    --target tensorrt -o gpu-check-int4.plan
[ -f gpu-check-int4-exact.plan/manifest.json ] || python3 -m specdeploy.cli quantize gpu-check.plan \
    --precision int4 --exact-offsets --target tensorrt -o gpu-check-int4-exact.plan
python3 scripts/gpu_check.py gpu-check.plan gpu-check-int4.plan gpu-check-int4-exact.plan
