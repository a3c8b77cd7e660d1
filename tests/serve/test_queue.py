"""Queue overflow, deterministically: the worker is held mid-generation while requests arrive."""
import pytest
import asyncio
import threading

import httpx

from specdeploy.serve.app import Server

pytestmark = pytest.mark.integration  # servers, a browser, real models or every family: not the fast tier


class HeldEngine:
    """The real engine, except that each generation waits until the test releases it."""

    def __init__(self, engine):
        self.engine, self.release, self.started = engine, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream_ids(self, ids, config, stats):
        self.started.set()
        assert self.release.wait(30), "the test never released the worker"
        yield from self.engine.stream_ids(ids, config, stats)


async def _wait_for(predicate, timeout=10.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_full_queue_gets_429_with_retry_after_and_waiting_requests_complete(tiny_engine):
    held = HeldEngine(tiny_engine)
    server = Server(held, "tiny", max_queue=1)

    async def scenario():
        transport = httpx.ASGITransport(app=server.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            body = {"prompt": "w3 w4", "max_tokens": 8, "temperature": 0}
            running = asyncio.create_task(client.post("/v1/completions", json=body))
            await _wait_for(held.started.is_set)                 # the worker holds request 1
            waiting = asyncio.create_task(client.post("/v1/completions", json=body))
            await _wait_for(lambda: server.worker.depth == 2)   # request 2 fills the queue
            refused = await client.post("/v1/completions", json=body)
            depth_then = server.worker.depth
            held.release.set()
            return refused, depth_then, await running, await waiting, (await client.get("/metrics")).text

    try:
        refused, depth, first, second, metrics = asyncio.run(scenario())
    finally:
        held.release.set()
        server.worker.stop()
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert "queue is full" in refused.json()["error"]["message"] and depth == 2
    assert first.status_code == second.status_code == 200
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]
    assert 'specdeploy_errors_total{kind="queue_full"} 1' in metrics
    assert 'specdeploy_requests_total{endpoint="/v1/completions",status="429"} 1' in metrics
