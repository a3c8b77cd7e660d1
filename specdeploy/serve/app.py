"""Routes of the OpenAI-compatible server (Starlette)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from ..errors import SpecDeployError
from . import access, tools
from . import logprobs as logprobs_format
from .metrics import Metrics
from .schemas import Request, RequestError, parse
from .worker import DONE, Job, QueueFull, Worker

STATIC = Path(__file__).parent / "static"
RETRY_AFTER_S = 2


def error(status: int, message: str, kind: str = "invalid_request_error", headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def speculative_fields(stats, source: str) -> dict:
    """Statistics under names vLLM and llama.cpp users know."""
    return {
        "speculative": {**stats.to_dict(), "draft_source": source},
        "timings": {  # llama.cpp server style
            "prompt_n": stats.prompt_tokens, "prompt_ms": round(1000 * stats.prefill_s, 3),
            "predicted_n": stats.generated_tokens, "predicted_ms": round(1000 * stats.decode_s, 3),
            "predicted_per_second": round(stats.tokens_per_second, 3),
            "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
        },
    }


class Server:
    def __init__(self, engine, model_name: str, max_queue: int = 8, api_key: str | None = None,
                 cors_origins: tuple[str, ...] = ()):
        self.engine, self.model_name = engine, model_name
        self.api_key, self.cors_origins = api_key, cors_origins
        self.metrics = Metrics()
        self.worker = Worker(engine, max_queue, on_finish=lambda job: self.metrics.generation(job.stats))

    def _usage(self, stats) -> dict:
        return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
                "total_tokens": stats.prompt_tokens + stats.generated_tokens,
                "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}

    def _ids(self, prompt) -> list[int]:
        """Token ids of a prompt: ids as given (checked against the vocabulary), else encoded."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            vocab = self.engine.manifest.model.vocab_size
            if max(prompt) >= vocab:
                raise RequestError(f"'prompt' holds token id {max(prompt)}, past this model's vocabulary of {vocab}")
            return prompt
        return self.engine.encode_prompt(prompt)

    def _source(self, req: Request) -> str:
        return self.engine.settings(req.config).label

    async def _parse(self, http: HttpRequest, chat: bool) -> tuple[Request, list[int]]:
        try:
            body = json.loads(await http.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"the request body is not valid JSON ({exc})") from None
        req = parse(body, chat, self.engine.manifest.max_context)
        ids = self._ids(req.prompt)
        if not req.max_tokens_given:  # default: as much as fits, up to the default
            room = max(1, self.engine.manifest.max_context - len(ids))
            config = dataclasses.replace(req.config, max_new_tokens=min(req.config.max_new_tokens, room))
            req = dataclasses.replace(req, config=config)
        self.engine.check_fits(ids, req.config)
        return req, ids

    async def completions(self, http: HttpRequest):
        return await self._handle(http, chat=False)

    async def chat_completions(self, http: HttpRequest):
        return await self._handle(http, chat=True)

    async def _handle(self, http: HttpRequest, chat: bool):
        endpoint = http.url.path
        try:
            req, ids = await self._parse(http, chat)
        except SpecDeployError as exc:
            self.metrics.request(endpoint, 400)
            self.metrics.error("invalid_request")
            return error(400, str(exc))
        job = Job(ids, req.config, asyncio.get_running_loop(), generate=req.generate,
                  prompt_top=req.config.logprobs if req.echo and req.config.logprobs is not None else None)
        try:
            self.worker.submit(job)
        except QueueFull:
            self.metrics.request(endpoint, 429)
            self.metrics.error("queue_full")
            return error(429, "the server is busy: the request queue is full; retry later",
                         "rate_limit_error", {"Retry-After": str(RETRY_AFTER_S)})
        self.metrics.request(endpoint, 200)
        meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                "created": int(time.time()), "model": self.model_name}
        if req.stream:
            return StreamingResponse(self._events(job, req, meta), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._complete(job, req, meta)

    async def _pieces(self, job: Job):
        try:
            while True:
                item = await job.output.get()
                if item is DONE:
                    return
                if isinstance(item, Exception):
                    self.metrics.error("generation")
                    raise item
                yield item
        finally:
            job.cancel.set()  # client gone or finished: free the engine at the next token

    async def _complete(self, job: Job, req: Request, meta: dict):
        try:
            pieces = [p async for p in self._pieces(job)]
        except Exception as exc:
            return error(500, f"generation failed: {exc}", "server_error")
        text = "".join(p.text for p in pieces)
        entries = [e for p in pieces for e in p.logprobs]
        finish = job.stats.finish_reason
        if req.chat:
            message, finish = self._message(req, text, finish)
            choice = {"index": 0, "message": message, "finish_reason": finish,
                      "logprobs": self._chat_logprobs(req, entries)}
        else:
            choice = self._completion_choice(job, req, text, entries)
        obj = "chat.completion" if req.chat else "text_completion"
        return JSONResponse({**meta, "object": obj, "choices": [choice], "usage": self._usage(job.stats),
                             **speculative_fields(job.stats, self._source(req))})

    def _message(self, req: Request, text: str, finish: str) -> tuple[dict, str]:
        """The assistant's message and finish reason: a tool call where the request offered tools."""
        if not req.tools:
            return {"role": "assistant", "content": text}, finish
        content, calls = tools.reply(text)
        if calls is None:
            return {"role": "assistant", "content": content}, finish
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def _chat_logprobs(self, req: Request, entries) -> dict | None:
        if req.config.logprobs is None:
            return None
        return logprobs_format.chat(entries, self.engine.tokenizer)

    def _completion_choice(self, job: Job, req: Request, text: str, entries) -> dict:
        """A completions choice; with echo, the prompt's text and logprobs come first."""
        token_text = self.engine.tokenizer.token_text
        prompt_text = ""
        if req.echo:
            prompt_text = req.prompt if isinstance(req.prompt, str) else "".join(map(token_text, job.ids))
        logprobs = None
        if req.config.logprobs is not None:
            generated = [e.token for e in entries]
            tokens, scored = (job.ids, job.prompt_logprobs) if req.echo else ([], [])
            logprobs = logprobs_format.completion([*tokens, *generated], [*scored, *entries], token_text)
        return {"index": 0, "text": prompt_text + text, "finish_reason": job.stats.finish_reason,
                "logprobs": logprobs}

    def _chunk(self, req: Request, meta: dict, text: str | None, drafted=None, finish=None, entries=()) -> dict:
        if req.chat:
            delta = {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish,
                      "logprobs": self._chat_logprobs(req, entries) if entries else None}
        else:
            logprobs = None
            if entries and req.config.logprobs is not None:
                logprobs = logprobs_format.completion([e.token for e in entries], entries,
                                                      self.engine.tokenizer.token_text)
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        if drafted is not None:
            choice["drafted"] = drafted  # accepted draft token (True) or verifier token (False)
        return {**meta, "object": "chat.completion.chunk" if req.chat else "text_completion", "choices": [choice]}

    async def _events(self, job: Job, req: Request, meta: dict):
        def sse(obj) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        if req.chat:
            first = self._chunk(req, meta, None)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield sse(first)
        if req.tools:  # the reply is known to be a call or an answer only once whole
            async for chunk in self._tool_events(job, req, meta):
                yield sse(chunk)
            yield "data: [DONE]\n\n"
            return
        try:
            async for piece in self._pieces(job):
                yield sse(self._chunk(req, meta, piece.text, piece.drafted, entries=piece.logprobs))
        except Exception as exc:
            yield sse({"error": {"message": f"generation failed: {exc}", "type": "server_error"}})
            yield "data: [DONE]\n\n"
            return
        last = self._chunk(req, meta, None, finish=job.stats.finish_reason)
        last.update(usage=self._usage(job.stats), **speculative_fields(job.stats, self._source(req)))
        yield sse(last)
        yield "data: [DONE]\n\n"

    async def _tool_events(self, job: Job, req: Request, meta: dict):
        """A streamed reply to a request with tools: one delta with the whole call (or answer), then the end."""
        try:
            text = "".join([p.text async for p in self._pieces(job)])
        except Exception as exc:
            yield {"error": {"message": f"generation failed: {exc}", "type": "server_error"}}
            return
        message, finish = self._message(req, text, job.stats.finish_reason)
        delta = {"content": message["content"]} if message.get("content") is not None else {
            "tool_calls": [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]}
        chunk = self._chunk(req, meta, None)
        chunk["choices"][0]["delta"] = delta
        yield chunk
        last = self._chunk(req, meta, None, finish=finish)
        last.update(usage=self._usage(job.stats), **speculative_fields(job.stats, self._source(req)))
        yield last

    async def models(self, http: HttpRequest):
        m = self.engine.manifest
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": 0, "owned_by": "specdeploy",
            "exit_layer": m.exit_layer, "num_layers": m.model.num_layers,
            "num_draft_tokens": m.num_draft_tokens, "draft_source": m.draft_source,
            "lookup_ngram": list(m.lookup_ngram), "max_context": m.max_context, "precision": m.precision}]})

    async def tokenizer_info(self, http: HttpRequest):
        """vLLM's tokenizer endpoints (lm-evaluation-harness's remote tokenizer reads them)."""
        m, tok = self.engine.manifest, self.engine.tokenizer
        special = {name: (tok.token_text(i) if i is not None else None) for name, i in
                   (("eos_token", m.model.eos_token_ids[0] if m.model.eos_token_ids else None),
                    ("bos_token", m.model.bos_token_id))}
        return JSONResponse({**special, "pad_token": None, "chat_template": tok.chat_template,
                             "model_max_length": m.max_context})

    async def _json(self, http: HttpRequest) -> dict:
        try:
            body = json.loads(await http.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"the request body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    async def tokenize(self, http: HttpRequest):
        """{"prompt": text, "add_special_tokens": bool} or {"messages": [...]} -> {"tokens", "count", "max_model_len"}."""
        try:
            body = await self._json(http)
            if "messages" in body:
                ids = self.engine.encode_prompt(parse({"messages": body["messages"]}, True, 1).prompt)
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
                ids = (self.engine.encode_prompt(text) if body.get("add_special_tokens", True)
                       else self.engine.tokenizer.encode(text))
            else:
                raise RequestError("'prompt' (a string) or 'messages' is required")
        except SpecDeployError as exc:
            return error(400, str(exc))
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.engine.manifest.max_context})

    async def detokenize(self, http: HttpRequest):
        """{"tokens": [ids]} -> {"prompt": text}."""
        try:
            body = await self._json(http)
            ids = body.get("tokens")
            vocab = self.engine.manifest.model.vocab_size
            if not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                  for t in ids)):
                raise RequestError(f"'tokens' must be a list of token ids in 0..{vocab - 1}")
        except SpecDeployError as exc:
            return error(400, str(exc))
        return JSONResponse({"prompt": self.engine.tokenizer.decode(ids)})

    async def health(self, http: HttpRequest):
        return JSONResponse({"status": "ok", "queue_depth": self.worker.depth})

    async def metrics_text(self, http: HttpRequest):
        return PlainTextResponse(self.metrics.render(self.worker.depth),
                                 media_type="text/plain; version=0.0.4")

    async def playground(self, http: HttpRequest):
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def not_found(self, http: HttpRequest, exc):
        return error(404, f"no route {http.method} {http.url.path}; see /v1/models", "not_found_error")

    async def method_not_allowed(self, http: HttpRequest, exc):
        status = getattr(exc, "status_code", 500)
        if status == 405:
            return error(405, f"{http.method} is not allowed on {http.url.path}")
        return error(status, "server error", "server_error")

    def app(self):
        """The ASGI application: the routes behind the API key and CORS, where configured."""
        return access.wrap(self.routes(), self.api_key, self.cors_origins)

    def routes(self) -> Starlette:
        routes = [
            Route("/", self.playground),
            Route("/health", self.health),
            Route("/metrics", self.metrics_text),
            Route("/v1/models", self.models),
            Route("/tokenizer_info", self.tokenizer_info),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ]
        return Starlette(routes=routes, exception_handlers={404: self.not_found, 405: self.method_not_allowed,
                                                            500: self.method_not_allowed})
