"""The K-quant operators' forms side by side on one core: ms a call over 1, 5 and 8 rows.

Usage: python lab/scripts/kernel_forms.py [--copies 60] [--k 1536] [--n 8960]
Builds specdeploy's operator library for this CPU (-march=native) and as the AVX2 form (Haswell),
and times q4_k_matmul / q5_k_matmul / q6_k_matmul over one K x N weight through ctypes, `--copies` copies in turn
so that nothing stays in cache (random bytes, zero scales: the time does not depend on them). What
an AVX2 machine's verify rows cost, measured on an AVX-512 one: the same instructions, not the same
core.
"""
from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

FORMS = {"native": None, "avx2": ("-O3", "-march=haswell", "-shared", "-fPIC", "-std=c11")}


def weights(rng, kind: str, k: int, n: int, copies: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`copies` (qs, scales) pairs of the operator's layout (kernels/q4_k_matmul.c, q6_k_matmul.c)."""
    q, scales = {"q4_k": (k * n // 2, n // 16 * k // 256 * 320), "q5_k": (n // 16 * k // 32 * 320, n // 16 * k // 256 * 320),
                 "q6_k": (n // 16 * k // 32 * 384, n // 16 * k // 256 * 288)}[kind]
    return [(rng.integers(0, 256, size=q, dtype=np.uint8), np.zeros(scales, np.uint8)) for _ in range(copies)]


def call_ms(entry, pairs, rows: int, k: int, n: int, repeats: int = 3) -> float:
    """The best of `repeats` sweeps over every copy, ms a call."""
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    x = np.random.default_rng(1).normal(size=(rows, k)).astype(np.float32)          # [rows, K]
    y = np.zeros((rows, n), np.float32)                                               # [rows, N]
    times = []
    for _ in range(repeats + 1):  # the first warms up
        began = time.perf_counter()
        for qs, sc in pairs:
            entry(pointer(x), ctypes.c_int64(rows), ctypes.c_int64(k), pointer(qs), pointer(sc), ctypes.c_int64(n),
                  pointer(y))
        times.append(time.perf_counter() - began)
    return 1000 * min(times[1:]) / len(pairs)


def main() -> None:
    from specdeploy import kernels

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=60)
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--n", type=int, default=8960)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    made = {kind: weights(rng, kind, args.k, args.n, args.copies) for kind in ("q4_k", "q5_k", "q6_k")}
    for form, flags in FORMS.items():
        lib = ctypes.CDLL(str(kernels.build(flags=flags or kernels.FLAGS)))
        for kind, pairs in made.items():
            cells = [f"{rows} rows {call_ms(getattr(lib, f'{kind}_matmul'), pairs, rows, args.k, args.n):.2f} ms"
                     for rows in (1, 5, 8)]
            print(f"{form} {kind}_matmul " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
