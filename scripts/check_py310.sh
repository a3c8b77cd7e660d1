#!/usr/bin/env bash
# Python 3.10 (JetPack 6) check: a 3.10 virtualenv with ONNX Runtime 1.23 (the newest for 3.10)
# runs an opset-23 bundle with greedy speculative == plain and a chunked prefill equal to one pass, and
# refuses an opset-24 bundle in one line.
# Usage: scripts/check_py310.sh OPSET23_BUNDLE [OPSET24_BUNDLE]   (PYTHON310=/path/to/python3.10)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON310:-python3.10}
venv=${VENV310:-.venv310}
[ -x "$venv/bin/python" ] || { "$py" -m venv "$venv"; "$venv/bin/pip" install -q "onnxruntime==1.23.2" numpy tokenizers jinja2 click; }
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" - "$@" <<'PY'
import sys, onnxruntime
from specdeploy import Engine, GenerationConfig, SpecDeployError
print(f"Python {sys.version.split()[0]}, onnxruntime {onnxruntime.__version__}")
with Engine(sys.argv[1]) as e:
    ids = e.encode_prompt([{"role": "user", "content": "Name three colours."}])
    plain = e.generate_ids(ids, GenerationConfig(max_new_tokens=32, speculative=False))
    spec = e.generate_ids(ids, GenerationConfig(max_new_tokens=32, draft_source="hybrid"))
    print("greedy speculative == plain:", spec == plain)
    assert spec == plain
    from specdeploy.prompts import BENCH_PROMPTS
    text = " ".join(p for prompts in BENCH_PROMPTS.values() for p in prompts)
    n = min(600, e.manifest.max_context - 8)
    long = (e.encode_prompt(text) * 8)[:n]
    one, chunked = e.model.prefill(long, n).copy(), e.model.prefill(long, 64).copy()  # [1, H] each
    print(f"{n}-token prefill in chunks of 64 == one pass, bitwise:", bool((one == chunked).all()))
    assert (one == chunked).all()
if len(sys.argv) > 2:
    try:
        Engine(sys.argv[2])
    except SpecDeployError as exc:
        print("opset-24 bundle refused:", exc)
PY
