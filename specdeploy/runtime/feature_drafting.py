"""The feature head as a draft source: EAGLE-style drafts from the target's own features.

Every verify pass (prefill chunks included) also outputs, for its rows, the features the head reads
(the draft graph gives the low layer's, the verify graph the others: runtime/split_model.features).
The head keeps one KV row per committed position, computed from that position's features and the
token after it. Rows are committed once a later pass starts past them, so after each verify pass
the head first takes in the committed rows of the pass before it (their tokens are in the decoder's
history by then), then keeps this pass's projected features. A round then catches the head up to
the pending token and drafts from the head's own outputs, one head call a token; one batched
draft-graph call writes the drafts' draft-layer KV rows as lookup drafts do, and the verify pass and
rejection sampling are the same as for any source. Draft rows the verify pass rejects leave head
KV rows past the valid length, overwritten by the next round: the head rolls back with the model.

At greedy, a draft's length follows the head's confidence, as EAGLE-2 sizes its drafts: the j-th
draft token is kept while the chance that it and every one before it are accepted (the product of
the head's top probabilities, scaled by how often such predictions were borne out: `Calibration`)
is worth the extra row it costs (`RowCosts`: this source's rounds and plain steps, timed as the
engine runs). A first token not worth its row makes the round a plain step. Sampled rounds draft
the length asked for, so a seed's text never depends on what the machine measured.
"""
from __future__ import annotations

import numpy as np

from ..config import SamplingParams
from ..constants import MAX_DRAFT_TOKENS, PLAIN
from .copy_length import RowCosts
from .drafting import Draft
from .sampling import sample, warp
from .settings import DecodeSettings
from .split_model import SplitModel

SOURCE = "feature"
UNPRICED_ROW = 0.1  # a draft row's price in plain steps until rounds of this source were timed


class Calibration:
    """How often the j-th draft was accepted against the product of the head's confidences that
    predicted it (decayed sums, a prior of one borne-out prediction): the scale on that product."""

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.predicted = np.ones(MAX_DRAFT_TOKENS)   # [j]
        self.accepted = np.ones(MAX_DRAFT_TOKENS)    # [j]

    def add(self, predicted: np.ndarray, accepted: int) -> None:
        n = len(predicted)
        self.predicted[:n] = self.decay * self.predicted[:n] + predicted
        self.accepted[:n] = self.decay * self.accepted[:n] + (np.arange(n) < accepted)

    def scale(self) -> np.ndarray:
        return self.accepted / self.predicted                              # [j]


