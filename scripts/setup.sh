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
