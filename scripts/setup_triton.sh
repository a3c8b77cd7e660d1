#!/usr/bin/env bash
# A local Triton Inference Server for CPU tests, from the PyPI wheel nvidia-pytriton (its real
# tritonserver binary and Python backend; PyTriton's own Python API is not used), cached in
# .cache/triton, plus .venv-triton: the environment Triton's Python stub imports specdeploy from.
# The stub is built against numpy 1.x, so that environment pins numpy<2 (the main .venv has 2.x).
# Exit 3: the wheel or packages could not be installed (the tests skip then, and only then).
set -euo pipefail
cd "$(dirname "$0")/.."
root=.cache/triton
py=${PYTHON:-python3}
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ ! -x "$root/tritonserver/bin/tritonserver" ]; then
    mkdir -p "$root"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m pip download --quiet --no-deps "nvidia-pytriton==0.7.0" -d "$tmp" \
        || { echo "cannot download the nvidia-pytriton wheel from the package index" >&2; exit 3; }
    "$py" -m zipfile -e "$tmp"/nvidia_pytriton-*.whl "$tmp/wheel"
    rm -rf "$root/tritonserver" "$root/libs"
    mv "$tmp/wheel/pytriton/tritonserver" "$root/tritonserver"
    mv "$tmp/wheel/nvidia_pytriton.libs" "$root/libs"
    chmod +x "$root/tritonserver/bin/tritonserver" "$root"/tritonserver/python_backend_stubs/*/triton_python_backend_stub
fi
mkdir -p "$root/backends/python"
install_file() {  # copy only when changed: a running tritonserver holds these files open
    cmp -s "$1" "$2/$(basename "$1")" || cp "$1" "$2/"
}
for f in "$root"/tritonserver/backends/python/*; do install_file "$f" "$root/backends/python"; done
install_file "$root/tritonserver/python_backend_stubs/$ver/triton_python_backend_stub" "$root/backends/python"
if [ ! -x .venv-triton/bin/python ]; then
    "$py" -m venv .venv-triton
    .venv-triton/bin/pip install --quiet "numpy<2" onnxruntime tokenizers jinja2 \
        || { rm -rf .venv-triton; echo "cannot install the Triton environment's packages" >&2; exit 3; }
fi
.venv-triton/bin/pip install --quiet --no-deps -e .
echo "triton ready: $root (Python $ver stub), environment .venv-triton"
