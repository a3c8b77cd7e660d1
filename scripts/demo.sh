#!/usr/bin/env bash
# The main job on the example model: set up, fetch, export at exit layer 8 (the GGUF's own int4;
# a bundle already there is kept when it is whole), generate with speculation.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/specdeploy ] || scripts/setup.sh
scripts/fetch_model.sh
. .venv/bin/activate
# the model card's sampling (temperature 0.2, top-p 0.9) and a light repetition penalty, recorded as the
# bundle's defaults: the GGUF carries none, and greedy decoding at 135M loops on its own sentences
specdeploy inspect engine.plan >/dev/null 2>&1 || specdeploy export --exit-layer 8 models/SmolLM2-135M-Instruct.Q4_1.gguf --output engine.plan --sampling temperature=0.2 --sampling top_p=0.9 --sampling repetition_penalty=1.1
specdeploy generate engine.plan "${1:-Write a short story about a robot who learns to paint.}" --max-tokens 128 --draft-source hybrid
