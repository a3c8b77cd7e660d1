#!/usr/bin/env bash
# .venv-peers: specdeploy's runtime beside the runtimes users compare it with, for `bench --compare`:
# ONNX Runtime GenAI (and its model builder), llama.cpp through llama-cpp-python, Optimum's
# ORTModelForCausalLM and Hugging Face transformers. A separate environment because optimum-onnx
# pins transformers < 4.58 while export (and ONNX Runtime GenAI's builder) need 5.x. llama-cpp-python is an sdist: it is built from
# source once (~15 minutes on 2 cores, native CPU flags) and the wheel cached in .cache/wheels.
# Exit 3: the peers could not be installed (the comparison then says so per peer).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
wheels=.cache/wheels
mkdir -p "$wheels"
if [ ! -x .venv-peers/bin/python ]; then
    "$py" -m venv .venv-peers
fi
pip=".venv-peers/bin/python -m pip"
$pip install --quiet --upgrade pip || exit 3
$pip install --quiet "torch==2.13.0" || exit 3
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python from source (cached in $wheels; ~15 min on 2 cores)" >&2
    # this CPU's instruction sets, but never AMX: on VMs whose kernel does not grant AMX tile state
    # (cpuinfo still lists amx_*), ggml's AMX matmul faults on its first ldtilecfg and takes the
    # whole benchmark process down; one-row decoding does not use AMX tiles anyway
    flags=$(grep -m1 '^flags' /proc/cpuinfo)
    has() { case " ${flags#*:} " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
    isa="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    isa="$isa -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c)"
    isa="$isa -DGGML_BMI2=$(has bmi2) -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_AVX512=$(has avx512f)"
    isa="$isa -DGGML_AVX512_VBMI=$(has avx512vbmi) -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)"
    CMAKE_ARGS="$isa" $pip wheel --quiet --no-cache-dir --no-deps "llama-cpp-python==0.3.36" -w "$wheels" || exit 3
fi
$pip install --quiet --find-links "$wheels" "llama-cpp-python==0.3.36" || exit 3
$pip install --quiet -e ".[peers]" || exit 3
# ONNX Runtime GenAI's model builder imports a newer transformers than optimum-onnx allows: it runs
# from the main environment (.venv, scripts/setup.sh), which gets onnxruntime-genai for that alone
if [ -x .venv/bin/python ]; then
    .venv/bin/python -m pip install --quiet "onnxruntime-genai==0.18.0" || exit 3
fi
