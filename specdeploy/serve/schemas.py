"""Request validation for the OpenAI-compatible endpoints: every bad input becomes a 400 message."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import MAX_LOGPROBS, GenerationConfig, ResponseFormat
from ..constants import MAX_DRAFT_TOKENS, SOURCES
from ..errors import ConfigError

UNSUPPORTED = ("best_of", "suffix", "functions", "function_call", "logit_bias", "n_probs")
IGNORED = ("model", "user", "stream_options", "parallel_tool_calls", "store", "metadata")


class RequestError(ConfigError):
    """A request the server rejects with 400; the message says which field and why."""


@dataclass(frozen=True)
class Request:
    prompt: object            # str, token ids, or a list of chat messages
    config: GenerationConfig
    stream: bool
    chat: bool
    max_tokens_given: bool = True
    echo: bool = False        # completions: the prompt's text (and logprobs) before the output
    generate: bool = True     # False: max_tokens 0 with echo, the prompt's logprobs alone
    tools: bool = False       # chat: the reply is a tool call or an answer, in serve/tools.py's format


def _typed(body: dict, name: str, kinds, default=None, check=None, hint: str = ""):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RequestError(f"'{name}' must be {hint or kinds}, got a boolean")
    if not isinstance(value, kinds):
        raise RequestError(f"'{name}' must be {hint or kinds.__name__}, got {type(value).__name__}")
    if check is not None and not check(value):
        raise RequestError(f"'{name}'={value!r} is out of range: {hint}")
    return value


def _content(content) -> str:
    """A message's text: a string, or OpenAI's list of content parts (text parts only)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise RequestError("each message's 'content' must be a string or a list of {\"type\": \"text\", \"text\": ...} "
                       "parts (this model reads text only)")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' is required: a non-empty list of {role, content} objects")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError("each message needs a string 'role' and a string 'content'")
    out = []
    for m in messages:  # role and content only reach a template (tool calls: serve/tools.py renders them)
        content = "" if m.get("tool_calls") and m.get("content") is None else _content(m.get("content"))
        out.append({"role": m["role"], "content": content, **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})})
    return out


def _is_ids(value) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def _prompt(body: dict, chat: bool):
    if chat:
        return _messages(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _is_ids(prompt[0])):
        prompt = prompt[0]  # a batch of one
    if _is_ids(prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("'prompt' holds several prompts; this server takes one prompt per request")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' is required: a non-empty string or a list of token ids")
    return prompt


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of up to 4 non-empty strings")
    return tuple(stops)


def _response_format(body: dict) -> ResponseFormat | None:
    """OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                           "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}")
    if fmt["type"] != "json_schema":
        return ResponseFormat(fmt["type"])
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise RequestError("'response_format.json_schema.schema' must be a JSON Schema object")
    return ResponseFormat("json_schema", schema=spec["schema"])


def _logprobs(body: dict, chat: bool) -> int | None:
    """Alternatives a token's logprobs list, or None for no logprobs. Chat: logprobs (bool) and
    top_logprobs (0..20); completions: logprobs (0..20) as the legacy API."""
    if chat:
        wanted = _typed(body, "logprobs", bool, False, None, "true or false")
        top = _typed(body, "top_logprobs", int, None, lambda v: 0 <= v <= MAX_LOGPROBS, f"0..{MAX_LOGPROBS}")
        if top is not None and not wanted:
            raise RequestError("'top_logprobs' needs 'logprobs': true")
        return (top or 0) if wanted else None
    return _typed(body, "logprobs", int, None, lambda v: 0 <= v <= MAX_LOGPROBS, f"0..{MAX_LOGPROBS}")


def _max_tokens(body: dict, chat: bool, max_context: int, default: int) -> tuple[int | None, bool]:
    """(max_tokens, given): chat's max_completion_tokens wins over max_tokens; 0 only with echo."""
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    low = 0 if (not chat and body.get("echo") is True) else 1
    value = _typed(body, name, int, None, lambda v: low <= v <= max_context, f"{low}..{max_context}")
    return (min(default, max_context) if value is None else value), value is not None


def _number(body: dict, name: str, low: float, high: float, default=None):
    value = _typed(body, name, (int, float), default, lambda v: low <= v <= high, f"{low:g}..{high:g}")
    return None if value is None else float(value)


def parse(body, chat: bool, max_context: int, default_max_tokens: int = 256) -> Request:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0):
            raise RequestError(f"'{name}' is not supported by this server; remove it")
    prompt = _prompt(body, chat)
    response_format, tools = _response_format(body), False
    if body.get("tools") is not None or body.get("tool_choice") is not None:
        if not chat:
            raise RequestError("'tools' belong to /v1/chat/completions")
        if response_format is not None:
            raise RequestError("give 'tools' or 'response_format', not both")
        from .tools import prepare

        try:
            prompt, response_format = prepare(prompt, body.get("tools"), body.get("tool_choice"))
        except ConfigError as exc:
            raise RequestError(str(exc)) from None
        tools = response_format is not None
    if chat:
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    if _typed(body, "n", int, 1, lambda v: True, "an integer") != 1:
        raise RequestError("'n' must be 1: this server returns one choice per request")
    top_k = _typed(body, "top_k", int, None, lambda v: v >= -1, "an integer >= -1 (0 or -1 disables)")
    max_tokens, given = _max_tokens(body, chat, max_context, default_max_tokens)
    echo = not chat and _typed(body, "echo", bool, False, None, "true or false")
    try:
        config = GenerationConfig(
            max_new_tokens=max(1, max_tokens),
            temperature=_number(body, "temperature", 0, 2),
            top_p=_typed(body, "top_p", (int, float), None, lambda v: 0 < v <= 1, "(0, 1]"),
            top_k=None if top_k is None else max(top_k, 0),  # 0 / -1: off, over the bundle's default
            min_p=_number(body, "min_p", 0, 1),
            repetition_penalty=_number(body, "repetition_penalty", 0.01, 10),
            presence_penalty=_number(body, "presence_penalty", -2, 2, 0.0),
            frequency_penalty=_number(body, "frequency_penalty", -2, 2, 0.0),
            seed=_typed(body, "seed", int, None, lambda v: 0 <= v < 2**63, "0..2^63-1"),
            stop=_stop(body),
            speculative=_typed(body, "speculative", bool, None, None, "true or false"),
            num_draft_tokens=_typed(body, "num_draft_tokens", int, None,
                                    lambda v: 1 <= v <= MAX_DRAFT_TOKENS, f"1..{MAX_DRAFT_TOKENS}"),
            draft_source=_typed(body, "draft_source", str, None, lambda v: v in SOURCES, ", ".join(SOURCES)),
            lookup_ngram=_typed(body, "lookup_ngram", list, None, None, "[min, max], e.g. [2, 4]"),
            ignore_eos=_typed(body, "ignore_eos", bool, False, None, "true or false"),
            logprobs=_logprobs(body, chat),
            response_format=response_format,
        )
    except RequestError:
        raise
    except ConfigError as exc:
        raise RequestError(str(exc)) from None
    stream = _typed(body, "stream", bool, False, None, "true or false")
    if stream and not max_tokens:
        raise RequestError("'max_tokens': 0 (the prompt's logprobs alone) cannot be streamed; set 'stream': false")
    return Request(prompt, config, stream, chat, given, echo, max_tokens > 0, tools)
