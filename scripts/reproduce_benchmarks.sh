#!/usr/bin/env bash
# Re-measure every figure in docs/benchmarks.md on this machine (about 45 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/specdeploy ] || scripts/setup.sh
scripts/fetch_model.sh
. .venv/bin/activate
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f engine.plan/manifest.json ] || specdeploy export --exit-layer 8 "$model" --output engine.plan
[ -f cal.plan/manifest.json ] || { time specdeploy calibrate "$model" --output cal.plan; } 2>&1 | tee docs/bench/calibration.log
specdeploy bench cal.plan --prompts-per-category 4 --repeats 3 --max-tokens 64 --compare --sweep \
    --model "$model" -o docs/bench
specdeploy bench engine.plan --quick --greedy-only -o docs/bench/uncalibrated-quick
for p in int8 fp16 fp8; do
    specdeploy quantize cal.plan --precision "$p" -o "cal-$p.plan" | tail -n 1 | tee "docs/bench/quality-$p.txt"
done
