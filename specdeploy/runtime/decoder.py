"""The decoding loop: prefill, then rounds of draft -> verify -> accept -> commit.

The loop knows speculation and nothing about backends. Both caches are valid up to `valid`;
`pending` is the last token sampled from the full model and not yet fed. Rejected draft rows stay
in the KV buffers past the valid length and are overwritten by the next round: rollback is free.

Prefix reuse: the KV rows a generation leaves stay valid for the tokens that made them (the
model tracks how many rows no pass has overwritten since), so the next prompt is prefilled only
from the first token where it differs. A row is bitwise the same whichever pass computed it, so
the output is the output of a fresh prefill. One sequence is kept, in the buffers decoding uses
anyway: no memory beyond them, and a multi-turn chat (the edge case: one user, one conversation)
reuses all of its history.
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
from .feature_drafting import SOURCE as FEATURE
from .logprobs import TokenLogprob, token_logprobs
from .processors import RowProcessor
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
    logprobs: tuple[TokenLogprob, ...] | None = None  # one a token, when the config asks for them


class Decoder:
    def __init__(self, model: SplitModel, vocab_ids: np.ndarray | None = None,
                 confidence_threshold: float | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 feature_vocab: np.ndarray | None = None, bundle=None):
        """`bundle`: the bundle's directory, whose tokenizer structured output reads."""
        self.model, self.bundle = model, bundle
        self.prefill_chunk = min(prefill_chunk, model.max_rows)  # rows one prefill pass carries
        self.eos = set(model.manifest.model.eos_token_ids)
        early = EarlyExitDrafter(model, vocab_ids, confidence_threshold)
        lookup = LookupDrafter(model)
        hybrid = HybridDrafter(lookup, early, probe_exit=model.manifest.exit_can_pay)
        self.drafters = {"early_exit": early, "lookup": lookup, "hybrid": hybrid}
        self.history = np.zeros(model.max_context + 1, np.int64)  # prompt + committed + pending
        self.reuse = feature_vocab is None  # a feature head keeps KV rows of its own, not reused
        self.grammars = None  # grammar.Grammars, made at the first constrained request
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
        self._check_rows(settings)
        if settings.response_format is not None:
            self._grammars().constraint(settings.response_format)  # compiles: a bad schema is refused now
        return settings

    def _check_rows(self, settings: DecodeSettings) -> None:
        rows = settings.num_draft_tokens + 1
        if not settings.speculative or rows <= (self.model.fixed_rows or self.model.max_rows):
            return
        if self.model.fixed_rows:
            raise ConfigError(f"num_draft_tokens={settings.num_draft_tokens} needs {rows} rows per verify pass, more "
                              f"than the {self.model.fixed_rows} every pass carries here (fixed_rows); lower it or "
                              f"open the engine with fixed_rows={rows}")
        raise ConfigError(
            f"num_draft_tokens={settings.num_draft_tokens} needs {rows} rows per verify pass, more than the "
            f"{self.model.max_rows} the engines were built for; lower it or rebuild them with "
            f"'specdeploy build-engines BUNDLE --max-prompt {rows}'")

    def _first(self, logits: np.ndarray, processor: RowProcessor, params: SamplingParams, rng, top) -> Emitted:
        """The first token, from the prompt's last logits row [1, V]."""
        processed = processor.apply(logits, [])
        if params.greedy:
            token = int(processed[0].argmax())
        else:
            token = sample(warp(processed, params)[0], rng)
        processor.commit([token])
        logprobs = None if top is None else tuple(token_logprobs(logits, [token], top))
        return Emitted((token,), (False,), "prefill", logprobs)

    def reusable(self, prompt: list[int]) -> int:
        """Prompt tokens whose KV rows the buffers still hold; at least one token is prefilled, for its logits."""
        if not self.reuse:
            return 0
        kept = self.history[: min(self.model.kept, len(prompt) - 1)]
        differs = np.flatnonzero(kept != np.asarray(prompt[: len(kept)]))
        return int(differs[0]) if len(differs) else len(kept)

    def _prefill(self, prompt: list[int], stats: GenerationStats) -> np.ndarray:
        """The prompt's last final hidden row [1, H], prefilled from the first row not kept."""
        start = self.reusable(prompt)
        self.history[: len(prompt)] = prompt
        stats.cached_tokens = start
        hidden = self.model.prefill(prompt, self.prefill_chunk, start)
        self.model.kept = len(prompt)
        return hidden

    def generate(self, prompt: list[int], config: GenerationConfig,
                 stats: GenerationStats | None = None) -> Iterator[Emitted]:
        """Yield committed tokens step by step; stops at EOS (not yielded) or max_new_tokens."""
        stats = stats if stats is not None else GenerationStats()
        settings, rng = self.check_fits(len(prompt), config), np.random.default_rng(config.seed)
        processor = self._processor(settings, prompt)
        drafter = self.drafters[settings.draft_source]
        stats.prompt_tokens = len(prompt)
        began = time.perf_counter()
        hidden = self._prefill(prompt, stats)  # [1, H]: the prompt's last row
        step = self._first(self.model.logits(hidden), processor, settings.sampling, rng, config.logprobs)
        valid, pending = len(prompt), step.tokens[0]
        stats.prefill_s = stats.first_token_s = time.perf_counter() - began
        produced, started = 0, time.perf_counter()
        ignore_eos = config.ignore_eos and processor.constraint is None  # a grammar's end is the end
        while True:
            keep = self._trim(step, config, produced, ignore_eos)
            produced += len(keep.tokens)
            stats.generated_tokens = produced
            stats.decode_s = time.perf_counter() - started
            if keep.tokens:
                yield keep
            if len(keep.tokens) < len(step.tokens) or produced >= config.max_new_tokens or processor.finished:
                return
            self.history[valid] = pending
            room = config.max_new_tokens - produced - 1  # never draft past max_new_tokens
            drafts = min(settings.num_draft_tokens, room) if settings.speculative else 0
            step, valid, pending = self._round(valid, pending, drafts, drafter, settings, rng, stats,
                                               processor, config.logprobs)
            self.model.kept = valid

    def _grammars(self):
        if self.grammars is None:
            from .grammar import Grammars

            if self.bundle is None:
                raise ConfigError("structured output needs the bundle's tokenizer: open the bundle with Engine")
            self.grammars = Grammars(self.model.manifest, self.bundle)
        return self.grammars

    def _processor(self, settings: DecodeSettings, prompt: list[int]) -> RowProcessor:
        fmt = settings.response_format
        constraint = None if fmt is None else self._grammars().constraint(fmt)
        return RowProcessor(settings.penalties, prompt, self.model.manifest.model.vocab_size, constraint)

    def prompt_logprobs(self, prompt: list[int], top: int) -> list[TokenLogprob | None]:
        """Each prompt token's log-probability given the tokens before it (None for the first), with
        `top` alternatives. The prompt's KV rows are kept: a generation that follows reuses them."""
        self.check_fits(len(prompt), GenerationConfig(max_new_tokens=1))
        self.history[: len(prompt)] = prompt
        out: list[TokenLogprob | None] = [None]
        for start in range(0, len(prompt), self.prefill_chunk):
            rows = prompt[start : start + self.prefill_chunk]
            final = self.model.verify_pass(self.model.draft_pass(rows, start), start)   # [C, H]
            nexts = prompt[start + 1 : start + 1 + len(rows)]
            if nexts:  # the prompt's last token has nothing after it to score
                out += token_logprobs(self.model.logits(final[: len(nexts)]), nexts, top)  # [C, V] logits
        self.model.kept = len(prompt)
        return out

    def _trim(self, step: Emitted, config: GenerationConfig, produced: int, ignore_eos: bool) -> Emitted:
        """Cut a step at the first EOS (dropped) and at max_new_tokens."""
        n = min(len(step.tokens), config.max_new_tokens - produced)
        if not ignore_eos:
            for i, token in enumerate(step.tokens[:n]):
                if token in self.eos:
                    n = i
                    break
        logprobs = None if step.logprobs is None else step.logprobs[:n]
        return Emitted(step.tokens[:n], step.drafted[:n], step.source, logprobs)

    def _round(self, valid: int, pending: int, num_draft_tokens: int, drafter, settings: DecodeSettings,
               rng, stats, processor: RowProcessor, top: int | None):
        """One round from `pending` at row `valid`: returns (emitted, new valid, new pending)."""
        history = self.history[: valid + 1]
        params = settings.sampling
        began = time.perf_counter()
        draft = drafter.draft(history, pending, valid, num_draft_tokens, settings, rng) if num_draft_tokens else None
        if draft is None:  # plain step: speculation off, no room left, or nothing to look up
            draft = Draft([], None, self.model.draft_pass([pending], valid), PLAIN)
        draft = _cut(draft, processor, params.greedy, keep_whole=not self.reuse)
        drafted = time.perf_counter()
        final = self.model.verify_pass(draft.hidden, valid)  # [m+1, H]
        raw = self.model.logits(final)                      # [m+1, V]
        target_logits = processor.apply(raw, draft.tokens)  # [m+1, V] each row after its own prefix
        stats.draft_s += drafted - began
        stats.verify_s += time.perf_counter() - drafted
        if params.greedy:
            accepted, token = accept_greedy(draft.tokens, target_logits)
        else:
            accepted, token = accept_sampled(draft.tokens, draft.probs, warp(target_logits, params), rng)
        committed = draft.tokens[:accepted]
        processor.commit([*committed, token])
        self.history[valid + 1 : valid + 1 + accepted] = committed
        stats.record_round(draft.source, len(draft.tokens), accepted)
        if params.greedy:  # what drafters time prices greedy choices only: sampled rounds also warp
            drafter.observe(draft, accepted, time.perf_counter() - began)
        logprobs = None if top is None else tuple(token_logprobs(raw[: accepted + 1], [*committed, token], top))
        emitted = Emitted((*committed, token), (True,) * accepted + (False,), draft.source, logprobs)
        return emitted, valid + accepted + 1, token


def _cut(draft: Draft, processor: RowProcessor, greedy: bool, keep_whole: bool = False) -> Draft:
    """The draft up to its first token the grammar forbids, which could never be accepted. Only
    where cutting keeps the result exact: greedy, or a copied (one-hot) draft when sampling; a
    sampled distribution's draws stay, for rejection sampling against the masked rows to judge. A
    feature head's drafter reads the features of the rows each draft pass wrote, so where a bundle has
    one (`keep_whole`) every draft stays whole and the masked rows reject what the grammar forbids."""
    keep = processor.allowed(draft.tokens)
    if keep == len(draft.tokens) or keep_whole or draft.source == FEATURE or not (greedy or draft.probs is None):
        return draft
    probs = None if draft.probs is None else draft.probs[:keep]
    return Draft(draft.tokens[:keep], probs, draft.hidden[: keep + 1], draft.source, draft.match)
