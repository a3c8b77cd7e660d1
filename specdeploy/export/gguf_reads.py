"""One parse of a GGUF file per load.

transformers parses a GGUF file anew for its config, for its tokenizer and (twice) for its weights,
and each parse walks every metadata field: a vocabulary's tokens are one small memory-mapped read
each, so a 262k-token vocabulary (Gemma 3 270M) takes ~20 s a parse on a 2-core CPU and ~5 s for
SmolLM2's 49k: four parses were a third of Gemma 3's export. Inside `parsed_once()` every reader asked
for a file already parsed is that first reader. A reader only maps the file read-only, so sharing it
changes nothing that is read.

transformers imports `gguf.GGUFReader` when it loads (not when it is imported), which is what lets
the shared reader stand in for it here; `tests/export/test_gguf_reads.py` counts the parses of a
real load, so a transformers that stops doing so is noticed rather than slow.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Share one `gguf.GGUFReader` per file among every load inside the block (nested: the outer's)."""
    import gguf

    original = gguf.GGUFReader
    if getattr(original, "shares_parses", False):
        yield
        return
    readers: dict[tuple[str, str], object] = {}

    def shared(path, mode: str = "r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    shared.shares_parses = True
    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original
