"""The physical limit of decoding on this machine: the weight bytes a one-row step must read,
divided by what the cores can read from memory a second.

At batch 1 a decoding step streams every weight once (the embedding's one row aside) and does
little work per byte, so tokens/s cannot pass read bandwidth ÷ weight bytes a token. `bench`
reports plain decoding's fraction of that, and a verify pass's cost over 1…8 rows in one-row
steps (what speculation's rows cost against that step).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

GATHERS = {"Gather", "GatherBlockQuantized"}  # read a row a token, not the table


def read_bandwidth(threads: int | None = None, size: int = 1 << 29, repeats: int = 5) -> float:
    """Bytes a second the process's CPUs read from memory: `threads` (default: every CPU it may
    run on) each OR-reducing its share of a `size`-byte array, the best of `repeats`. 512 MB, far
    past any cache. The reduction is the operator library's `read_bytes` where it is built (four
    load chains, 32 GB/s on two Xeon cores), NumPy's otherwise (its reduction is compute-bound
    on some CPUs: 17-26 GB/s on the same cores)."""
    from ..backends.base import usable_cpus

    threads = threads or usable_cpus()
    data = np.ones(size // 8, np.uint64)                                     # [size / 8], touched: resident
    reduce = _library_read() or np.bitwise_or.reduce
    parts = [part for part in np.array_split(data, threads * 4) if part.size]  # 32-byte multiples
    shares = [parts[i::threads] for i in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            began = time.perf_counter()
            list(pool.map(lambda share: [reduce(part) for part in share], shares))
            best = min(best, time.perf_counter() - began)
    return data.nbytes / best


def _library_read():
    """The operator library's read_bytes over a uint64 array (ctypes releases the GIL), or None."""
    import ctypes

    from .. import kernels

    path = kernels.library_path()
    if not path.is_file():
        return None
    entry = ctypes.CDLL(str(path)).read_bytes
    entry.restype, entry.argtypes = ctypes.c_uint64, (ctypes.c_void_p, ctypes.c_size_t)
    return lambda part: entry(part.ctypes.data, part.size // 4 * 32)


def bundle_weight_bytes(bundle: Path, manifest) -> int:
    """Bytes of weights a one-row step of `bundle` reads as the weights file stores them: every
    initializer its draft, verify and head graphs compute with, once (tied weights are stored once),
    less tables only gathered from. MatMulNBits packs its own copy at load (6 bits a weight at 4),
    so for its bundles this is less than what a step reads."""
    import onnx

    read: dict[tuple, int] = {}  # (offset in the weights file, or graph and name) -> bytes
    for name in ("draft", "verify", "head"):
        model = onnx.load(str(bundle / manifest.graphs[name].file), load_external_data=False)
        inits = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            for tensor in (inits[i] for i in node.input if i in inits and node.op_type not in GATHERS):
                place = {e.key: e.value for e in tensor.external_data}
                key = (place["offset"],) if "offset" in place else (name, tensor.name)
                read[key] = int(place["length"]) if "length" in place else len(tensor.raw_data)
    return sum(read.values())


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of a GGUF file's weights a one-row step reads: every tensor but a token embedding the
    file also has an output matrix for (then the embedding is only gathered from)."""
    import gguf

    tensors = gguf.GGUFReader(str(path)).tensors
    untied = any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if not (untied and t.name == "token_embd.weight"))


def roofline(weight_bytes: int, bandwidth: float, step_s: float) -> dict:
    """Plain decoding (a one-row step of `step_s` seconds) against the bandwidth's limit."""
    limit = bandwidth / weight_bytes
    return {"weight_gb": round(weight_bytes / 1e9, 3), "read_gb_s": round(bandwidth / 1e9, 1),
            "roofline_tok_s": round(limit, 1), "step_tok_s": round(1 / step_s, 1),
            "fraction": round(1 / step_s / limit, 3)}


def pass_costs(costs, rows: int = 8) -> dict[int, float]:
    """A full-depth pass over 1…`rows` rows in one-row steps, from a cost model (runtime/costs.py)."""
    return {r: round(costs.verify_s(0, r) / costs.verify_s(0, 1), 3) for r in range(1, rows + 1)
            if r in costs.layer_rows_s}
