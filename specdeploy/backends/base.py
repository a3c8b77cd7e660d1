"""The stage protocol every backend implements (the decoding loop sees nothing else)."""
from __future__ import annotations

import os
from typing import Protocol

import numpy as np


class Stage(Protocol):
    """One graph, ready to run, with its layers' KV buffers bound to itself in place.

    `run` takes the small per-call inputs by name and returns the non-KV outputs by name. Returned
    arrays may be views into stage-owned buffers that the next call overwrites: copy what you keep.
    """

    name: str

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def kv_buffer(self, name: str) -> np.ndarray | None: ...

    def close(self) -> None: ...


class OutputBuffers:
    """Preallocated `[1, rows, width]` output buffers that grow on demand, so steps allocate nothing."""

    def __init__(self, widths: dict[str, int], rows: int, dtype=np.float32):
        self.widths, self.dtype = widths, dtype
        self.arrays = {n: np.empty((1, rows, w), dtype) for n, w in widths.items()}

    def views(self, rows: int) -> dict[str, np.ndarray]:
        for name, arr in self.arrays.items():
            if arr.shape[1] < rows:
                self.arrays[name] = np.empty((1, max(rows, 2 * arr.shape[1]), self.widths[name]), self.dtype)
        return {name: arr[:, :rows] for name, arr in self.arrays.items()}


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's CPU set, `taskset`), not the machine's count:
    one intra-op thread per CPU, as many as can run at once; more only spin against each other."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
