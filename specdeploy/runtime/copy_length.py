"""How many tokens a greedy lookup round copies: the length whose expected tokens per second is best.

A copied token is worth drafting only when the tokens it is expected to add pay for the verify row
it costs. With fp32 kernels on a CPU an extra row costs a tenth of a step and copying everything a
match offers is nearly free; with integer kernels an extra row can cost a third of a step or more,
and a rejected copy of four tokens loses more than a plain step gains. Both sides are measured as
the engine runs, so the choice follows the machine and the text:

* `RowCosts`: seconds of plain rounds, and of lookup rounds by the rows they verified relative to
  the plain rounds of their moment; a line through the measured points prices row counts not yet
  seen;
* `CopyAcceptance`: how often the j-th copied token was accepted once the ones before it were,
  per evidence class of the match (its length: a 4-token match predicts its continuation better
  than a 1-token one; and whether the text contradicted it before: `find_continuation`).

Greedy output does not depend on the choice, only its speed; sampled rounds copy what the match
offers, so a seed's text never depends on what the machine measured.
"""
from __future__ import annotations

import numpy as np

from ..constants import MAX_DRAFT_TOKENS, MAX_NGRAM

CONTESTED = MAX_NGRAM + 1      # added to a match's length when its n-gram went on otherwise before
EVIDENCE_CLASSES = 2 * CONTESTED  # 0 (no match), lengths 1..MAX_NGRAM, and the same contested


class RowCosts:
    """Decayed mean seconds of a plain round, and of longer rounds relative to the plain rounds of
    their moment.

    A longer round is recorded as its seconds over the plain rounds' mean when it ran, not as
    seconds: copies are rare where they rarely pay, so the last two-row rounds can be minutes old,
    and a VM's speed moves by a fifth in that time (lab/notes/benchmarks-history.md). Set against plain rounds
    timed since, old seconds made a row look cheap after the machine slowed and dear after it sped
    up; a ratio to the plain rounds around it moves with the machine, as the bench's paired
    speedups do. On a machine whose speed holds, both give the same prices.
    """

    MIN_WEIGHT = 3.0  # a row count's own mean is used once it has about this many rounds

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.plain_sum = 0.0                               # decayed seconds of plain rounds
        self.relative_sum = np.zeros(MAX_DRAFT_TOKENS + 2)  # [rows] decayed seconds / plain mean
        self.weight = np.zeros(MAX_DRAFT_TOKENS + 2)        # [rows]

    def add(self, rows: int, seconds: float) -> None:
        if rows == 1:
            self.plain_sum = self.decay * self.plain_sum + seconds
        elif self.weight[1] > 0:  # priced against the plain rounds of its moment
            self.relative_sum[rows] = self.decay * self.relative_sum[rows] + seconds / self.plain_seconds
        else:
            return  # nothing to set it against yet (decoding starts with plain rounds)
        self.weight[rows] = self.decay * self.weight[rows] + 1.0

    @property
    def plain_seconds(self) -> float:
        return self.plain_sum / self.weight[1]

    def seconds(self, max_rows: int) -> np.ndarray | None:
        """Expected seconds of a round over 1..max_rows rows at the plain rounds' current speed:
        [max_rows]; None until a plain round and a longer one were seen. Row counts with few rounds
        of their own come from a line through the plain rounds and the longer rounds' slopes
        (weighted by their rounds)."""
        if self.weight[1] == 0 or not self.weight[2:].any():
            return None
        relative = self.relative_sum / np.maximum(self.weight, 1e-12)    # [rows] in plain rounds
        relative[1] = 1.0
        longer = np.flatnonzero(self.weight[2:]) + 2
        slopes = (relative[longer] - 1.0) / (longer - 1)
        slope = max(float(self.weight[longer] @ slopes / self.weight[longer].sum()), 0.0)
        rows = np.arange(1, max_rows + 1)
        line = 1.0 + slope * (rows - 1)
        own = self.weight[1 : max_rows + 1] >= self.MIN_WEIGHT
        return self.plain_seconds * np.where(own, relative[1 : max_rows + 1], line)