class FeatureDrafter:
    competes_with_copies = True  # cheap enough to ask every round (hybrid: the better of a copy and the chain)

    def __init__(self, model: SplitModel, history: np.ndarray, vocab_ids: np.ndarray):
        self.model, self.history, self.vocab_ids = model, history, vocab_ids
        hidden = model.manifest.model.hidden_size
        self.rows = np.zeros((model.max_rows, hidden), np.float32)   # [R, H] the last pass's projected features
        self.rows_start = self.rows_count = 0
        self.valid = 0          # head KV rows computed from committed positions' features
        self.in_step = True     # False once a pass's rows could not be read (another source's separate passes)
        self.probs = np.zeros((MAX_DRAFT_TOKENS, model.manifest.model.vocab_size), np.float64)  # [γmax, V]
        self.costs, self.calibration = RowCosts(), Calibration()
        self.chain = np.zeros(MAX_DRAFT_TOKENS)  # [γmax] the last greedy draft's products of confidences
        model.after_verify = self.after_verify

    def after_verify(self, start: int, rows: int) -> None:
        """Called by the model after each verify pass over rows [start, start + rows)."""
        if start == 0:  # a new prompt
            self.valid, self.rows_count, self.in_step = 0, 0, True
        if not self.in_step:
            return
        self._catch_up(start)
        outputs = self.model.outputs
        if any(next(iter(o.values())).shape[1] != rows for o in outputs.values()):
            self.in_step = False  # draft rows from separate passes: their features are gone
            return
        self.rows[:rows] = self.model.project_features(self.model.features())
        self.rows_start, self.rows_count = start, rows

    def _catch_up(self, to: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Head rows for committed positions [valid, to): returns the last call's (logits, hidden)."""
        if to <= self.valid:
            return None
        first = self.valid - self.rows_start
        if first < 0 or to - self.rows_start > self.rows_count:
            self.in_step = False  # positions whose features no pass has kept
            return None
        tokens = self.history[self.valid + 1 : to + 1]
        out = self.model.feature_head_pass(self.rows[first : to - self.rows_start], tokens, self.valid)
        self.valid = to
        return out

    def observe(self, draft: Draft, accepted: int, seconds: float) -> None:
        """Greedy rounds: plain steps and this source's rounds price rows; this source's rounds also
        calibrate its confidence."""
        if draft.source == PLAIN:
            self.costs.add(1, seconds)
        elif draft.source == SOURCE:
            self.costs.add(len(draft.tokens) + 1, seconds)
            self.calibration.add(self.chain[: len(draft.tokens)], accepted)

    def row_prices(self, n: int) -> np.ndarray:
        """[n] what the j-th draft's row adds to a round, in plain steps (head call, draft and verify row)."""
        seconds = self.costs.seconds(n + 1)                                  # [n + 1] rounds of 1..n+1 rows
        if seconds is None:
            return np.full(n, UNPRICED_ROW)
        return np.maximum(np.diff(seconds) / seconds[0], 0.0)

    def _pick(self, logits: np.ndarray, params: SamplingParams, rng, row: int) -> tuple[int, float]:
        """(token id, the head's probability of it) from draft logits [V']."""
        if params.greedy:
            best = int(logits.argmax())
            return int(self.vocab_ids[best]), float(1.0 / np.exp(logits - logits[best]).sum())
        q = warp(logits[None], params)[0]  # [V']
        self.probs[row] = 0.0
        self.probs[row, self.vocab_ids] = q
        index = sample(q, rng)
        return int(self.vocab_ids[index]), float(q[index])

    def expected_gain(self, drafted: int, prices: np.ndarray) -> float:
        """What the last greedy proposal's first `drafted` tokens are expected to add to a round, in
        plain steps: their calibrated chances of acceptance less their rows' prices."""
        chances = self.chain[:drafted] * self.calibration.scale()[:drafted]
        return float(np.sum(chances - prices[:drafted]))

    def draft(self, history, pending: int, start: int, num_draft_tokens: int, settings: DecodeSettings,
              rng) -> Draft | None:
        tokens = self.propose(start, num_draft_tokens, settings, rng)
        return self.materialize(tokens, pending, start, settings) if tokens else None

    def materialize(self, tokens: list[int], pending: int, start: int, settings: DecodeSettings) -> Draft:
        """The proposal as a draft: one batched draft-graph call writes its rows."""
        rows = self.model.draft_pass([pending, *tokens], start)  # [m+1, H]
        probs = None if settings.sampling.greedy else self.probs[: len(tokens)]
        return Draft(tokens, probs, rows, SOURCE)

    def propose(self, start: int, num_draft_tokens: int, settings: DecodeSettings, rng) -> list[int]:
        """The head's chain from row `start`, cut where its confidence stops paying (greedy)."""
        caught = self._catch_up(start) if self.in_step else None
        if caught is None or num_draft_tokens == 0:
            return []
        logits, hidden = caught
        greedy = settings.sampling.greedy
        worth = self.row_prices(num_draft_tokens) / self.calibration.scale()[:num_draft_tokens] if greedy else None
        tokens: list[int] = []
        chance = 1.0
        for i in range(num_draft_tokens):
            token, confidence = self._pick(logits[-1], settings.sampling, rng, i)
            chance *= confidence
            if greedy and chance < worth[i]:
                break  # this draft and any after it are expected to add less than their rows cost
            tokens.append(token)
            self.chain[i] = chance
            if i + 1 < num_draft_tokens:  # the chain: own output, the token just drafted, next position
                logits, hidden = self.model.feature_head_pass(hidden[-1:], tokens[-1:], start + i)
        return tokens
