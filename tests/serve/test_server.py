"""The server, started for real on loopback, driven by the official openai client and raw HTTP."""
import json
import signal
import time

import httpx
import pytest
from openai import OpenAI

from tests_serve_support import RunningServer

pytestmark = pytest.mark.integration  # servers, a browser, real models or every family: not the fast tier



def client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_completion_with_speculative_stats(server):
    r = client(server).completions.create(model="x", prompt="w3 w4 w5", max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    extra = r.model_extra
    assert {"draft_tokens", "accepted_tokens", "acceptance_rate", "tokens_per_round"} <= set(extra["speculative"])
    assert {"draft_n", "draft_n_accepted", "predicted_per_second"} <= set(extra["timings"])


def test_openai_chat_streaming_ends_with_stats(server):
    stream = client(server).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "w7 w8"}], max_tokens=20, temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.usage.completion_tokens >= 1
    assert "speculative" in final.model_extra
    plain = client(server).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "w7 w8"}], max_tokens=20, temperature=0,
        extra_body={"speculative": False})
    assert plain.choices[0].message.content == text  # greedy: speculation changes nothing
    assert plain.model_extra["speculative"]["draft_source"] == "plain"


def test_lookup_ngram_per_request_keeps_greedy_output(server):
    prompt = "w3 w4 w5 w3 w4 w5 w3 w4"
    plain = client(server).completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0,
                                              extra_body={"speculative": False})
    for ngram in ([1, 1], [2, 6]):
        r = client(server).completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0,
                                              extra_body={"draft_source": "lookup", "lookup_ngram": ngram})
        assert r.choices[0].text == plain.choices[0].text
        assert r.model_extra["speculative"]["draft_source"] == "lookup"
    models = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert models["lookup_ngram"] == [1, 4]


def test_raw_sse_format(server):
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "w3", "max_tokens": 5, "stream": True}) as r:
        lines = [l for l in r.iter_lines() if l]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(l.startswith("data: ") for l in lines)
    assert "drafted" in json.loads(lines[0][6:])["choices"][0]


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not valid JSON"),
    (json.dumps({"prompt": 5}), "'prompt' is required"),
    (json.dumps({}), "'prompt' is required"),
    (json.dumps({"prompt": "w3", "max_tokens": -1}), "max_tokens"),
    (json.dumps({"prompt": "w3", "max_tokens": "ten"}), "max_tokens"),
    (json.dumps({"prompt": "w3", "temperature": 9}), "temperature"),
    (json.dumps({"prompt": "w3", "n": 2}), "'n' must be 1"),
    (json.dumps({"prompt": "w3", "logprobs": 30}), "logprobs"),
    (json.dumps({"prompt": "w3", "logit_bias": {"5": 2}}), "not supported"),
    (json.dumps({"prompt": "w3", "max_tokens": 0}), "max_tokens"),
    (json.dumps({"prompt": "w3", "max_tokens": 0, "echo": True, "stream": True}), "cannot be streamed"),
    (json.dumps({"prompt": [3, 100000]}), "past this model's vocabulary"),
    (json.dumps({"prompt": ["w3", "w4"]}), "one prompt per request"),
    (json.dumps({"prompt": "w3", "min_p": 2}), "min_p"),
    (json.dumps({"prompt": "w3", "presence_penalty": 3}), "presence_penalty"),
    (json.dumps({"prompt": "w3", "frequency_penalty": "x"}), "frequency_penalty"),
    (json.dumps({"prompt": "w3", "repetition_penalty": 0}), "repetition_penalty"),
    (json.dumps({"prompt": "w3", "response_format": {"type": "xml"}}), "response_format"),
    (json.dumps({"prompt": "w3", "response_format": {"type": "json_schema"}}), "json_schema.schema"),
    (json.dumps({"prompt": "w3", "tools": []}), "belong to /v1/chat/completions"),
    (json.dumps({"prompt": "w3", "stop": [1]}), "stop"),
    (json.dumps({"prompt": "w3", "num_draft_tokens": 100}), "num_draft_tokens"),
    (json.dumps({"prompt": "w3", "draft_source": "medusa"}), "draft_source"),
    (json.dumps({"prompt": "w3", "lookup_ngram": 3}), "lookup_ngram"),
    (json.dumps({"prompt": "w3", "lookup_ngram": [4, 2]}), "lookup_ngram"),
    (json.dumps({"prompt": "w3", "lookup_ngram": [1, "x"]}), "lookup_ngram"),
    (json.dumps({"prompt": " ".join(["w3"] * 120), "max_tokens": 50}), "max context"),
    (json.dumps(["a list"]), "JSON object"),
])
def test_bad_requests_get_400_and_server_keeps_serving(server, body, fragment):
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and "Traceback" not in r.text
    assert httpx.get(server.url + "/health").status_code == 200


