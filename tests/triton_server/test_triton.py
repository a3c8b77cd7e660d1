"""A real Triton Inference Server (the nvidia-pytriton wheel's tritonserver) over `specdeploy triton`."""
import json
import shutil
import socket
import subprocess
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


@pytest.fixture(scope="module")
def triton(tiny_bundle, tmp_path_factory):
    setup = subprocess.run([str(ROOT / "scripts" / "setup_triton.sh")], capture_output=True, text=True)
    if setup.returncode != 0:
        pytest.skip(f"the nvidia-pytriton wheel could not be installed: {setup.stderr.strip().splitlines()[-1:]}")
    repo = tmp_path_factory.mktemp("triton") / "repo"
    result = CliRunner().invoke(main, ["triton", str(tiny_bundle), "-o", str(repo), "--instances", "2",
                                       "--threads", "1", "--max-queue", "8"])
    assert result.exit_code == 0, result.output
    http, grpc, metrics = _port(), _port(), _port()
    log = open(repo.parent / "tritonserver.log", "w")
    proc = subprocess.Popen([str(ROOT / "scripts" / "tritonserver.sh"), str(repo), "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--strict-model-config=true"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"tritonserver did not become ready: {(repo.parent / 'tritonserver.log').read_text()[-2000:]}")
        yield {"url": url, "metrics": f"http://127.0.0.1:{metrics}", "model": url + "/v2/models/specdeploy"}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


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
    assert str(model / "bundle") in (model / "config.pbtxt").read_text()
    shutil.rmtree(tmp_path / "repo")
