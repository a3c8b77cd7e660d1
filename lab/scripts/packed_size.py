"""How much anonymous memory each ONNX Runtime session of a bundle takes against the bytes of the
initializers its MatMulNBits and GatherBlockQuantized nodes read from the weights file.

Usage: python lab/scripts/packed_size.py BUNDLE
One session at a time, each in this process after the last is closed and the heap trimmed; the
weights file's pages are handed back after each load (as the runtime does), so what stays is what
the session copied or packed. Linux only (reads /proc/self/status).
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path


def anon_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("RssAnon:"))


def initializer_mb(path: Path) -> dict[str, float]:
    """{op type: MB of the initializers it reads} (an initializer read by two ops counts once, first)."""
    import numpy as np
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    sizes = {t.name: int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
             for t in model.graph.initializer}
    per_op, seen = collections.Counter(), set()
    for node in model.graph.node:
        for name in node.input:
            if name in sizes and name not in seen:
                seen.add(name)
                per_op[node.op_type] += sizes[name] / 2**20
    return dict(per_op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    args = parser.parse_args()
    import onnxruntime as ort

    from specdeploy.backends.onnxruntime import session_options
    from specdeploy.backends.residency import page_out, trim_heap
    from specdeploy.bundle import manifest as manifest_io

    manifest = manifest_io.read(args.bundle)
    for name, graph in manifest.graphs.items():
        path = args.bundle / graph.file
        sizes = initializer_mb(path)
        trim_heap()
        before = anon_mb()
        session = ort.InferenceSession(str(path), session_options(operators=tuple(manifest.operators)),
                                       providers=["CPUExecutionProvider"])
        trim_heap()
        page_out(args.bundle)
        grown = anon_mb() - before
        packed = sizes.get("MatMulNBits", 0.0)
        print(f"{name:8s} MatMulNBits initializers {packed:8.1f} MB, others "
              f"{ {k: round(v, 1) for k, v in sizes.items() if k != 'MatMulNBits'} }; "
              f"session anonymous +{grown:8.1f} MB"
              + (f" = {grown / packed:.2f}x MatMulNBits'" if packed else ""))
        del session


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