def test_chat_bad_messages(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user"}]})
    assert r.status_code == 400 and "content" in r.json()["error"]["message"]


def test_models_health_metrics_and_playground(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["exit_layer"] == 2
    httpx.post(server.url + "/v1/completions", json={"prompt": "w3", "max_tokens": 4})
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("specdeploy_requests_total", "specdeploy_spec_decode_num_draft_tokens_total",
                 "specdeploy_spec_decode_acceptance_rate", "specdeploy_time_to_first_token_seconds_sum",
                 "specdeploy_queue_depth", "specdeploy_errors_total"):
        assert name in metrics
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "/v1/chat/completions" in page.text and "drafted" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no external assets
    assert httpx.get(server.url + "/nope").status_code == 404


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_disconnect_cancels_generation_and_sigterm_exits_zero(long_bundle):
    """The client leaves after one chunk of a 4000-token generation: the server stops it early."""
    s = RunningServer(long_bundle, "--max-queue", "1")
    try:
        body = {"prompt": "w3", "max_tokens": 4000, "ignore_eos": True, "stream": True, "speculative": False}
        with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
            next(r.iter_lines())
        deadline, metrics = time.time() + 60, ""
        while time.time() < deadline:
            metrics = httpx.get(s.url + "/metrics").text
            if _metric(metrics, 'specdeploy_requests_finished_total{reason="cancelled"}'):
                break
            time.sleep(0.05)
        assert _metric(metrics, 'specdeploy_requests_finished_total{reason="cancelled"}') == 1, metrics
        assert _metric(metrics, 'specdeploy_requests_finished_total{reason="length"}') == 0
        produced = _metric(metrics, "specdeploy_cancelled_generation_tokens_total")
        assert 1 <= produced < 4000  # stopped early, not run to the end
        r2 = httpx.post(s.url + "/v1/completions", json={"prompt": "w3", "max_tokens": 2}, timeout=30)
        assert r2.status_code == 200  # the engine is free again
        assert s.stop(signal.SIGTERM) == 0
    finally:
        s.stop()


def test_sigint_exits_zero(tiny_bundle):
    s = RunningServer(tiny_bundle)
    assert s.stop(signal.SIGINT) == 0


def test_seeded_sampling_matches_the_runtime(server, tiny_bundle):
    from specdeploy.runtime.engine import Engine

    body = dict(model="x", prompt="w3 w9 w12", max_tokens=12, temperature=0.9, top_p=0.95, seed=42)
    served = client(server).completions.create(**body).choices[0].text
    streamed = "".join(c.choices[0].text for c in client(server).completions.create(stream=True, **body))
    with Engine(tiny_bundle) as engine:
        local = engine.generate("w3 w9 w12", max_new_tokens=12, temperature=0.9, top_p=0.95, seed=42).text
    assert served == local == streamed


def test_concurrent_clients_all_get_complete_answers(tiny_bundle):
    from concurrent.futures import ThreadPoolExecutor

    from specdeploy.runtime.engine import Engine

    s = RunningServer(tiny_bundle, "--max-queue", "8")
    try:
        prompts = [f"w{i} w{i + 1} w{i + 2}" for i in range(3, 11)]

        def ask(prompt):
            return client(s).completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0).choices[0].text

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, prompts))
        with Engine(tiny_bundle) as engine:
            expected = [engine.generate(p, max_new_tokens=16).text for p in prompts]
        assert answers == expected
    finally:
        s.stop()