class CopyAcceptance:
    """Decayed counts of the j-th copied token accepted after its predecessors, per evidence class."""

    PRIOR = (1.0, 2.0)  # one acceptance in two tries: an unseen first copy starts at a coin flip

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.accepted = np.zeros((EVIDENCE_CLASSES, MAX_DRAFT_TOKENS))  # [n, j] by evidence class n
        self.tried = np.zeros((EVIDENCE_CLASSES, MAX_DRAFT_TOKENS))     # [n, j]

    def add(self, match: int, drafted: int, accepted: int) -> None:
        """A round copied `drafted` tokens after an n-token match; the first `accepted` were kept."""
        self.accepted[match] *= self.decay
        self.tried[match] *= self.decay
        self.tried[match, : min(accepted + 1, drafted)] += 1.0
        self.accepted[match, :accepted] += 1.0

    def expected_tokens(self, match: int, available: int) -> np.ndarray:
        """Expected tokens a round emits when it copies d = 0..available tokens: [available + 1]."""
        return self.expected_table(available)[match]

    def expected_table(self, available: int) -> np.ndarray:
        """Expected tokens by evidence class n and copy length d = 0..available: [n, available + 1].

        A position this class has rarely reached borrows what every class shows
        there: once a copy has been accepted, the next copied token usually is too (copied text
        goes on), and a coin-flip prior would keep long matches copying one token at a time.
        Where no class has reached a later position yet, it starts from what first copies
        show: with a coin flip there, a passage repeated verbatim (every copy accepted) kept
        copying one token a round when one slow round had made a second copy look dear, since
        no second copy was ever tried to prove the flip wrong.
        """
        hits, tries = self.PRIOR
        first = (self.accepted[:, 0].sum() + hits) / (self.tried[:, 0].sum() + tries)
        later = (self.accepted[:, 1:].sum() + first * tries) / (self.tried[:, 1:].sum() + tries)
        prior = np.full(available, later * tries)  # [available] prior hits per position
        prior[:1] = hits
        keep = (self.accepted[:, :available] + prior) / (self.tried[:, :available] + tries)  # [n, d]
        ones = np.ones((len(keep), 1))
        return np.concatenate([ones, 1.0 + np.cumsum(np.cumprod(keep, axis=1), axis=1)], axis=1)


class CopyLength:
    """Chooses a greedy lookup round's length; 0 means a plain step pays better than any copy.

    The lengths are priced into a table (by evidence class and tokens offered) every REFRESH
    observed rounds rather than at every match: the measurements move a little each round, and
    pricing them at every match cost more than a percent of a step on the CPU (cold caches after
    each pass make a hundred small numpy calls slow), which lost what the copies won on text
    that rarely repeats. Young measurements move a lot, so the prices are redone after each of the
    first YOUNG observed rounds and after 16 and 32: the first table rests on the acceptance prior, and
    kept for 64 rounds it copied at nearly every match of the example's QA prompts
    (`lab/scripts/round_overhead.py engine-int4.plan`: 56 rejected copies in 239 rounds; 21 in 249
    re-priced early).
    """

    MARGIN = 0.05        # a copy must beat a plain step by this much: the plain step is the safer choice
    EXPLORE_EVERY = 32   # every so many matches, copy one token more than pays, to keep learning
    REFRESH = 64         # observed rounds between re-pricings of the table
    YOUNG = 8            # re-priced after every one of the first observed rounds

    def __init__(self):
        self.costs, self.acceptance, self.choices = RowCosts(), CopyAcceptance(), 0
        self.table: np.ndarray | None = None  # [n, offered] best copy length, None: re-price
        self.observed = 0

    def observe(self, rows: int, match: int, drafted: int, accepted: int, seconds: float) -> None:
        """A plain (match 0, rows 1) or lookup round that took `seconds`."""
        self.costs.add(rows, seconds)
        if match and drafted:
            self.acceptance.add(match, drafted, accepted)
        self.observed += 1
        young = self.observed <= self.YOUNG or self.observed in (16, 32)  # the counts are few
        if young or self.observed % self.REFRESH == 0:
            self.table = None

    def choose(self, match: int, available: int) -> int:
        self.choices += 1
        table = self.table if self.table is not None else self._price()
        best = int(table[match, available])
        if self.choices % self.EXPLORE_EVERY == 0:
            return min(best + 1, available)  # re-check one copy more than pays: the cheapest lesson
        return best

    def _price(self) -> np.ndarray:
        """Best copy length by evidence class and tokens offered: [n, offered]; kept once priced."""
        shape = (EVIDENCE_CLASSES, MAX_DRAFT_TOKENS + 1)
        if self.costs.weight[1] == 0:
            return np.zeros(shape, np.int64)  # a plain round first: every copy is priced against it
        prices = self.costs.seconds(MAX_DRAFT_TOKENS + 1)                     # [d + 1]
        if prices is None:  # nothing to price longer rounds with yet: copy it all, and learn
            return np.broadcast_to(np.arange(MAX_DRAFT_TOKENS + 1), shape)
        rates = self.acceptance.expected_table(MAX_DRAFT_TOKENS) / prices     # [n, d + 1] tokens/s
        best_rate = np.maximum.accumulate(rates, axis=1)                    # [n, d + 1] over d' <= d
        before = np.concatenate([np.full((len(rates), 1), -np.inf), best_rate[:, :-1]], axis=1)
        record = np.where(rates > before, np.arange(rates.shape[1]), 0)      # a new best at d
        best = np.maximum.accumulate(record, axis=1)                          # first argmax over d' <= d
        table = np.where(best_rate > rates[:, :1] * (1 + self.MARGIN), best, 0)
        self.table = table
        return table
