"""A real Triton Inference Server (the nvidia-pytriton wheel's tritonserver) over `specdeploy triton`."""
import contextlib
import functools
import json
import queue
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from specdeploy.cli import main
from specdeploy.runtime.engine import Engine

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def _setup() -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "setup_triton.sh")], capture_output=True, text=True)


def _setup_or_skip():
    """Skip only where the wheel cannot be installed (exit 3); any other set-up failure fails."""
    setup = _setup()
    if setup.returncode == 3:
        pytest.skip(f"the nvidia-pytriton wheel could not be installed: {setup.stderr.strip().splitlines()[-1:]}")
    assert setup.returncode == 0, f"scripts/setup_triton.sh failed: {setup.stderr[-2000:]}"


@contextlib.contextmanager
def running_triton(bundle, root: Path, *options):
    """`specdeploy triton BUNDLE` then a tritonserver over it on free loopback ports."""
    _setup_or_skip()
    repo = root / "repo"
    result = CliRunner().invoke(main, ["triton", str(bundle), "-o", str(repo), *options])
    assert result.exit_code == 0, result.output
    http, grpc, metrics = _port(), _port(), _port()
    log_path = root / "tritonserver.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(ROOT / "scripts" / "tritonserver.sh"), str(repo), "--http-port", str(http),
                                 "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                                 "--strict-model-config=true"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{http}"
        try:
            _wait_ready(proc, url, log_path)
            yield {"url": url, "metrics": f"http://127.0.0.1:{metrics}", "model": url + "/v2/models/specdeploy",
                   "grpc": f"127.0.0.1:{grpc}"}
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    # a request left without its final response keeps the model live until Triton's exit timeout
    # (30 s) ends the server with the model still loaded
    assert "successfully unloaded 'specdeploy'" in log_path.read_text(), f"the model never unloaded: {log_path}"


def _wait_ready(proc, url, log_path):
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"tritonserver did not become ready: {log_path.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def triton(tiny_bundle, tmp_path_factory):
    with running_triton(tiny_bundle, tmp_path_factory.mktemp("triton"), "--instances", "2", "--threads", "1",
                        "--max-queue", "8") as server:
        yield server


def _runtime_text(bundle, prompt, **options):
    with Engine(bundle) as engine:
        return engine.generate(prompt, **options).text


