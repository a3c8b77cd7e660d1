"""The OpenAI API's fields an edge application uses, through the real `openai` client: logprobs,
prompt logprobs (echo), content parts, max_completion_tokens, penalties, the API key and CORS."""
import httpx
import openai
import pytest

from tests_serve_support import RunningServer

pytestmark = pytest.mark.integration
KEY = "test-key-123"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def keyed(tiny_bundle):
    s = RunningServer(tiny_bundle, "--api-key", KEY, "--cors-origin", "http://app.local")
    yield s
    s.stop()


def chat_logprobs(client, **options):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w5 w6 w7"}], max_tokens=12,
                                       logprobs=True, top_logprobs=3, temperature=0, **options)
    return r.choices[0].logprobs.content


def test_chat_logprobs_are_the_same_with_and_without_speculation(client):
    plain = chat_logprobs(client, extra_body={"speculative": False})
    spec = chat_logprobs(client, extra_body={"draft_source": "early_exit", "num_draft_tokens": 3})
    assert len(plain) == len(spec) > 0
    for a, b in zip(plain, spec):
        assert a.token == b.token and abs(a.logprob - b.logprob) <= 1e-5
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        assert a.top_logprobs[0].token == a.token  # greedy: the most likely


def test_streamed_chat_logprobs_cover_every_token(client):
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w5"}], max_tokens=8,
                                            logprobs=True, temperature=0, stream=True, extra_body={"ignore_eos": True})
    entries = [e for chunk in stream if chunk.choices and chunk.choices[0].logprobs
               for e in chunk.choices[0].logprobs.content]
    assert len(entries) == 8


def test_echo_scores_the_prompt_as_loglikelihood_evaluations_ask(client):
    """lm-evaluation-harness's request: token ids, echo, max_tokens 1, logprobs 1: one entry a prompt
    token (the first None) and one for the generated token; a greedy token's top entry is its own value."""
    ids = [5, 9, 12, 30, 31]
    r = client.completions.create(model="m", prompt=[ids], echo=True, max_tokens=1, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
    assert lp.tokens[: len(ids)] == [f"w{i}" for i in ids]
    greedy = lp.token_logprobs[-1]
    assert max(lp.top_logprobs[-1].values()) == greedy
    only = client.completions.create(model="m", prompt=ids, echo=True, max_tokens=0, logprobs=2)
    assert only.choices[0].logprobs.token_logprobs == lp.token_logprobs[:-1]
    assert only.usage.completion_tokens == 0


def test_content_parts_and_max_completion_tokens(client):
    parts = [{"type": "text", "text": "w5 "}, {"type": "text", "text": "w6"}]
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}],
                                       max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError, match="text"):
        client.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}]}])


def test_penalties_change_the_output_and_bad_ones_are_refused(client):
    def text(**options):
        return client.completions.create(model="m", prompt="w5 w6", max_tokens=24, temperature=0,
                                         extra_body={"ignore_eos": True}, **options).choices[0].text
    assert text(frequency_penalty=2.0, presence_penalty=1.0) != text()
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        text(presence_penalty=5)


def test_a_second_turn_reuses_the_first(client):
    messages = [{"role": "user", "content": "w5 w6 w7 w8"}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "w9"}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
    # all but the generation prompt's marker, which this tiny template does not repeat in history
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_structured_output_with_a_tokenizer_llguidance_cannot_read_is_a_clear_400(client, server):
    with pytest.raises(openai.BadRequestError, match="cannot read this model's tokenizer"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w5"}],
                                       response_format={"type": "json_object"})
    assert httpx.get(server.url + "/health").status_code == 200


def test_the_api_key_is_asked_for_everywhere_but_health_and_the_page(keyed):
    assert httpx.get(keyed.url + "/v1/models").status_code == 401
    wrong = httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
    assert httpx.get(keyed.url + "/health").status_code == 200 and httpx.get(keyed.url + "/").status_code == 200
    lower = httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"bearer {KEY}"})
    assert lower.status_code == 200  # the scheme's case does not matter (RFC 7235)
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="m", prompt="w5", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_cors_answers_only_the_origins_given(keyed, server):
    preflight = {"Origin": "http://app.local", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(keyed.url + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.local"
    other = httpx.options(keyed.url + "/v1/chat/completions", headers={**preflight, "Origin": "http://evil.local"})
    assert "access-control-allow-origin" not in other.headers
    off = httpx.get(server.url + "/v1/models", headers={"Origin": "http://app.local"})
    assert "access-control-allow-origin" not in off.headers
