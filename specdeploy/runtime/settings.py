"""One place where a request's settings meet the bundle's defaults.

The decoder, the CLI's summary line, the server's statistics and the bench all ask this module
what a generation will actually do, so "None means the bundle's default" is written once.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..bundle.manifest import Manifest, SamplingDefaults
from ..config import GenerationConfig, Penalties, ResponseFormat, SamplingParams
from ..constants import PLAIN


@dataclass(frozen=True)
class DecodeSettings:
    """What one generation runs with, after defaults: immutable, so nothing shared is reconfigured."""

    speculative: bool
    num_draft_tokens: int
    draft_source: str             # a source from constants.SOURCES (used when speculative)
    lookup_ngram: tuple[int, int]
    sampling: SamplingParams
    penalties: Penalties = Penalties()
    response_format: ResponseFormat | None = None

    @property
    def label(self) -> str:
        """The source name statistics report: "plain" when nothing is drafted."""
        return self.draft_source if self.speculative else PLAIN


def resolve(config: GenerationConfig, manifest: Manifest) -> DecodeSettings:
    speculative = manifest.default_speculative if config.speculative is None else config.speculative
    return DecodeSettings(
        speculative=speculative,
        num_draft_tokens=config.num_draft_tokens or manifest.num_draft_tokens,
        draft_source=config.draft_source or manifest.draft_source,
        lookup_ngram=config.lookup_ngram or manifest.lookup_ngram,
        sampling=sampling(config, manifest.sampling_defaults or SamplingDefaults("none")),
        penalties=Penalties(_either(config.repetition_penalty, manifest.sampling_defaults, "repetition_penalty", 1.0),
                            config.presence_penalty, config.frequency_penalty),
        response_format=None if config.response_format is None or config.response_format.type == "text"
        else config.response_format,
    )


def _either(value, defaults: SamplingDefaults | None, name: str, otherwise=None):
    """The caller's value, else the bundle's default, else `otherwise`."""
    if value is not None:
        return value
    default = getattr(defaults, name) if defaults is not None else None
    return otherwise if default is None else default


def sampling(config: GenerationConfig, defaults: SamplingDefaults) -> SamplingParams:
    """Temperature, top-k, top-p and min-p: each the caller's, else the model's default; greedy
    where neither gives a temperature."""
    return SamplingParams(_either(config.temperature, defaults, "temperature", 0.0),
                          _either(config.top_k, defaults, "top_k") or None,  # 0: off
                          _either(config.top_p, defaults, "top_p"), _either(config.min_p, defaults, "min_p"))
