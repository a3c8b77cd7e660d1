#!/usr/bin/env bash
# Create .venv with specdeploy and everything export, serve, bench and the tests need (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# the CPU build of torch first, pinned, so nothing pulls a multi-GB CUDA build
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[export,serve,bench,test]"
# specdeploy's own int4 operator (--int4-kernel q4_0), compiled for this CPU; its header comes from
# Debian's libonnxruntime-dev when the system has none. Optional: everything else works without it.
.venv/bin/specdeploy build-kernels || echo "the q4_0 int4 kernel was not built (above); bundles made with --int4-kernel q4_0 need it"
