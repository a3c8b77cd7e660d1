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
    CMAKE_ARGS="-DGGML_NATIVE=ON" $pip wheel --quiet --no-deps "llama-cpp-python==0.3.36" -w "$wheels" || exit 3
fi
$pip install --quiet --find-links "$wheels" "llama-cpp-python==0.3.36" || exit 3
$pip install --quiet -e ".[peers]" || exit 3
# ONNX Runtime GenAI's model builder imports a newer transformers than optimum-onnx allows: it runs
# from the main environment (.venv, scripts/setup.sh), which gets onnxruntime-genai for that alone
if [ -x .venv/bin/python ]; then
    .venv/bin/python -m pip install --quiet "onnxruntime-genai==0.18.0" || exit 3
fi
