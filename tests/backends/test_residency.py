"""Handing back a mapped weight file's pages keeps every byte a kernel reads and frees the memory."""
import mmap
import sys

import numpy as np
import pytest

from specdeploy.backends.residency import mapped_ranges, page_out, trim_heap, zeroed
from specdeploy.bundle import manifest as manifest_io
from specdeploy.runtime.split_model import SplitModel

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def resident_kb(path) -> int:
    """Rss of this process's mappings of `path`, from /proc/self/smaps."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) == 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def rss_anon_kb() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon:"))


@linux
def test_zeroed_buffers_are_resident_only_where_written():
    before = rss_anon_kb()
    kv = zeroed((1, 4, 4096, 1024), np.float32)  # 64 MB
    assert kv.shape == (1, 4, 4096, 1024) and kv.dtype == np.float32 and not kv.any()
    kv[0, :, :2] = 1.0  # two positions of each head: 4 x 8 KB
    assert rss_anon_kb() - before < 4 << 10  # KB: far below the 64 MB an eager zeroing writes
    assert kv.sum() == 4 * 2 * 1024


@linux
def test_trim_heap_returns_freed_heap_pages():
    """Small blocks freed below a live one stay resident until the heap is trimmed."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(1000) for _ in range(60_000)]  # ~60 MB of heap
    for block in blocks:
        ctypes.memset(block, 1, 1000)
    pinned = libc.malloc(1000)  # keeps the heap's top from shrinking on its own
    for block in blocks:
        libc.free(block)
    before = rss_anon_kb()
    trim_heap()
    assert before - rss_anon_kb() > 30 << 10  # KB
    libc.free(pinned)


def test_mapped_ranges_keeps_only_files_under_the_root(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f0000000000-7f0000010000 r--p 00000000 08:01 11 {tmp_path}/bundle/weights.bin\n"
        f"7f0000020000-7f0000030000 r--p 00010000 08:01 11 {tmp_path}/bundle/weights.bin\n"
        f"7f0000040000-7f0000050000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n"
        f"7f0000050000-7f0000060000 r--p 00000000 08:01 13 {tmp_path}/bundle-old/weights.bin\n"
        "7f0000060000-7f0000070000 rw-p 00000000 00:00 0 \n")
    assert mapped_ranges(tmp_path / "bundle", str(maps)) == [
        (0x7F0000000000, 0x7F0000010000), (0x7F0000020000, 0x7F0000030000)]


@linux
def test_page_out_releases_resident_pages_and_keeps_their_bytes(tmp_path):
    data = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8)  # 8 MB
    path = tmp_path / "weights.bin"
    data.tofile(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = np.frombuffer(mapped, np.uint8)
        assert int(view.sum()) == int(data.sum())  # every page touched
        before = resident_kb(path)
        advised = page_out(tmp_path)
        if advised == 0:
            pytest.skip("this kernel has no MADV_PAGEOUT")
        after = resident_kb(path)
        assert advised == 8 << 20 and before >= 8 << 10 and after < before / 4
        assert np.array_equal(view, data)  # faulted back in from the file, unchanged
        del view


@linux
def test_an_int4_bundle_computes_the_same_bytes_once_its_pages_go(tiny_bundle, tmp_path, monkeypatch):
    """The int4 sessions' mapped weight pages are handed back and their passes stay bitwise equal."""
    from specdeploy.backends import onnxruntime as backend
    from specdeploy.quantization.quantize import quantize

    bundle = quantize(tiny_bundle, tmp_path / "int4", "int4", report=False, echo=lambda line: None)
    m = manifest_io.read(bundle)
    monkeypatch.setattr(backend, "page_out", lambda root: 0)  # load without handing pages back
    model = SplitModel(m, backend.load_stages(bundle, m))
    before = model.draft_pass([3, 4, 5], 0).copy()  # [S, V]
    mapped = resident_kb((bundle / m.weights).resolve())
    advised = page_out(bundle)
    assert mapped > 0 and advised > 0
    assert resident_kb((bundle / m.weights).resolve()) < mapped
    assert np.array_equal(model.draft_pass([3, 4, 5], 0), before)


def huge_kb(start: int) -> int:
    """AnonHugePages of the mapping starting at `start`, from /proc/self/smaps."""
    inside = False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            inside = int(fields[0].split("-")[0], 16) == start
        elif inside and fields[0] == "AnonHugePages:":
            return int(fields[1])
    return 0


def collapse_supported() -> bool:
    import os
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    return release >= (6, 1) and thp.is_file() and "[never]" not in thp.read_text()


@linux
def test_collapse_new_backs_resident_new_memory_with_huge_pages_and_keeps_its_bytes():
    """A mapping made after the snapshot and fully written is collapsed (same bytes, 2 MB pages);
    one written only here and there (a KV buffer) is left alone, so nothing becomes resident."""
    import ctypes

    from specdeploy.backends.residency import anonymous_regions, collapse_new

    before = anonymous_regions()
    dense = np.frombuffer(mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)  # as malloc's
    dense[:] = np.arange(dense.size) % 251
    sparse = zeroed((16 << 20,), np.uint8)
    sparse[::1 << 20] = 1
    sparse_resident = rss_anon_kb()
    if not collapse_supported():
        pytest.skip("this kernel has no MADV_COLLAPSE (Linux >= 6.1) or no transparent huge pages")
    collapsed = collapse_new(before)
    assert collapsed >= 12 << 20  # the 2 MB-aligned part of the dense mapping
    assert huge_kb(ctypes.addressof(ctypes.c_char.from_buffer(dense))) >= 12 << 10
    assert huge_kb(ctypes.addressof(ctypes.c_char.from_buffer(sparse))) == 0
    assert rss_anon_kb() - sparse_resident < 4 << 10  # KB: the sparse 16 MB stayed sparse
    assert np.array_equal(dense, np.arange(dense.size) % 251)
    assert collapse_new(None) == 0
