"""Frozen, validated configuration of one generation call."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .manifest import check_ngram
from .runtime.drafting import SOURCES
from .runtime.sampling import SamplingParams

MAX_DRAFT_TOKENS = 16


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    speculative: bool | None = None       # None: the bundle's default
    num_draft_tokens: int | None = None   # None: the bundle's default
    draft_source: str | None = None       # None: the bundle's default
    lookup_ngram: tuple[int, int] | None = None  # (min, max) suffix lengths lookup matches; None: bundle's
    ignore_eos: bool = False

    def __post_init__(self):
        if not (1 <= self.max_new_tokens <= 1_000_000):
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} must be a positive integer")
        n = self.num_draft_tokens
        if n is not None and not (1 <= n <= MAX_DRAFT_TOKENS):
            raise ConfigError(f"num_draft_tokens={n} must be in 1..{MAX_DRAFT_TOKENS}")
        if self.draft_source is not None and self.draft_source not in SOURCES:
            raise ConfigError(
                f"draft_source='{self.draft_source}' is unknown; pick one of {', '.join(SOURCES)}"
            )
        if self.lookup_ngram is not None:
            object.__setattr__(self, "lookup_ngram", check_ngram(self.lookup_ngram))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError("stop must be a list of non-empty strings")
        _ = self.sampling  # constructing it validates temperature / top_k / top_p

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)
