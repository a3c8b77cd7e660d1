"""One place where a request's settings meet the bundle's defaults.

The decoder, the CLI's summary line, the server's statistics and the bench all ask this module
what a generation will actually do, so "None means the bundle's default" is written once.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..bundle.manifest import Manifest
from ..config import GenerationConfig, SamplingParams
from ..constants import PLAIN


@dataclass(frozen=True)
class DecodeSettings:
    """What one generation runs with, after defaults: immutable, so nothing shared is reconfigured."""

    speculative: bool
    num_draft_tokens: int
    draft_source: str             # a source from constants.SOURCES (used when speculative)
    lookup_ngram: tuple[int, int]
    sampling: SamplingParams

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
        sampling=config.sampling,
    )
