"""Resident memory: what a loaded bundle keeps in RAM beyond the weights its kernels read.

Three things, each measured on the example (scripts/memory_breakdown.py, docs/benchmarks.md):
* ONNX Runtime maps a bundle's page-aligned external initializers straight from the weights file.
Kernels that prepack copy what they need at load; most release their mapped input then, but some
keep it mapped although no run reads it again (on x86, MatMulNBits packs its scales beside the
integers and still holds the original: 16 MB of the example's int4 bundle). Those pages are clean
copies of the file, so `madvise(MADV_PAGEOUT)` may drop them without changing a byte any kernel
sees: a page read later (an embedding row) is faulted back in from the file (`page_out`).
* Building a session frees what its optimizer and prepacking no longer need, but glibc keeps the
  freed heap pages (111 MB after the example's fp32 sessions); `trim_heap` returns them.
* After such frees, glibc may serve a large `np.zeros` from recycled heap and write every zero: the
  whole KV cache resident at once. `zeroed` maps fresh pages, resident only where rows are written.
Linux (glibc) only; elsewhere, or on kernels older than 5.4, nothing is released and nothing changes.
Pages of a file written moments ago stay dirty until written back and are not paged out (a bundle
just quantized holds more until then); pages a kernel still reads (int8's MatMulNBits reads some of
its mapped inputs every run) simply come back.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
from pathlib import Path

import numpy as np

MADV_PAGEOUT = 21  # linux/mman-common.h, Linux >= 5.4


def mapped_ranges(root: Path, maps: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """[start, end) of every mapping in this process of a file under `root`."""
    prefix = str(Path(root).resolve()).rstrip("/") + "/"  # not a sibling that shares the prefix
    ranges = []
    with open(maps) as lines:
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n").startswith(prefix):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def page_out(root: Path) -> int:
    """Advises the kernel to reclaim the pages of files under `root`; returns the bytes advised."""
    if not sys.platform.startswith("linux"):
        return 0
    libc, advised = _libc(), 0
    for start, end in mapped_ranges(root):
        if libc.madvise(start, end - start, MADV_PAGEOUT) != 0:
            return advised  # EINVAL: a kernel without MADV_PAGEOUT; the pages simply stay
        advised += end - start
    return advised


def trim_heap() -> None:
    """Returns the heap's free pages to the kernel (glibc's malloc_trim); a no-op elsewhere."""
    if sys.platform.startswith("linux"):
        trim = getattr(_libc(), "malloc_trim", None)
        if trim is not None:  # musl has none
            trim(0)


def zeroed(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array on its own anonymous mapping: pages become resident as they are first written."""
    dtype = np.dtype(dtype)
    nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype, int(np.prod(shape))).reshape(shape)
