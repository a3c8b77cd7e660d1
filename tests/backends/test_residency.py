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


def test_pages_faulted_back_after_page_out_come_one_at_a_time(tmp_path):
    """An embedding row read after its file's pages went brings back its own page, not the ~100 KB
    of read-ahead around it."""
    import os

    path = tmp_path / "weights.bin"
    np.random.default_rng(1).integers(0, 255, 16 << 20, dtype=np.uint8).tofile(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        os.fsync(f.fileno())  # clean pages: the kernel drops them from the page cache when paged out
        view = np.frombuffer(mapped, np.uint8)
        int(view.sum())
        if page_out(tmp_path) == 0:
            pytest.skip("this kernel has no MADV_PAGEOUT")
        before = resident_kb(path)
        rows = range(1 << 20, 15 << 20, 1 << 20)  # 14 rows 1 MB apart
        assert [int(view[row]) for row in rows] == [int(x) for x in np.fromfile(path, np.uint8)[list(rows)]]
        assert resident_kb(path) - before <= 8 * len(rows)  # KB: a 4 KB page each (two at most)
        del view


@linux
def test_an_int4_bundle_computes_the_same_bytes_once_its_pages_go(tiny_bundle, tmp_path, monkeypatch):
    """The int4 sessions' mapped weight pages are handed back and their passes stay bitwise equal."""
    from specdeploy.backends import onnxruntime as backend
    from specdeploy.quantization.quantize import QuantizeOptions, quantize

    bundle = quantize(tiny_bundle, tmp_path / "int4", QuantizeOptions("int4", report=False), echo=lambda line: None)
    m = manifest_io.read(bundle)
    monkeypatch.setattr(backend, "page_out", lambda root: 0)  # load without handing pages back
    model = SplitModel(m, backend.load_stages(bundle, m))
    before = model.draft_pass([3, 4, 5], 0).copy()  # [S, V]
    mapped = resident_kb((bundle / m.weights).resolve())
    advised = page_out(bundle)
    assert mapped > 0 and advised > 0
    assert resident_kb((bundle / m.weights).resolve()) < mapped
    assert np.array_equal(model.draft_pass([3, 4, 5], 0), before)


def huge_kb(start: int | None = None, besides: dict | None = None) -> int:
    """AnonHugePages of the mapping starting at `start`, or of every mapping not among `besides`
    (an `anonymous_regions()` snapshot), from /proc/self/smaps."""
    inside, total = False, 0
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            span = tuple(int(x, 16) for x in fields[0].split("-"))
            inside = span[0] == start if start is not None else span not in (besides or {})
        elif inside and fields[0] == "AnonHugePages:":
            total += int(fields[1])
    return total


def collapse_refused() -> str | None:
    """Why this kernel will not collapse a fully written 4 MB mapping into huge pages right now,
    or None when it does: no MADV_COLLAPSE before Linux 6.1, THP off, or no free huge page at the
    moment (ENOMEM: a fragmented or memory-limited machine)."""
    import ctypes
    import errno
    import os
    from pathlib import Path

    from specdeploy.backends.residency import HUGE_PAGE, MADV_COLLAPSE, _libc

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.is_file() or "[never]" in thp.read_text():
        return "transparent huge pages are off on this kernel"
    probe = np.frombuffer(mmap.mmap(-1, 3 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    probe[:] = 1
    aligned = -(-ctypes.addressof(ctypes.c_char.from_buffer(probe)) // HUGE_PAGE) * HUGE_PAGE
    if _libc().madvise(aligned, HUGE_PAGE, MADV_COLLAPSE) == 0:
        return None
    code = ctypes.get_errno()
    return f"this kernel ({os.uname().release}) refused MADV_COLLAPSE now: {errno.errorcode.get(code, code)}"


def dense_and_sparse_mappings():
    """16 MB written through, as malloc's large blocks are (the packed weights), and 16 MB of
    fresh zero pages written once a megabyte (a KV buffer)."""
    dense = np.frombuffer(mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    dense[:] = np.arange(dense.size) % 251
    sparse = zeroed((16 << 20,), np.uint8)
    sparse[::1 << 20] = 1
    return dense, sparse


@linux
def test_collapse_new_counts_what_it_collapsed_and_changes_no_byte_and_no_sparse_mapping():
    """Holds whether or not the kernel has huge pages to give: the count is of pages now huge,
    the bytes are the same, and a sparse mapping gains neither huge pages nor resident memory."""
    import ctypes

    from specdeploy.backends.residency import HUGE_PAGE, anonymous_regions, collapse_new

    before = anonymous_regions()
    dense, sparse = dense_and_sparse_mappings()
    sparse_at = ctypes.addressof(ctypes.c_char.from_buffer(sparse))
    sparse_huge, resident = huge_kb(sparse_at), rss_anon_kb()
    collapsed = collapse_new(before)
    assert collapsed % HUGE_PAGE == 0
    assert huge_kb(ctypes.addressof(ctypes.c_char.from_buffer(dense))) << 10 <= collapsed
    assert collapsed <= huge_kb(besides=before) << 10  # only mappings made since the snapshot
    assert huge_kb(sparse_at) == sparse_huge
    assert rss_anon_kb() - resident < 4 << 10  # KB: the sparse 16 MB stayed sparse
    assert np.array_equal(dense, np.arange(dense.size) % 251)
    assert collapse_new(None) == 0


@linux
def test_collapse_new_backs_resident_new_memory_with_huge_pages():
    """Where the kernel can collapse at all, the dense mapping's 2 MB-aligned part is collapsed."""
    import ctypes

    from specdeploy.backends.residency import anonymous_regions, collapse_new

    refused = collapse_refused()
    if refused:
        pytest.skip(refused)
    before = anonymous_regions()
    dense, _ = dense_and_sparse_mappings()
    assert collapse_new(before) >= 12 << 20
    assert huge_kb(ctypes.addressof(ctypes.c_char.from_buffer(dense))) >= 12 << 10
    assert np.array_equal(dense, np.arange(dense.size) % 251)


def test_collapse_new_goes_page_by_page_retries_a_busy_kernel_and_stops_on_one_without_collapse(monkeypatch):
    """A kernel out of huge pages refuses some 2 MB pages (ENOMEM) and collapses others; one busy
    (EAGAIN) is asked once more; one without MADV_COLLAPSE (EINVAL) is asked nothing further."""
    import ctypes
    import errno

    from specdeploy.backends import residency

    mb2 = residency.HUGE_PAGE
    answers = {3 * mb2: [errno.ENOMEM], 4 * mb2: [errno.EAGAIN, 0], 5 * mb2: [errno.EAGAIN, errno.EAGAIN]}
    calls = []

    class Libc:
        def madvise(self, start, length, advice):
            calls.append(start)
            assert length == mb2 and advice == residency.MADV_COLLAPSE
            code = answers[start].pop(0) if answers.get(start) else 0
            ctypes.set_errno(code)
            return -1 if code else 0

    monkeypatch.setattr(residency, "sys", type("Sys", (), {"platform": "linux"}))
    monkeypatch.setattr(residency, "_libc", lambda: Libc())
    fresh = {(2 * mb2 - 4096, 7 * mb2 + 4096): 5 * mb2 + 8192}  # pages 2..6 aligned inside
    monkeypatch.setattr(residency, "anonymous_regions", lambda: {**fresh, (0, mb2): mb2})
    assert residency.collapse_new({(0, mb2): mb2}) == 3 * mb2  # pages 2, 4 (retried), 6
    assert calls == [2 * mb2, 3 * mb2, 4 * mb2, 4 * mb2, 5 * mb2, 5 * mb2, 6 * mb2]
    calls.clear()
    answers[3 * mb2] = [errno.EINVAL]
    assert residency.collapse_new({}) == mb2 and calls == [2 * mb2, 3 * mb2]  # nothing after EINVAL


@linux
def test_rows_read_after_the_files_cached_pages_are_dropped_map_a_page_each(tmp_path):
    """Loading reads a whole file (sessions packing it), and the page cache may keep it in large
    folios whose every page a fault maps; once drop_cached has dropped them, an embedding row read
    through a randomly-advised mapping brings back its own page."""
    import os

    from specdeploy.backends.residency import MADV_RANDOM, _libc, drop_cached

    path = tmp_path / "weights.bin"
    np.random.default_rng(2).integers(0, 255, 16 << 20, dtype=np.uint8).tofile(path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())   # clean pages, which the page cache may drop
        f.read()               # cached, as loading leaves them
    drop_cached(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = np.frombuffer(mapped, np.uint8)
        address = view.ctypes.data
        _libc().madvise(address, len(view), MADV_RANDOM)
        before = resident_kb(path)
        rows = range(1 << 20, 15 << 20, 1 << 20)  # 14 rows 1 MB apart
        assert [int(view[row]) for row in rows] == [int(x) for x in np.fromfile(path, np.uint8)[list(rows)]]
        assert resident_kb(path) - before <= 8 * len(rows)  # KB: a 4 KB page each (two at most)
        del view
