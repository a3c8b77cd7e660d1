#!/usr/bin/env bash
# Set up from scratch if needed, fetch the example model, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || scripts/setup.sh
scripts/fetch_model.sh
. .venv/bin/activate
exec python -m pytest -q "$@"
