#!/usr/bin/env bash
# Set up from scratch if needed, fetch the example model, run the whole test suite.
# The playground test drives Debian's chromium through Playwright: install it when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] && .venv/bin/python -c "import playwright, tritonclient.grpc, yaml" 2>/dev/null || scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
scripts/fetch_model.sh
scripts/fetch_gemma3.sh || echo "Gemma 3 270M could not be fetched: its end-to-end tests skip"
. .venv/bin/activate
exec python -m pytest -q "$@"