def _stream(triton, body):
    with httpx.stream("POST", triton["model"] + "/generate_stream", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    return events


def test_generate_and_generate_stream_equal_the_runtime(triton, tiny_bundle):
    body = {"text_input": "w3 w4 w5", "max_tokens": 16, "temperature": 0}
    expected = _runtime_text(tiny_bundle, "w3 w4 w5", max_new_tokens=16)
    r = httpx.post(triton["model"] + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    final = r.json()
    assert final["text_output"] == expected
    assert {"draft_tokens", "accepted_tokens", "acceptance_rate", "tokens_per_round"} <= set(final)
    assert final["draft_source"] == "hybrid" and final["completion_tokens"] == 16
    events = _stream(triton, {**body, "stream": True})
    assert len(events) > 2 and "".join(e["text_output"] for e in events) == expected
    assert "tokens_per_round" in events[-1] and "tokens_per_round" not in events[0]


def test_seeded_sampling_is_reproducible_and_matches_the_runtime(triton, tiny_bundle):
    body = {"text_input": "w3 w9 w12", "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 42}
    first = httpx.post(triton["model"] + "/generate", json=body, timeout=60).json()["text_output"]
    second = httpx.post(triton["model"] + "/generate", json=body, timeout=60).json()["text_output"]
    local = _runtime_text(tiny_bundle, "w3 w9 w12", max_new_tokens=12, temperature=0.9, top_p=0.95, seed=42)
    assert first == second == local


def test_plain_decoding_per_request(triton, tiny_bundle):
    body = {"text_input": "w7 w8", "max_tokens": 10, "temperature": 0, "speculative": False}
    final = httpx.post(triton["model"] + "/generate", json=body, timeout=60).json()
    assert final["draft_source"] == "plain" and final["draft_tokens"] == 0
    assert final["text_output"] == _runtime_text(tiny_bundle, "w7 w8", max_new_tokens=10)


def test_chat_messages_use_the_bundle_template(triton, tiny_bundle):
    messages = [{"role": "user", "content": "w9"}]
    body = {"messages": json.dumps(messages), "max_tokens": 8, "temperature": 0}
    final = httpx.post(triton["model"] + "/generate", json=body, timeout=60).json()
    assert final["text_output"] == _runtime_text(tiny_bundle, messages, max_new_tokens=8)


@pytest.mark.parametrize("body, fragment", [
    ({"max_tokens": 4}, "'text_input'"),
    ({"text_input": "w3", "max_tokens": -1}, "max_new_tokens=-1"),
    ({"text_input": "w3", "max_tokens": "ten"}, ""),
    ({"text_input": " ".join(["w3"] * 120), "max_tokens": 50}, "max context"),
    ({"text_input": "w3", "draft_source": "medusa"}, "draft_source"),
])
def test_bad_inputs_get_an_error_and_the_server_stays_ready(triton, body, fragment):
    r = httpx.post(triton["model"] + "/generate", json=body, timeout=60)
    assert r.status_code >= 400 and "error" in r.json() and fragment in r.json()["error"]
    assert httpx.get(triton["url"] + "/v2/health/ready").status_code == 200
    assert httpx.post(triton["model"] + "/generate", json={"text_input": "w3", "max_tokens": 2},
                      timeout=60).status_code == 200


def test_two_instances_serve_eight_concurrent_clients(triton, tiny_bundle):
    prompts = [f"w{i} w{i + 1} w{i + 2}" for i in range(3, 11)]

    def ask(prompt):
        body = {"text_input": prompt, "max_tokens": 16, "temperature": 0, "stream": True}
        return "".join(e["text_output"] for e in _stream(triton, body))

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, prompts))
    with Engine(tiny_bundle) as engine:
        assert answers == [engine.generate(p, max_new_tokens=16).text for p in prompts]


def test_manifest_probes_answer_on_a_real_server(triton):
    from specdeploy.triton.manifests import LIVE, READY

    assert httpx.get(triton["url"] + READY).status_code == httpx.get(triton["url"] + LIVE).status_code == 200


def test_metrics_and_strict_model_config(triton):
    metrics = httpx.get(triton["metrics"] + "/metrics").text
    assert "nv_inference_request_success" in metrics
    config = httpx.get(triton["model"] + "/config").json()
    assert config["model_transaction_policy"]["decoupled"] is True
    assert config["instance_group"][0]["count"] == 2


def test_repository_refuses_a_bad_bundle(tmp_path):
    result = CliRunner().invoke(main, ["triton", str(tmp_path / "none"), "-o", str(tmp_path / "repo")])
    assert result.exit_code == 1 and "is not a bundle" in result.output


def test_repository_with_a_copied_bundle(tiny_bundle, tmp_path):
    result = CliRunner().invoke(main, ["triton", str(tiny_bundle), "-o", str(tmp_path / "repo"), "--copy",
                                       "--name", "tiny"])
    assert result.exit_code == 0, result.output
    model = tmp_path / "repo" / "tiny"
    assert (model / "bundle" / "manifest.json").is_file() and (model / "1" / "model.py").is_file()
    assert 'key: "bundle" value: { string_value: "bundle" }' in (model / "config.pbtxt").read_text()
    shutil.rmtree(tmp_path / "repo")


# ----------------------------------------------------------------------------------- gRPC (tritonclient)
def _grpc_inputs(prompt: str, **values):
    import numpy as np
    import tritonclient.grpc as grpcclient

    kinds = {"max_tokens": ("INT32", np.int32), "temperature": ("FP32", np.float32), "stream": ("BOOL", bool),
             "ignore_eos": ("BOOL", bool), "speculative": ("BOOL", bool)}
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    inputs = [text]
    for name, value in values.items():
        kind, dtype = kinds[name]
        tensor = grpcclient.InferInput(name, [1], kind)
        tensor.set_data_from_numpy(np.array([value], dtype=dtype))
        inputs.append(tensor)
    return inputs


class GrpcStream:
    """One tritonclient gRPC stream; responses (or errors) arrive on a queue."""

    def __init__(self, address: str):
        import tritonclient.grpc as grpcclient

        self.client, self.responses = grpcclient.InferenceServerClient(address), queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def send(self, prompt: str, **values):
        self.client.async_stream_infer("specdeploy", _grpc_inputs(prompt, **values))

    def until_final(self, timeout=60) -> tuple[list[str], object]:
        pieces = []
        while True:
            result, error = self.responses.get(timeout=timeout)
            assert error is None, error
            pieces.append(result.as_numpy("text_output")[0].decode())
            if result.as_numpy("tokens_per_round") is not None:
                return pieces, result

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_grpc_streaming_with_tritonclient_equals_the_runtime(triton, tiny_bundle):
    stream = GrpcStream(triton["grpc"])
    try:
        stream.send("w3 w4 w5", max_tokens=16, temperature=0.0, stream=True)
        pieces, final = stream.until_final()
    finally:
        stream.close()
    assert len(pieces) > 2 and "".join(pieces) == _runtime_text(tiny_bundle, "w3 w4 w5", max_new_tokens=16)
    assert final.as_numpy("completion_tokens")[0] == 16 and final.as_numpy("draft_source")[0] == b"hybrid"


def _metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


@pytest.fixture(scope="module")
def held_triton(long_bundle, tmp_path_factory):
    """One instance with room for one waiting request, over a 4096-token context (bundle copied in)."""
    with running_triton(long_bundle, tmp_path_factory.mktemp("held"), "--instances", "1", "--threads", "1",
                        "--max-queue", "1", "--copy") as server:
        yield server


def _wait_metric(server, name, value, timeout=30, **labels):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _metric(httpx.get(server["metrics"] + "/metrics").text, name, **labels) == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name}{labels} never reached {value}")


