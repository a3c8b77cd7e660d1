"""The decoding loop: prefill, then rounds of draft -> verify -> accept -> commit.

The loop knows speculation and nothing about backends. Both caches are valid up to `valid`;
`pending` is the last token sampled from the full model and not yet fed. Rejected draft rows stay
in the KV buffers past the valid length and are overwritten by the next round: rollback is free.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..config import GenerationConfig, SamplingParams
from ..constants import DEFAULT_PREFILL_CHUNK, PLAIN
from ..errors import ConfigError, ContextLengthError
from .acceptance import accept_greedy, accept_sampled
from .drafting import Draft, EarlyExitDrafter, HybridDrafter, LookupDrafter
from .sampling import sample, warp
from .settings import DecodeSettings, resolve
from .split_model import SplitModel
from .stats import GenerationStats


@dataclass(frozen=True)
class Emitted:
    """Tokens committed by one step; `drafted` marks tokens that came from accepted drafts."""

    tokens: tuple[int, ...]
    drafted: tuple[bool, ...]
    source: str


class Decoder:
    def __init__(self, model: SplitModel, vocab_ids: np.ndarray | None = None,
                 confidence_threshold: float | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 feature_vocab: np.ndarray | None = None):
        self.model = model
        self.prefill_chunk = min(prefill_chunk, model.max_rows)  # rows one prefill pass carries
        self.eos = set(model.manifest.model.eos_token_ids)
        early = EarlyExitDrafter(model, vocab_ids, confidence_threshold)
        lookup = LookupDrafter(model)
        hybrid = HybridDrafter(lookup, early, probe_exit=model.manifest.exit_can_pay)
        self.drafters = {"early_exit": early, "lookup": lookup, "hybrid": hybrid}
        self.history = np.zeros(model.max_context + 1, np.int64)  # prompt + committed + pending
        if feature_vocab is not None:
            from .feature_drafting import SOURCE, FeatureDrafter

            feature = FeatureDrafter(model, self.history, feature_vocab)
            # the hybrid drafts with the head where the early exit would: lookup, else the head, else plain
            self.drafters.update({SOURCE: feature, "hybrid": HybridDrafter(lookup, feature)})

    def settings(self, config: GenerationConfig) -> DecodeSettings:
        return resolve(config, self.model.manifest)

    def check_fits(self, prompt_len: int, config: GenerationConfig) -> DecodeSettings:
        """Refuse, before any work, a generation the bundle's buffers or engines cannot hold.

        Returns the resolved settings the check was made for (the generation runs with them)."""
        if prompt_len == 0:
            raise ConfigError("the prompt is empty; pass at least one token of text")
        if prompt_len + config.max_new_tokens > self.model.max_context:
            raise ContextLengthError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds the "
                f"bundle's max context {self.model.max_context}; shorten the prompt, lower "
                f"max_new_tokens, or re-export with a larger --max-context"
            )
        settings = self.settings(config)
        if settings.speculative and settings.draft_source not in self.drafters:
            raise ConfigError(f"draft_source='{settings.draft_source}' needs a feature head, which this bundle lacks; "
                              f"export it with --feature-head HEAD_DIR (train one with 'specdeploy train-head')")
        if settings.speculative and settings.num_draft_tokens + 1 > self.model.max_rows:
            raise ConfigError(
                f"num_draft_tokens={settings.num_draft_tokens} needs {settings.num_draft_tokens + 1} rows per "
                f"verify pass, more than the {self.model.max_rows} the engines were built for; lower it or "
                f"rebuild them with 'specdeploy build-engines BUNDLE --max-prompt {settings.num_draft_tokens + 1}'"
            )
        return settings

    def _next(self, logits: np.ndarray, params: SamplingParams, rng) -> int:
        """Token from one full-model logits row [V]."""
        if params.greedy:
            return int(logits.argmax())
        return sample(warp(logits[None], params)[0], rng)

    def generate(self, prompt: list[int], config: GenerationConfig,
                 stats: GenerationStats | None = None) -> Iterator[Emitted]:
        """Yield committed tokens step by step; stops at EOS (not yielded) or max_new_tokens."""
        stats = stats if stats is not None else GenerationStats()
        settings, rng = self.check_fits(len(prompt), config), np.random.default_rng(config.seed)
        drafter = self.drafters[settings.draft_source]
        stats.prompt_tokens = len(prompt)
        began = time.perf_counter()
        valid = len(prompt)
        self.history[:valid] = prompt
        hidden = self.model.prefill(prompt, self.prefill_chunk)  # [1, H]: the prompt's last row
        pending = self._next(self.model.logits(hidden)[0], settings.sampling, rng)
        stats.prefill_s = stats.first_token_s = time.perf_counter() - began
        produced, started = 0, time.perf_counter()
        step = Emitted((pending,), (False,), "prefill")
        while True:
            keep = self._trim(step, config, produced)
            produced += len(keep.tokens)
            stats.generated_tokens = produced
            stats.decode_s = time.perf_counter() - started
            if keep.tokens:
                yield keep
            if len(keep.tokens) < len(step.tokens) or produced >= config.max_new_tokens:
                return
            self.history[valid] = pending
            room = config.max_new_tokens - produced - 1  # never draft past max_new_tokens
            drafts = min(settings.num_draft_tokens, room) if settings.speculative else 0
            step, valid, pending = self._round(valid, pending, drafts, drafter, settings, rng, stats)

    def _trim(self, step: Emitted, config: GenerationConfig, produced: int) -> Emitted:
        """Cut a step at the first EOS (dropped) and at max_new_tokens."""
        n = min(len(step.tokens), config.max_new_tokens - produced)
        if not config.ignore_eos:
            for i, token in enumerate(step.tokens[:n]):
                if token in self.eos:
                    n = i
                    break
        return Emitted(step.tokens[:n], step.drafted[:n], step.source)

    def _round(self, valid: int, pending: int, num_draft_tokens: int, drafter, settings: DecodeSettings,
               rng, stats):
        """One round from `pending` at row `valid`: returns (emitted, new valid, new pending)."""
        history = self.history[: valid + 1]
        params = settings.sampling
        began = time.perf_counter()
        draft = drafter.draft(history, pending, valid, num_draft_tokens, settings, rng) if num_draft_tokens else None
        if draft is None:  # plain step: speculation off, no room left, or nothing to look up
            draft = Draft([], None, self.model.draft_pass([pending], valid), PLAIN)
        drafted = time.perf_counter()
        final = self.model.verify_pass(draft.hidden, valid)  # [m+1, H]
        target_logits = self.model.logits(final)           # [m+1, V]
        stats.draft_s += drafted - began
        stats.verify_s += time.perf_counter() - drafted
        if params.greedy:
            accepted, token = accept_greedy(draft.tokens, target_logits)
        else:
            accepted, token = accept_sampled(draft.tokens, draft.probs, warp(target_logits, params), rng)
        committed = draft.tokens[:accepted]
        self.history[valid + 1 : valid + 1 + accepted] = committed
        stats.record_round(draft.source, len(draft.tokens), accepted)
        if params.greedy:  # what drafters time prices greedy choices only: sampled rounds also warp
            drafter.observe(draft, accepted, time.perf_counter() - began)
        emitted = Emitted((*committed, token), (True,) * accepted + (False,), draft.source)
        return emitted, valid + accepted + 1, token
