#!/usr/bin/env bash
# Run the local tritonserver (scripts/setup_triton.sh) over a model repository written by
# `specdeploy triton`: scripts/tritonserver.sh REPO [tritonserver options, e.g. --http-port 8000]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo=$(cd "$1" && pwd); shift
root="$here/.cache/triton"
# the Python stub finds its interpreter's packages through PATH (.venv-triton first)
export PATH="$here/.venv-triton/bin:$PATH"
export LD_LIBRARY_PATH="$root/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$root/tritonserver/bin/tritonserver" --model-repository "$repo" --backend-directory "$root/backends" \
    --disable-auto-complete-config "$@"
