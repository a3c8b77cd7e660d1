"""Draft sources: where a round's proposed tokens come from.

Every source returns the same `Draft`: the proposed tokens, their draft distributions (None for a
deterministic proposal), and the h_k rows of the pending token and every drafted token, whose
draft-layer KV rows are written as a side effect. The verify pass then starts from those rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import SamplingParams
from ..constants import MAX_DRAFT_TOKENS, PLAIN
from .copy_length import CONTESTED, CopyLength
from .sampling import sample, warp
from .settings import DecodeSettings
from .split_model import SplitModel


@dataclass
class Draft:
    tokens: list[int]
    probs: np.ndarray | None  # [m, V] warped draft distributions, None when one-hot
    hidden: np.ndarray        # [m+1, H] h_k rows of the pending token and each draft
    source: str
    match: int = 0            # a greedy lookup round: its match's evidence class (find_continuation; 0: any other)


class EarlyExitDrafter:
    """Draft token by token through the draft graph and the (calibrated) draft head."""

    competes_with_copies = False  # a draft pass a token: too dear to ask where a copy is on offer

    def __init__(self, model: SplitModel, vocab_ids: np.ndarray | None, threshold: float | None):
        self.model, self.vocab_ids, self.threshold = model, vocab_ids, threshold
        hidden, vocab = model.manifest.model.hidden_size, model.manifest.model.vocab_size
        self.hidden = np.zeros((MAX_DRAFT_TOKENS + 1, hidden), model.manifest.kv_dtype)  # [γmax+1, H]
        self.probs = np.zeros((MAX_DRAFT_TOKENS, vocab), np.float64)                     # [γmax, V]

    def _pick(self, logits: np.ndarray, params: SamplingParams, rng, row: int) -> tuple[int, float]:
        """(token id in the full vocabulary, draft top probability) from draft logits [V']."""
        if params.greedy:
            best = int(logits.argmax())
            confidence = 1.0
            if self.threshold is not None:
                confidence = float(1.0 / np.exp(logits - logits[best]).sum())
            return self._full_id(best), confidence
        q = warp(logits[None], params)[0]  # [V']
        self.probs[row] = 0.0
        if self.vocab_ids is None:
            self.probs[row] = q
        else:
            self.probs[row, self.vocab_ids] = q
        return self._full_id(sample(q, rng)), float(q.max())

    def observe(self, draft: Draft, accepted: int, seconds: float) -> None:
        """Greedy round outcomes, reported by the decoder (unused: early exit always drafts)."""

    def _full_id(self, index: int) -> int:
        return index if self.vocab_ids is None else int(self.vocab_ids[index])

    def draft(self, history, pending: int, start: int, num_draft_tokens: int, settings: DecodeSettings,
              rng) -> Draft:
        tokens: list[int] = []
        token, params = pending, settings.sampling
        for i in range(num_draft_tokens):
            h = self.model.draft_pass([token], start + i)  # [1, H]
            self.hidden[i] = h[0]
            candidate, confidence = self._pick(self.model.draft_logits(h)[0], params, rng, i)
            if self.threshold is not None and confidence < self.threshold:
                break  # rows 0..i hold h_k of the pending token and the i drafts
            tokens.append(candidate)
            token = candidate
        else:  # every draft kept: the last one still needs its h_k row (no logits)
            self.hidden[num_draft_tokens] = self.model.draft_pass([token], start + num_draft_tokens)[0]
        m = len(tokens)
        probs = None if params.greedy else self.probs[:m]
        return Draft(tokens, probs, self.hidden[: m + 1], "early_exit")


MATCH_CAP = 8  # match lengths past this predict a copy no better: one class for the rest


def find_continuation(history: np.ndarray, num_draft_tokens: int, ngram_min: int,
                      ngram_max: int) -> tuple[np.ndarray, int]:
    """(tokens that followed the most recent earlier match of the longest suffix n-gram, match), or (empty, 0).

    A single-token match is weak evidence: it copies one token. On a CPU a drafted row costs a
    tenth to a quarter of a step, and longer copies after one matching token are mostly rejected.
    `match` is the evidence class the copy's acceptance is learned by: how far back the match
    agrees, past the n-gram (up to MATCH_CAP), since text being copied agrees far back and its
    continuation is far likelier to be accepted; plus CONTESTED when the n-gram occurred once more
    before and went on with another token there. Such a match is the text's own counter-example:
    on the example's greedy int4 outputs a first copy after a one-token match was accepted 11% of
    the time when contested and 30% when not (lab/notes/benchmarks-history.md). Every round searches, between
    passes that leave the caches cold, so the search is a few byte searches in C (longest n-gram
    first) rather than numpy calls or a Python loop over the history: those cost 1% of a step
    where copies rarely pay.
    """
    last, width = len(history) - 1, history.itemsize
    longest = min(ngram_max, last)
    earlier, suffix = history[:last].tobytes(), history[last + 1 - longest :].tobytes()  # width bytes a token
    for n in range(longest, ngram_min - 1, -1):
        needle = suffix[(longest - n) * width :]
        at = _last_occurrence(earlier, needle, width)
        if at >= 0:
            before = _last_occurrence(earlier, needle, width, (at + n - 1) * width)  # the one before it
            contested = bool(before >= 0 and history[before + n] != history[at + n])
            at += n - 1  # where the earlier n-gram ends
            take = num_draft_tokens if n > 1 else min(num_draft_tokens, 1)
            match = _agreement(history, at, max(MATCH_CAP, ngram_max))
            return history[at + 1 : at + 1 + take], match + CONTESTED * contested
    return history[:0], 0


def _last_occurrence(haystack: bytes, needle: bytes, width: int, end: int | None = None) -> int:
    """Token index where the last token-aligned occurrence of `needle` within haystack[:end] starts, or -1."""
    end = len(haystack) if end is None else end
    while True:
        at = haystack.rfind(needle, 0, end)
        if at < 0 or at % width == 0:
            return at // width if at >= 0 else -1
        end = at + len(needle) - 1  # a match straddling two tokens: look further back


def _agreement(history: np.ndarray, at: int, cap: int) -> int:
    """How many tokens ending at `at` equal the history's last ones (at most cap)."""
    span = min(cap, at + 1)
    mine, last = history[at + 1 - span : at + 1].tolist(), history[len(history) - span :].tolist()
    n = 0
    while n < span and mine[span - 1 - n] == last[span - 1 - n]:
        n += 1
    return n


class LookupDrafter:
    """Copy the continuation of an earlier occurrence of the last n tokens (prompt lookup).

    The copied tokens are a deterministic proposal; one batched draft-graph call writes their
    draft-layer KV rows and returns the h_k rows the verify pass needs. At greedy, how many of the
    offered tokens to copy is priced by `CopyLength` from measured row costs and acceptance. The
    n-gram range comes with each call's settings: a drafter shared by many requests holds no
    per-request state, only machine-wide measurements.
    """

    def __init__(self, model: SplitModel):
        self.model, self.length = model, CopyLength()

    def observe(self, draft: Draft, accepted: int, seconds: float) -> None:
        """Greedy plain and lookup rounds price rows; lookup rounds also measure acceptance."""
        if draft.source in (PLAIN, "lookup"):
            self.length.observe(len(draft.tokens) + 1, draft.match, len(draft.tokens), accepted, seconds)

    def propose(self, history, num_draft_tokens: int, settings: DecodeSettings) -> tuple[list[int], int]:
        """The copy this round would draft and its match's evidence class (no tokens: none)."""
        if num_draft_tokens == 0:
            return [], 0
        continuation, match = find_continuation(history, num_draft_tokens, *settings.lookup_ngram)
        if not settings.sampling.greedy:
            match = 0  # a seed's text must not depend on measurements: copy what the match offers
        elif match:
            continuation = continuation[: self.length.choose(match, len(continuation))]
        return [int(t) for t in continuation], match

    def expected_accepted(self, match: int, copied: int) -> float:
        """Copied tokens a greedy round is expected to accept, by its match's evidence class."""
        return float(self.length.acceptance.expected_tokens(match, copied)[copied] - 1.0)

    def materialize(self, tokens: list[int], match: int, pending: int, start: int) -> Draft:
        hidden = self.model.draft_pass([pending, *tokens], start)  # [m+1, H]
        return Draft(tokens, None, hidden, "lookup", match)

    def draft(self, history, pending: int, start: int, num_draft_tokens: int, settings: DecodeSettings,
              rng) -> Draft | None:
        tokens, match = self.propose(history, num_draft_tokens, settings)
        return self.materialize(tokens, match, pending, start) if tokens else None


class RateEstimate:
    """Exponentially weighted tokens per second of one kind of round."""

    def __init__(self, decay: float = 0.9):
        self.decay, self.tokens, self.seconds, self.weight, self.rounds = decay, 0.0, 0.0, 0.0, 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.decay * self.tokens + tokens
        self.seconds = self.decay * self.seconds + seconds
        self.weight = self.decay * self.weight + 1.0
        self.rounds += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_round(self) -> float:
        return self.tokens / self.weight if self.weight > 0 else 0.0


class Verdict:
    """Whether one kind of round beats a baseline kind: measured, then re-checked ever more rarely.

    A few rounds of each to start (alternating), then this kind only while its measured tokens per
    second beat the baseline's by a margin, re-checking the standing verdict now and then: rarely
    when it loses clearly (each re-check costs a slow round), the interval doubling while re-checks
    leave the verdict as it was and starting again short when it changes (the text moved on). An
    uncalibrated int4 bundle's early exit accepted nothing on QA prompts, so each re-check cost
    about two plain steps before the interval doubled.

    Timings alone are not trusted to say a kind is faster: each kind compared here costs more a
    round than its baseline (a probe is a plain step plus a draft pass and a verify row; a full
    round drafts and verifies more than a probe), so it can only be faster by yielding more tokens
    a round, and a measured rate that says otherwise is the machine's noise. On the Intel VM an
    uncalibrated int4 exit whose drafts were all rejected was measured faster than plain steps on
    the reasoning prompts and ran seven early-exit rounds there (16 drafts, none accepted).
    """

    MIN_ROUNDS, EXPLORE_EVERY = 3, 32
    MARGIN = 0.02        # this kind must beat the baseline by this much: the baseline is the safer choice
    CLEAR_LOSS = 0.75    # below this fraction of the baseline's rate it is re-checked 8x less often
    MAX_INTERVAL = 4096  # choices between re-checks once the verdict has long stood

    def __init__(self):
        self.rate = RateEstimate()
        self.choices, self.faster, self.interval, self.next_check = 0, None, 0, 0

    def pays(self, baseline: RateEstimate) -> bool:
        mine = self.rate
        self.choices += 1
        if mine.rounds < self.MIN_ROUNDS or baseline.rounds < self.MIN_ROUNDS:
            return mine.rounds <= baseline.rounds
        faster = mine.rate > baseline.rate * (1 + self.MARGIN) and mine.per_round > baseline.per_round
        if faster != self.faster:
            self.faster = faster
            self.interval = self.EXPLORE_EVERY * (8 if mine.rate < baseline.rate * self.CLEAR_LOSS else 1)
            self.next_check = self.choices + self.interval
        if self.choices < self.next_check:
            return faster
        self.interval = min(2 * self.interval, self.MAX_INTERVAL)
        self.next_check = self.choices + self.interval
        return not faster


class HybridDrafter:
    """Lookup when the context offers a match this round; otherwise early exit or a plain step.

    Whether early exit pays depends on the bundle (calibrated or not, fp32 or integer kernels, whose
    extra verify rows cost far more on CPUs without dot-product instructions) and on the text, so
    at greedy the choice is measured (`Verdict`), as a ladder: early-exit rounds of one draft token
    ("probes") against plain steps, and only while probes pay, rounds of the full draft length
    against probes. The first draft token is the one likeliest to be accepted (the j-th is accepted
    only if all before it were) at the same cost per row, so when one-token rounds lose to plain
    steps, longer ones lose too: exploring and re-checking a losing early exit with probes costs
    less than full rounds did (one draft pass and a two-row verify instead of four passes and a
    five-row verify). Greedy output is the same whatever is chosen. A lookup match is not priced by
    a rate averaged over other contexts (measured: that dropped the copies that pay on
    summarisation) but by its match length and the cost of each copied row (`CopyLength`); when it
    declines, the round is one of the above. When sampling, the drafts decide which random numbers
    are drawn, so a timed choice would make a seed give different text from run to run: a round
    without a lookup match is a plain step. A bundle with a feature head drafts with the head in the
    early exit's place, priced the same way; where a weak copy is on offer the head's chain is asked
    too and the round drafts whichever is expected to add more (`_rival_chain`).
    """

    STRONG_COPY = 0.75  # a copy expected to be accepted this much is taken without asking a feature head

    def __init__(self, lookup: LookupDrafter, early_exit: EarlyExitDrafter, probe_exit: bool = True):
        """`probe_exit`: False where the exit agrees too rarely to ever pay (`exit_agreement`)."""
        self.lookup, self.early_exit, self.probe_exit = lookup, early_exit, probe_exit
        self.plain, self.probe, self.full = RateEstimate(), Verdict(), Verdict()
        self.probing = False  # what the last early-exit round was, for observe()

    def observe(self, draft: Draft, accepted: int, seconds: float) -> None:
        if draft.source == PLAIN:
            self.plain.add(accepted + 1, seconds)
        elif draft.source in ("early_exit", "feature"):  # the model's own drafter: its exit, or its feature head
            (self.probe if self.probing else self.full).rate.add(accepted + 1, seconds)
        self.lookup.observe(draft, accepted, seconds)
        self.early_exit.observe(draft, accepted, seconds)  # a feature head sizes its drafts by these

    def _rival_chain(self, copy: list[int], match: int, start: int, num_draft_tokens: int, settings, rng) -> list[int]:
        """A feature head's chain where it is expected to add more than the copy on offer (a weak
        match: at most STRONG_COPY of it expected to be accepted), else nothing. Both are priced
        with the rows the head's rounds were timed at; asking costs head calls, a few percent of a
        step each, so a strong copy is taken without asking."""
        expected = self.lookup.expected_accepted(match, len(copy))
        if not self.early_exit.competes_with_copies or expected >= self.STRONG_COPY * len(copy):
            return []
        chain = self.early_exit.propose(start, num_draft_tokens, settings, rng)
        prices = self.early_exit.row_prices(num_draft_tokens)
        copy_gain = expected - float(prices[: len(copy)].sum())
        return chain if chain and self.early_exit.expected_gain(len(chain), prices) > copy_gain else []

    def _early_tokens(self, num_draft_tokens: int) -> int:
        """Draft tokens for a round without a lookup match: 0 (plain step), 1 (probe) or all; full
        rounds are measured only once probes stand measured as faster than plain steps."""
        if not self.probe_exit or not self.probe.pays(self.plain):
            return 0
        if num_draft_tokens > 1 and self.probe.faster and self.full.pays(self.probe.rate):
            return num_draft_tokens
        return 1

    def draft(self, history, pending, start, num_draft_tokens, settings: DecodeSettings, rng) -> Draft | None:
        if not settings.sampling.greedy:
            return self.lookup.draft(history, pending, start, num_draft_tokens, settings, rng)
        copy, match = self.lookup.propose(history, num_draft_tokens, settings)
        if copy:
            chain = self._rival_chain(copy, match, start, num_draft_tokens, settings, rng)
            if chain:
                self.probing = False
                return self.early_exit.materialize(chain, pending, start, settings)
            return self.lookup.materialize(copy, match, pending, start)
        tokens = self._early_tokens(num_draft_tokens)
        if tokens == 0:
            return None
        self.probing = tokens == 1
        return self.early_exit.draft(history, pending, start, tokens, settings, rng)
