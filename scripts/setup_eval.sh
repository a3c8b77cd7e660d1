#!/usr/bin/env bash
# .venv-eval: lm-evaluation-harness with its API extras (no torch, no transformers), apart from
# .venv so its pins never move specdeploy's. Its `local-completions` model evaluates a running
# `specdeploy serve` (docs/serving.md: "Evaluating with lm-evaluation-harness").
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-eval/bin/lm_eval ] && exit 0
python3 -m venv .venv-eval
.venv-eval/bin/python -m pip install --quiet --upgrade pip
.venv-eval/bin/python -m pip install --quiet "lm-eval[api]==0.4.13"
