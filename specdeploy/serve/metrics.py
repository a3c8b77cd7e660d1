"""Prometheus text-format metrics (no client library needed)."""
from __future__ import annotations

import threading
from collections import defaultdict

from ..runtime.stats import GenerationStats


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = defaultdict(int)     # (endpoint, status) -> count
        self.errors = defaultdict(int)       # kind -> count
        self.totals = GenerationStats()      # every finished generation, merged
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.last_tokens_per_second = 0.0

    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] += 1

    def generation(self, stats) -> None:
        with self.lock:
            self.totals.merge(stats)
            if stats.first_token_s is not None:
                self.ttft_sum += stats.first_token_s
                self.ttft_count += 1
            self.last_tokens_per_second = stats.tokens_per_second

    def render(self, queue_depth: int) -> str:
        with self.lock:
            lines = []

            def metric(name, kind, help_text, samples):
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} {kind}")
                for labels, value in samples:
                    lines.append(f"{name}{labels} {value}")

            metric("specdeploy_requests_total", "counter", "HTTP requests by endpoint and status.",
                   [(f'{{endpoint="{e}",status="{s}"}}', v) for (e, s), v in sorted(self.requests.items())])
            metric("specdeploy_errors_total", "counter", "Rejected or failed requests by kind.",
                   [(f'{{kind="{k}"}}', v) for k, v in sorted(self.errors.items())])
            metric("specdeploy_prompt_tokens_total", "counter", "Prompt tokens processed.", [("", self.totals.prompt_tokens)])
            metric("specdeploy_generation_tokens_total", "counter", "Tokens generated.", [("", self.totals.generated_tokens)])
            metric("specdeploy_spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", [("", self.totals.drafted)])
            metric("specdeploy_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", [("", self.totals.accepted)])
            rate = self.totals.acceptance_rate
            metric("specdeploy_spec_decode_acceptance_rate", "gauge", "Accepted / drafted since start.", [("", round(rate, 6))])
            metric("specdeploy_time_to_first_token_seconds", "summary", "Time to first token.",
                   [("_sum", round(self.ttft_sum, 6)), ("_count", self.ttft_count)])
            tps = self.totals.tokens_per_second
            metric("specdeploy_tokens_per_second", "gauge", "Generated tokens per decode second since start.", [("", round(tps, 3))])
            metric("specdeploy_last_request_tokens_per_second", "gauge", "Tokens/s of the last request.",
                   [("", round(self.last_tokens_per_second, 3))])
            metric("specdeploy_queue_depth", "gauge", "Requests waiting or decoding.", [("", queue_depth)])
            return "\n".join(lines) + "\n"
