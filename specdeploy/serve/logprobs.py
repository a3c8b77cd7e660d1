"""Token log-probabilities in OpenAI's two shapes: chat's `content` list and the legacy completions'
parallel lists (which lm-evaluation-harness's `local-completions` reads)."""
from __future__ import annotations

from typing import Callable

from ..runtime.logprobs import TokenLogprob


def _entry(tokenizer, token: int, logprob: float) -> dict:
    return {"token": tokenizer.token_text(token), "logprob": logprob, "bytes": list(tokenizer.token_bytes(token))}


def chat(entries: list[TokenLogprob], tokenizer) -> dict:
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}: `bytes` are the
    token's own (a character split across tokens shows its bytes where its text cannot)."""
    return {"content": [{**_entry(tokenizer, e.token, e.logprob),
                         "top_logprobs": [_entry(tokenizer, t, lp) for t, lp in e.top]} for e in entries]}


def completion(tokens: list[int], entries: list[TokenLogprob | None], text: Callable[[int], str],
               offset: int = 0) -> dict:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"}: one item a token; an echoed
    prompt's first token has no log-probability (None), as in OpenAI's API."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, e in zip(tokens, entries):
        piece = text(token)
        out["tokens"].append(piece)
        out["token_logprobs"].append(None if e is None else e.logprob)
        out["top_logprobs"].append(None if e is None else {text(t): lp for t, lp in e.top})
        out["text_offset"].append(offset)
        offset += len(piece)
    return out
