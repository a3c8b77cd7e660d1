#!/usr/bin/env bash
# Set up from scratch if needed, fetch the example model, lint, run the test suite: the default set,
# or with --long also the end-to-end runs of minutes each (fetching Gemma 3 270M for them).
# docs/testing.md lists the tiers (`-m unit`: the fast one, under two minutes).
# The playground test drives Debian's chromium through Playwright, and the Arm form of specdeploy's
# kernels is tested cross-built under qemu: their Debian packages are installed when missing and
# this runs as root (otherwise those tests skip, saying what to install). The kernels are the
# default int4 path, so a library that fails to build fails this script.
# Two workers, a test file each at a time (pytest-xdist): exports and the reference models are
# mostly single-threaded Python, so the second core is otherwise idle through much of the suite;
# a file's session fixtures (the example model's export) stay on one worker. Files go out in
# collection order (tests/conftest.py puts the end-to-end ones first and gives each worker its
# own CPU), not xdist's by-test-count order. `-n 0` runs serially.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] && [ -x .venv/bin/ruff ] && .venv/bin/python -c "import playwright, tritonclient.grpc, xdist, yaml, jsonschema, llguidance" 2>/dev/null || scripts/setup.sh
wanted=""
command -v chromium >/dev/null 2>&1 || wanted="chromium"
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1 \
    || wanted="$wanted gcc-aarch64-linux-gnu qemu-user"
if [ -n "$wanted" ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq $wanted >/dev/null
    else
        echo "not root: $wanted not installed; their tests skip (apt-get install $wanted)" >&2
    fi
fi
if command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
    export SPECDEPLOY_ARM_TEST=required  # installed: the Arm kernel test must run, not skip
fi
scripts/fetch_model.sh
scripts/setup_eval.sh   # lm-evaluation-harness in .venv-eval, for its end-to-end test against serve
.venv/bin/specdeploy build-kernels
case " $* " in *" --long "*)  # the long tier's Gemma 3 end-to-end tests
    scripts/fetch_gemma3.sh || echo "Gemma 3 270M could not be fetched: its end-to-end tests skip" ;;
esac
. .venv/bin/activate
ruff check specdeploy tests scripts examples lab   # the rules: pyproject.toml [tool.ruff]
exec python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
