"""One decoding thread behind a bounded FIFO queue.

The engine decodes one sequence at a time; requests wait their turn, a full queue is refused at
once (the route answers 429 with Retry-After), and a cancelled job stops at its next token.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..config import GenerationConfig
from ..runtime.stats import GenerationStats


class QueueFull(Exception):
    pass


@dataclass
class Job:
    ids: list[int]
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    output: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    stats: GenerationStats = field(default_factory=GenerationStats)
    prompt_top: int | None = None   # score the prompt first (echo with logprobs): alternatives a token
    generate: bool = True           # False: the prompt's logprobs alone (max_tokens 0)
    prompt_logprobs: list | None = None  # filled in before any piece is sent


DONE = object()


class Worker:
    """`on_finish(job)` runs for every job taken off the queue (done, cancelled or failed), before the
    request sees its end, so metrics are current when the response arrives."""

    def __init__(self, engine, max_queue: int = 8, on_finish: Callable[[Job], None] = lambda job: None):
        self.engine, self.on_finish = engine, on_finish
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self.busy = False
        self.current: Job | None = None
        self.thread = threading.Thread(target=self._run, name="specdeploy-decoder", daemon=True)
        self.thread.start()

    @property
    def depth(self) -> int:
        """Requests waiting plus the one decoding."""
        return self.jobs.qsize() + int(self.busy)

    def submit(self, job: Job) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel everything queued and the running job; end the thread after its current token."""
        if self.current is not None:
            self.current.cancel.set()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                self._send(job, DONE)
        self.jobs.put(None)
        self.thread.join(timeout_s)

    def _send(self, job: Job, item) -> None:
        job.loop.call_soon_threadsafe(job.output.put_nowait, item)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.busy, self.current = True, job
            try:
                self._decode(job)
            finally:
                self.busy, self.current = False, None

    def _decode(self, job: Job) -> None:
        end = DONE
        try:
            if job.cancel.is_set():  # its client left while it waited
                job.stats.finish_reason = "cancelled"
            else:
                if job.prompt_top is not None:
                    job.prompt_logprobs = self.engine.prompt_logprobs(job.ids, job.prompt_top)
                    job.stats.prompt_tokens = len(job.ids)
                pieces = self.engine.stream_ids(job.ids, job.config, job.stats) if job.generate else ()
                for piece in pieces:
                    if job.cancel.is_set():
                        job.stats.finish_reason = "cancelled"
                        break
                    self._send(job, piece)
        except Exception as exc:  # reported to the request, never kills the thread
            job.stats.finish_reason, end = "error", exc
        self.on_finish(job)
        self._send(job, end)
