"""How much of a bundle's shared weights file only its feature head reads.

    python lab/scripts/head_share.py BUNDLE

A tensor counts for the head when its bytes (offset and length in the shared file) are referenced
by the head's graphs (`feature_fc`, `feature_head`) and by no other graph: the embedding it shares
with the draft graph does not count.
"""
from __future__ import annotations

import sys
from pathlib import Path

import onnx

from specdeploy.bundle import io_names
from specdeploy.bundle import manifest as manifest_io


def references(path: Path) -> dict:
    """{(offset, length) or ("inline", name): bytes} of a graph's initializers."""
    out = {}
    for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
        where = {e.key: e.value for e in tensor.external_data}
        if "offset" in where:
            out[int(where["offset"]), int(where["length"])] = int(where["length"])
        else:
            out["inline", tensor.name] = len(tensor.raw_data)
    return out


def main() -> None:
    bundle = Path(sys.argv[1])
    manifest = manifest_io.read(bundle)
    head, rest = {}, {}
    for name, graph in manifest.graphs.items():
        (head if name in io_names.FEATURE_GRAPHS else rest).update(references(bundle / graph.file))
    own = sum(size for key, size in head.items() if key not in rest)
    total = (bundle / manifest.weights).stat().st_size
    print(f"feature head's own weights: {own / 1e6:.1f} MB of {total / 1e6:.1f} MB ({own / total:.1%})")


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