def test_full_queue_is_refused_and_cancelled_streams_free_the_engine(held_triton):
    long = dict(max_tokens=4000, ignore_eos=True, stream=True, speculative=False, temperature=0.0)
    running, waiting = GrpcStream(held_triton["grpc"]), GrpcStream(held_triton["grpc"])
    try:
        running.send("w3", **long)
        running.responses.get(timeout=60)                                 # the engine is generating it
        waiting.send("w4", **long)
        _wait_metric(held_triton, "specdeploy_queue_depth", 1)          # the one waiting place is taken
        refused = httpx.post(held_triton["model"] + "/generate", json={"text_input": "w5", "max_tokens": 4},
                             timeout=30)
        assert refused.status_code >= 400 and "queue is full" in refused.json()["error"]
        running.close(cancel=True)                                      # client 1 leaves
        waiting.responses.get(timeout=60)                               # so client 2's generation starts
        waiting.close(cancel=True)
        _wait_metric(held_triton, "specdeploy_requests_finished_total", 2, reason="cancelled")
    finally:
        for stream in (running, waiting):
            with contextlib.suppress(Exception):
                stream.close()
    metrics = httpx.get(held_triton["metrics"] + "/metrics").text
    assert _metric(metrics, "specdeploy_requests_finished_total", reason="length") == 0  # none ran to the end
    assert _metric(metrics, "specdeploy_requests_finished_total", reason="queue_full") == 1
    assert _metric(metrics, "specdeploy_generation_tokens_total") < 2 * 4000
    ok = httpx.post(held_triton["model"] + "/generate", json={"text_input": "w5", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and ok.json()["completion_tokens"] == 4


def test_tensorrt_repository_puts_instances_on_the_gpu(tiny_bundle, tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["triton", str(tiny_bundle), "-o", str(tmp_path / "repo"), "--backend", "tensorrt"])
    assert result.exit_code == 0, result.output
    config = (tmp_path / "repo" / "specdeploy" / "config.pbtxt").read_text()
    assert "kind: KIND_GPU" in config and 'key: "backend" value: { string_value: "tensorrt" }' in config
    result = runner.invoke(main, ["triton", str(tiny_bundle), "-o", str(tmp_path / "r2"), "--backend", "tensorrt",
                                  "--threads", "2"])
    assert result.exit_code == 1 and "--threads is an ONNX Runtime setting" in result.output


def test_the_triton_client_example_streams(triton, tiny_bundle):
    example = ROOT / "examples" / "triton_client.py"
    out = subprocess.run([sys.executable, str(example), triton["grpc"], "w3 w4 w5"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text, summary = out.stdout.rsplit("\n", 2)[:2]
    assert text == _runtime_text(tiny_bundle, "w3 w4 w5", max_new_tokens=64)
    assert "tokens/round" in summary and "[hybrid]" in summary


def _documented_requests():
    """(endpoint, body) of every curl request docs/serving.md shows for Triton."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    found = re.findall(r"curl -sN? localhost:8000/v2/models/specdeploy/(generate(?:_stream)?) -d '(.+?)'", text)
    return [(endpoint, json.loads(body)) for endpoint, body in found]


def test_the_documented_requests_answer_with_text(triton, tiny_bundle):
    """What a user copies first works: each documented request gets text (the chat ones through the
    bundle's template, as the runtime renders them)."""
    requests = _documented_requests()
    assert len(requests) == 3 and any("messages" in body for _, body in requests)
    for endpoint, body in requests:
        if endpoint == "generate_stream":
            text = "".join(e["text_output"] for e in _stream(triton, body))
        else:
            r = httpx.post(triton["model"] + "/generate", json=body, timeout=60)
            assert r.status_code == 200, r.text
            text = r.json()["text_output"]
        if "messages" in body and body.get("temperature") == 0:
            assert text == _runtime_text(tiny_bundle, json.loads(body["messages"]), max_new_tokens=body["max_tokens"])
        assert text.strip(), (endpoint, body)
