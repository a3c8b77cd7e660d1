"""Resident memory: what a loaded bundle keeps in RAM beyond the weights its kernels read.

Three things, each measured on the example (lab/scripts/memory_breakdown.py, lab/notes/benchmarks-history.md):
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

And one thing about speed: every decode step streams all the packed weights, which sit in 4 KB
pages of anonymous memory (transparent huge pages are usually `madvise`-only, and neither glibc nor
ONNX Runtime asks for them), so the walk through ~100+ MB costs a TLB miss every 4 KB. Once the
sessions are built, `collapse_new` asks the kernel to back the memory their load mapped, where it
is already (almost) all resident, with 2 MB pages (`MADV_COLLAPSE`, Linux >= 6.1; elsewhere
nothing changes): the same bytes, resident memory unchanged, plain int4 decoding 1.08-1.29x in
four runs on the example and Gemma 3 270M (lab/notes/benchmarks-history.md). Sparse mappings (the KV buffers,
shared anonymous maps) are left alone.
Pages of a file written moments ago stay dirty until written back and are not paged out (a bundle
just quantized holds more until then); pages a kernel still reads (int8's MatMulNBits reads some of
its mapped inputs every run) simply come back.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import mmap
import os
import sys
from pathlib import Path

import numpy as np

MADV_PAGEOUT = 21  # linux/mman-common.h, Linux >= 5.4
MADV_RANDOM = 1


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
    """Advises the kernel to reclaim the pages of files under `root`, and to read a page that is
    faulted back in alone (MADV_RANDOM): what comes back is an embedding row here and there, and
    the default read-ahead brought ~100 KB of the file in with each one (a 1.5B bundle decoding:
    141 MB of the file mapped again, 110 MB with this; the rest is the kernel mapping a fault's
    neighbours already in the page cache). Returns the bytes advised."""
    if not sys.platform.startswith("linux"):
        return 0
    libc, advised = _libc(), 0
    for start, end in mapped_ranges(root):
        if libc.madvise(start, end - start, MADV_PAGEOUT) != 0:
            return advised  # EINVAL: a kernel without MADV_PAGEOUT; the pages simply stay
        libc.madvise(start, end - start, MADV_RANDOM)
        advised += end - start
    return advised


def drop_cached(path: Path) -> None:
    """Drops the page cache's clean, unmapped pages of `path` (POSIX_FADV_DONTNEED); a no-op where
    the call is missing.

    Loading reads the whole weights file (sessions packing their weights), and the kernel caches
    what it read in large folios; a later fault on one of them (an embedding row, every new token)
    maps the whole folio into the process, about 1 MB a distinct token here
    (lab/scripts/embedding_pages.py). Dropped, a row's page is read back alone (MADV_RANDOM)."""
    if hasattr(os, "posix_fadvise") and Path(path).is_file():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


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


def read_anonymous(path: Path, spans: list[tuple[int, int]]) -> tuple[mmap.mmap, list[memoryview]]:
    """The file bytes [offset, offset + length) of each span, read into one private anonymous
    mapping asked for huge pages (MADV_HUGEPAGE; `collapse_new` finishes what the fault path did
    not): weights a kernel streams every step read through 2 MB pages, which a file's mapping here
    cannot have. Returns the mapping (keep it alive) and a view of each span, 64-byte aligned."""
    places, size = [], 0
    for _, length in spans:
        places.append(size)
        size += -(-length // 64) * 64
    region = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    views = []
    with open(path, "rb", buffering=0) as f:
        for (offset, length), place in zip(spans, places):
            view = memoryview(region)[place:place + length]
            f.seek(offset)
            done = 0
            while done < length:
                read = f.readinto(view[done:])
                if not read:
                    raise OSError(f"{path} ends before byte {offset + length}")
                done += read
            views.append(view)
    return region, views


MADV_COLLAPSE = 25  # linux/mman-common.h, Linux >= 6.1
HUGE_PAGE = 2 << 20


def anonymous_regions(smaps: str = "/proc/self/smaps") -> dict[tuple[int, int], int]:
    """{(start, end): resident bytes} of every private writable anonymous mapping (the heap's
    included); {} off Linux."""
    regions, current = {}, None
    if not sys.platform.startswith("linux"):
        return regions
    with open(smaps) as lines:
        for line in lines:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                named = len(fields) >= 6 and fields[5] != "[heap]"
                start, end = (int(x, 16) for x in fields[0].split("-"))
                private = fields[1].startswith("rw") and fields[1].endswith("p")
                current = (start, end) if private and not named else None
            elif current is not None and fields[0] == "Rss:":
                regions[current] = int(fields[1]) * 1024
    return regions


def collapse_new(before: dict, min_resident: float = 0.9) -> int:
    """Back with huge pages (`madvise(MADV_COLLAPSE)`) the anonymous memory mapped since `before`
    (an `anonymous_regions()` snapshot) that is already almost all resident: the packed weights
    every step streams through. Returns the bytes collapsed.

    One 2 MB page at a time: a kernel short of free huge pages (ENOMEM) or busy (EAGAIN, tried
    once more) refuses some and not others, and each one collapsed still speeds its reads."""
    if not sys.platform.startswith("linux") or before is None:
        return 0
    libc, collapsed = _libc(), 0
    for (start, end), resident in anonymous_regions().items():
        lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if (start, end) in before or hi <= lo or resident < min_resident * (end - start):
            continue
        for page in range(lo, hi, HUGE_PAGE):
            error = _collapse(libc, page)
            if error == errno.EINVAL:  # a kernel without MADV_COLLAPSE
                return collapsed
            collapsed += HUGE_PAGE if error == 0 else 0
    return collapsed


def _collapse(libc: ctypes.CDLL, page: int) -> int:
    """0 when the 2 MB page at `page` is now a huge page, else the errno (EAGAIN retried once)."""
    for _ in range(2):
        if libc.madvise(page, HUGE_PAGE, MADV_COLLAPSE) == 0:
            return 0
        error = ctypes.get_errno()
        if error != errno.EAGAIN:
            return error
    return error
