#!/usr/bin/env bash
# Create .venv with specdeploy and everything export, serve, bench and the tests need (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# the CPU build of torch first, pinned, so nothing pulls a multi-GB CUDA build: a copy this
# machine's pip already finds (its --find-links), else PyTorch's CPU index, the standard way
python -m pip install --quiet --no-index "torch==2.13.0" 2>/dev/null \
    || python -m pip install --quiet "torch==2.13.0" --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
python -m pip install --quiet -e ".[export,serve,bench,test]"
# specdeploy's own int4 operators (the default int4 kernel), compiled for this CPU; their header
# comes from Debian's libonnxruntime-dev when the system has none. Without them (no C compiler)
# export makes MatMulNBits bundles instead, saying so.
.venv/bin/specdeploy build-kernels || echo "specdeploy's int4 operators were not built (above); int4 bundles use MatMulNBits"
