"""Where an export's or a quantization's memory and time go: resident memory and seconds for each
step, the step that set the peak and the longest one.

Exporting holds the model in PyTorch, its traced graphs and the runtime's sessions in turn;
quantizing holds graphs, calibration feeds and Gram matrices. Which of them sets the peak decides
how large a model a machine can take; which one takes longest, where to look when a big model's
export is slow. Steps call `mark(step)` (a no-op unless a command is
`recording()`, as logging is a no-op without a handler); logged per step with -v, and the command's
summary names the peak and its step, and the longest step.
"""
from __future__ import annotations

import contextlib
import gc
import contextvars
import logging
import resource
import sys
import time
from typing import NamedTuple

log = logging.getLogger("specdeploy")


def _resident_mb() -> tuple[float, float]:
    """(resident now, peak so far) in MB: /proc on Linux, the peak alone elsewhere."""
    try:
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)
        return peak, peak


class Mark(NamedTuple):
    step: str
    resident_mb: float
    peak_mb: float
    seconds: float   # since the previous mark (or the log's start)


class MemoryLog:
    """Marks taken after each step; the peak is credited to the first step after which it was seen."""

    def __init__(self):
        self.marks: list[Mark] = []
        self._since = time.monotonic()

    def mark(self, step: str) -> None:
        """The readings after `step`, what it left first freed: its reference cycles collected (a
        quantized graph's protobuf, ~1 GB at 1.5B parameters, waits for the collector otherwise)
        and its freed heap handed back (glibc keeps freed pages), so the next step's peak does not
        stand on them."""
        from ..backends.residency import trim_heap

        gc.collect()
        trim_heap()
        resident, peak = _resident_mb()
        now = time.monotonic()
        seconds, self._since = now - self._since, now
        self.marks.append(Mark(step, resident, peak, seconds))
        log.info(f"memory after {step} ({seconds:,.1f} s): {resident:,.0f} MB resident, peak so far {peak:,.0f} MB")

    def summary(self) -> str:
        if not self.marks:
            return "peak resident memory not measured"
        peak = self.marks[-1].peak_mb
        step = next(m.step for m in self.marks if m.peak_mb >= peak)
        longest = max(self.marks, key=lambda m: m.seconds)
        return (f"peak resident memory {peak:,.0f} MB, reached while {step}; "
                f"the longest step {longest.step}, {longest.seconds:,.1f} s")


_current: contextvars.ContextVar[MemoryLog | None] = contextvars.ContextVar("memory_log", default=None)


def mark(step: str) -> None:
    """Mark the end of `step` in the command's memory log, if one is recording."""
    log = _current.get()
    if log is not None:
        log.mark(step)


@contextlib.contextmanager
def recording():
    """A memory log for the block; nested (quantizing inside an export), the outer one."""
    log = _current.get()
    if log is not None:
        yield log
        return
    log = MemoryLog()
    token = _current.set(log)
    try:
        yield log
    finally:
        _current.reset(token)


def available_bytes() -> int | None:
    """The memory the kernel says is available now (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
