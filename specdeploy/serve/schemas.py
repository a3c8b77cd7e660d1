"""Request validation for the OpenAI-compatible endpoints: every bad input becomes a 400 message."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import GenerationConfig
from ..constants import MAX_DRAFT_TOKENS, SOURCES
from ..errors import ConfigError

UNSUPPORTED = ("logprobs", "top_logprobs", "best_of", "echo", "suffix", "tools", "tool_choice",
               "functions", "function_call", "logit_bias", "response_format", "n_probs")
ZERO_ONLY = ("frequency_penalty", "presence_penalty")
IGNORED = ("model", "user", "stream_options", "parallel_tool_calls", "store", "metadata")


class RequestError(ConfigError):
    """A request the server rejects with 400; the message says which field and why."""


@dataclass(frozen=True)
class Request:
    prompt: object            # str or list of chat messages
    config: GenerationConfig
    stream: bool
    chat: bool
    max_tokens_given: bool = True


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


def _prompt(body: dict, chat: bool):
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' is required: a non-empty list of {role, content} objects")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise RequestError("each message needs a string 'role' and a string 'content'")
        return messages
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' is required: a non-empty string")
    return prompt


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of up to 4 non-empty strings")
    return tuple(stops)


def parse(body, chat: bool, max_context: int, default_max_tokens: int = 256) -> Request:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0):
            raise RequestError(f"'{name}' is not supported by this server; remove it")
    for name in ZERO_ONLY:
        if body.get(name) not in (None, 0, 0.0):
            raise RequestError(f"'{name}' is not supported (only 0); remove it")
    prompt = _prompt(body, chat)
    if _typed(body, "n", int, 1, lambda v: True, "an integer") != 1:
        raise RequestError("'n' must be 1: this server returns one choice per request")
    top_k = _typed(body, "top_k", int, None, lambda v: v >= -1, "an integer >= -1 (0 or -1 disables)")
    try:
        config = GenerationConfig(
            max_new_tokens=_typed(body, "max_tokens", int, min(default_max_tokens, max_context),
                                  lambda v: 1 <= v <= max_context, f"1..{max_context}"),
            temperature=float(_typed(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2, "0..2")),
            top_p=_typed(body, "top_p", (int, float), None, lambda v: 0 < v <= 1, "(0, 1]"),
            top_k=top_k if top_k and top_k > 0 else None,
            seed=_typed(body, "seed", int, None, lambda v: 0 <= v < 2**63, "0..2^63-1"),
            stop=_stop(body),
            speculative=_typed(body, "speculative", bool, None, None, "true or false"),
            num_draft_tokens=_typed(body, "num_draft_tokens", int, None,
                                    lambda v: 1 <= v <= MAX_DRAFT_TOKENS, f"1..{MAX_DRAFT_TOKENS}"),
            draft_source=_typed(body, "draft_source", str, None, lambda v: v in SOURCES, ", ".join(SOURCES)),
            lookup_ngram=_typed(body, "lookup_ngram", list, None, None, "[min, max], e.g. [2, 4]"),
            ignore_eos=_typed(body, "ignore_eos", bool, False, None, "true or false"),
        )
    except RequestError:
        raise
    except ConfigError as exc:
        raise RequestError(str(exc)) from None
    stream = _typed(body, "stream", bool, False, None, "true or false")
    return Request(prompt, config, stream, chat, body.get("max_tokens") is not None)
