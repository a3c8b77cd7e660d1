"""The embeddable runtime: `Engine` opens one bundle (a directory) and generates or streams text.

"Engine" here is the Python object over a bundle on any backend; TensorRT's serialized engines
inside a bundle are files named `<graph>.trt` (see backends/tensorrt).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..backends import load_stages
from ..bundle import manifest as manifest_io
from ..config import GenerationConfig, check_prefill_chunk
from ..constants import DEFAULT_BACKEND, DEFAULT_PREFILL_CHUNK, MAX_DRAFT_TOKENS
from ..errors import ConfigError
from . import row_check
from .decoder import Decoder
from .logprobs import TokenLogprob
from .settings import DecodeSettings
from .split_model import SplitModel
from .stats import GenerationStats
from .tokenizer import StreamDecoder, Tokenizer, encode_plain


@dataclass(frozen=True)
class Piece:
    """A streamed text delta; `drafted` is True when its token was an accepted draft. `logprobs`
    (when asked for) has one entry for each token since the last piece: a token whose bytes do not
    yet end a character, or that a stop string may still claim, shows its text in a later piece."""

    text: str
    token: int | None
    drafted: bool
    logprobs: tuple[TokenLogprob, ...] = ()
    tokens: tuple[int, ...] = ()  # every token since the last piece, this one's last


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: GenerationStats = field(default_factory=GenerationStats)


class Engine:
    def __init__(self, bundle: Path, backend: str = DEFAULT_BACKEND, provider: str | None = None,
                 threads: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, prefix_reuse: bool = True,
                 fixed_rows: int | None = None):
        """`provider` (ONNX Runtime only): cpu (default), cuda or tensorrt; `threads`: intra-op threads;
        `prefill_chunk`: the most prompt rows one prefill pass carries (fewer: a lower peak memory);
        `prefix_reuse`: prefill a prompt only from where it leaves the last sequence's tokens;
        `fixed_rows`: every decoding pass carries this many rows (SplitModel.set_fixed_rows), what a GPU
        needs for a verify row to be the one-row step: the default on a GPU (MAX_DRAFT_TOKENS + 1, or the
        engines' largest profile), off on the CPU, whose kernels compute a row alike at any row count."""
        check_prefill_chunk(prefill_chunk)
        self.bundle = Path(bundle)
        self.manifest = manifest_io.read(self.bundle)
        m = self.manifest
        template = (self.bundle / m.chat_template).read_text() if m.chat_template else None
        self.tokenizer = Tokenizer(self.bundle / m.tokenizer, template, m.model.bos_token_id)
        stages = load_stages(self.bundle, m, backend=backend, provider=provider, threads=threads)
        self.model = SplitModel(m, stages)
        on_gpu = backend == "tensorrt" or (provider or "cpu") != "cpu"
        fixed_rows = fixed_rows or (min(self.model.max_rows, MAX_DRAFT_TOKENS + 1) if on_gpu else None)
        if fixed_rows:
            if check_prefill_chunk(fixed_rows) > self.model.max_rows:
                self.model.close()
                raise ConfigError(f"fixed_rows={fixed_rows} is more than the {self.model.max_rows} rows the engines "
                                  f"were built for; lower it or rebuild them with a larger --max-prompt")
            self.model.set_fixed_rows(fixed_rows)
        if backend == "onnxruntime":
            try:
                self.row_check = row_check.verify_at_load(self.model, provider or "cpu")
            except Exception:
                self.model.close()
                raise
        vocab = np.load(self.bundle / m.draft_vocab) if m.draft_vocab else None
        feature_vocab = np.load(self.bundle / m.feature_vocab) if m.feature_vocab else None
        self.decoder = Decoder(self.model, vocab, m.confidence_threshold, prefill_chunk, feature_vocab, self.bundle)
        # a fixed row count makes rows alike within a generation, not across passes of other sizes
        self.decoder.reuse = self.decoder.reuse and prefix_reuse and not fixed_rows

    def encode_prompt(self, prompt) -> list[int]:
        """Token ids of a plain string, or of chat messages rendered with the chat template."""
        if isinstance(prompt, list):
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt))  # the template has BOS
        if not isinstance(prompt, str):
            raise ConfigError("prompt must be a string or a list of chat messages")
        return encode_plain(self.tokenizer, self.manifest.model, prompt)

    def stream(self, prompt, config: GenerationConfig | None = None,
               stats: GenerationStats | None = None, **options) -> Iterator[Piece]:
        """Yield text pieces as tokens are committed. Stop iterating to cancel the generation."""
        config = config or GenerationConfig(**options)
        return self.stream_ids(self.encode_prompt(prompt), config, stats)

    def check_fits(self, ids: list[int], config: GenerationConfig) -> None:
        """Raise ContextLengthError/ConfigError now, before any work is queued."""
        self.decoder.check_fits(len(ids), config)

    def settings(self, config: GenerationConfig) -> DecodeSettings:
        """What `config` resolves to on this bundle (speculative or not, source, γ, n-gram range)."""
        return self.decoder.settings(config)

    def stream_ids(self, ids: list[int], config: GenerationConfig,
                   stats: GenerationStats | None = None) -> Iterator[Piece]:
        """Text pieces for already encoded prompt ids (see `stream`)."""
        stats = stats if stats is not None else GenerationStats()
        detok, stops = StreamDecoder(self.tokenizer), _StopFilter(config.stop)
        held: list[TokenLogprob] = []  # logprobs of tokens not yet in a piece
        tokens: list[int] = []         # and those tokens
        for step in self.decoder.generate(ids, config, stats):
            for i, (token, drafted) in enumerate(zip(step.tokens, step.drafted)):
                text = stops.feed(detok.push([token]))
                tokens.append(token)
                if step.logprobs is not None:
                    held.append(step.logprobs[i])
                if text:
                    yield Piece(text, token, drafted, tuple(held), tuple(tokens))
                    held, tokens = [], []
                if stops.stopped:
                    stats.finish_reason = "stop"
                    return
        stats.finish_reason = "length" if stats.generated_tokens >= config.max_new_tokens else "stop"
        tail = stops.feed(detok.flush()) + stops.flush()
        if tail or held or tokens:
            yield Piece(tail, None, False, tuple(held), tuple(tokens))

    def generate(self, prompt, config: GenerationConfig | None = None, **options) -> Result:
        config = config or GenerationConfig(**options)
        stats = GenerationStats()
        pieces = list(self.stream(prompt, config, stats))
        text = "".join(p.text for p in pieces)
        tokens = [p.token for p in pieces if p.token is not None]
        return Result(text, tokens, stats.finish_reason, stats)

    def generate_ids(self, prompt_ids: list[int], config: GenerationConfig,
                     stats: GenerationStats | None = None) -> list[int]:
        """Raw token ids (no text, no stop strings): what exactness tests compare."""
        out: list[int] = []
        for step in self.decoder.generate(list(prompt_ids), config, stats):
            out.extend(step.tokens)
        return out

    def prompt_logprobs(self, ids: list[int], top: int = 0) -> list[TokenLogprob | None]:
        """Each prompt token's log-probability given the ones before it (None for the first), with its
        `top` most likely alternatives: what a loglikelihood evaluation scores."""
        return self.decoder.prompt_logprobs(list(ids), top)

    def close(self) -> None:
        self.model.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _StopFilter:
    """Cuts text at the first stop string, holding back a possible partial match while streaming."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.buffer, self.stopped = stops, "", False

    def feed(self, text: str) -> str:
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        self.buffer += text
        cuts = [self.buffer.find(s) for s in self.stops if s in self.buffer]
        if cuts:
            self.stopped = True
            out, self.buffer = self.buffer[: min(cuts)], ""
            return out
        cut = len(self.buffer) - self._partial_match()
        out, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return out

    def _partial_match(self) -> int:
        """Length of the longest end of the buffer that could still grow into a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self.buffer)), best, -1):
                if self.buffer.endswith(stop[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        out, self.buffer = ("" if self.stopped else self.buffer), ""
        return out
