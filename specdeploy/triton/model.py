"""Triton Python-backend model over one specdeploy bundle (copied as NAME/1/model.py).

The draft-verify-accept loop runs in-process with its KV buffers; Triton sees one request per
generation and, decoupled, streams one response per text piece. Module level imports only the
standard library: Triton's stub imports this file before `initialize` has made the environment
with specdeploy and numpy importable (the `site_packages` parameter).
"""
import json
import os
import queue
import sys
import threading

FIELDS = {  # optional inputs -> (GenerationConfig field, python type)
    "max_tokens": ("max_new_tokens", int), "temperature": ("temperature", float), "top_p": ("top_p", float),
    "top_k": ("top_k", int), "seed": ("seed", int), "speculative": ("speculative", bool),
    "num_draft_tokens": ("num_draft_tokens", int), "draft_source": ("draft_source", str),
    "ignore_eos": ("ignore_eos", bool),
}


def _parameter(config: dict, name: str, default=None):
    return config.get("parameters", {}).get(name, {}).get("string_value") or default


class _Metrics:
    """Custom metrics on Triton's /metrics: finished generations by reason, tokens, queue depth."""

    def __init__(self, model: str, instance: str):
        self.labels = {"model": model, "instance": instance}
        self.family = pb_utils.MetricFamily(
            name="specdeploy_requests_finished_total", kind=pb_utils.MetricFamily.COUNTER,
            description="Generations ended, by reason (stop, length, cancelled, error, queue_full)")
        # families must outlive their metrics, so both are kept here
        self.token_family = pb_utils.MetricFamily(
            name="specdeploy_generation_tokens_total", kind=pb_utils.MetricFamily.COUNTER,
            description="Tokens generated, cancelled generations included")
        self.depth_family = pb_utils.MetricFamily(
            name="specdeploy_queue_depth", kind=pb_utils.MetricFamily.GAUGE,
            description="Requests waiting for this instance's engine")
        self.tokens = self.token_family.Metric(labels=self.labels)
        self.queue_depth = self.depth_family.Metric(labels=self.labels)
        self.reasons = {}

    def finished(self, reason: str, tokens: int = 0) -> None:
        if reason not in self.reasons:
            self.reasons[reason] = self.family.Metric(labels={**self.labels, "reason": reason})
        self.reasons[reason].increment(1)
        self.tokens.increment(tokens)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        for path in filter(None, (_parameter(config, "site_packages") or "").split(":")):
            sys.path.insert(0, path)
        global np, pb_utils
        import numpy as np
        import triton_python_backend_utils as pb_utils

        from specdeploy.runtime.engine import Engine

        threads = int(_parameter(config, "threads", "0")) or None
        # a relative bundle path (written by --copy) is inside this model's directory, wherever the
        # repository is mounted (a container's /models, a Kubernetes volume)
        model_dir = args["model_repository"]  # this model's directory: REPO/NAME
        bundle = os.path.join(model_dir, _parameter(config, "bundle"))
        self.engine = Engine(bundle, backend=_parameter(config, "backend", "onnxruntime"), threads=threads)
        self.default_max_tokens = int(_parameter(config, "default_max_tokens", "256"))
        self.jobs = queue.Queue(maxsize=int(_parameter(config, "max_queue", "8")))
        self.metrics = _Metrics(args["model_name"], args["model_instance_name"])
        self.worker = threading.Thread(target=self._run, daemon=True)
        self.worker.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self._parse(request)
            except Exception as exc:  # a bad request gets an error response; the model keeps serving
                self._fail(sender, f"bad request: {exc}")
                continue
            try:
                self.jobs.put_nowait((request, sender, *job))
            except queue.Full:
                self.metrics.finished("queue_full")
                self._fail(sender, "the model's request queue is full; retry later")
            self.metrics.queue_depth.set(self.jobs.qsize())
        return None

    def _value(self, request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        value = tensor.as_numpy().reshape(-1)
        if value.size == 0:
            return None
        item = value[0]
        return item.decode() if isinstance(item, bytes) else item.item() if hasattr(item, "item") else item

    def _parse(self, request):
        from specdeploy.config import GenerationConfig

        text, messages = self._value(request, "text_input"), self._value(request, "messages")
        if messages is not None:
            prompt = json.loads(messages)
        elif text:
            prompt = text
        else:
            raise ValueError("'text_input' (a non-empty string) or 'messages' (a JSON list) is required")
        options = {"max_new_tokens": self.default_max_tokens}
        for name, (field, kind) in FIELDS.items():
            value = self._value(request, name)
            if value is not None:
                options[field] = kind(value)
        stop = pb_utils.get_input_tensor_by_name(request, "stop")
        if stop is not None:
            options["stop"] = tuple(s.decode() for s in stop.as_numpy().reshape(-1))
        stream = bool(self._value(request, "stream") or False)
        config = GenerationConfig(**options)
        ids = self.engine.encode_prompt(prompt)
        self.engine.check_fits(ids, config)
        return ids, config, stream

    def _fail(self, sender, message):
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the client is gone (cancelled): nobody to tell
            pass

    def _tensor(self, name, value, dtype):
        return pb_utils.Tensor(name, np.array([value], dtype=dtype))

    def _run(self):
        while True:
            request, sender, ids, config, stream = self.jobs.get()
            self.metrics.queue_depth.set(self.jobs.qsize())
            try:
                self._generate(request, sender, ids, config, stream)
            except Exception as exc:  # reported to the request, never ends the worker
                self.metrics.finished("error")
                self._fail(sender, f"generation failed: {exc}")

    def _generate(self, request, sender, ids, config, stream):
        from specdeploy.runtime.stats import GenerationStats

        stats, text = GenerationStats(), []
        if request.is_cancelled():  # gone while it waited
            return self._cancelled(sender, stats)
        for piece in self.engine.stream_ids(ids, config, stats):
            if request.is_cancelled():  # the client went away: free the engine now
                return self._cancelled(sender, stats)
            if stream:
                sender.send(pb_utils.InferenceResponse([self._tensor("text_output", piece.text.encode(), object)]))
            else:
                text.append(piece.text)
        self.metrics.finished(stats.finish_reason, stats.generated_tokens)
        sender.send(self._final("".join(text), stats, self.engine.settings(config).label),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _cancelled(self, sender, stats):
        """A cancelled request still gets the final flag: without it Triton counts the request live
        and waits out its whole exit timeout (30 s) before unloading the model."""
        self.metrics.finished("cancelled", stats.generated_tokens)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # nothing more to tell a client that is gone
            pass

    def _final(self, text, stats, source):
        d = stats.to_dict()
        return pb_utils.InferenceResponse([
            self._tensor("text_output", text.encode(), object),
            self._tensor("finish_reason", stats.finish_reason.encode(), object),
            self._tensor("draft_source", source.encode(), object),
            self._tensor("completion_tokens", d["generated_tokens"], np.int32),
            self._tensor("draft_tokens", d["draft_tokens"], np.int32),
            self._tensor("accepted_tokens", d["accepted_tokens"], np.int32),
            self._tensor("acceptance_rate", d["acceptance_rate"], np.float32),
            self._tensor("tokens_per_round", d["tokens_per_round"], np.float32),
        ])

    def finalize(self):
        self.engine.close()
