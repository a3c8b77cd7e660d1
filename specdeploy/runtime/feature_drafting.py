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
"""
from __future__ import annotations

import numpy as np

from ..config import SamplingParams
from ..constants import MAX_DRAFT_TOKENS
from .drafting import Draft
from .sampling import sample, warp
from .settings import DecodeSettings
from .split_model import SplitModel

SOURCE = "feature"


class FeatureDrafter:
    def __init__(self, model: SplitModel, history: np.ndarray, vocab_ids: np.ndarray):
        self.model, self.history, self.vocab_ids = model, history, vocab_ids
        hidden = model.manifest.model.hidden_size
        self.rows = np.zeros((model.max_rows, hidden), np.float32)   # [R, H] the last pass's projected features
        self.rows_start = self.rows_count = 0
        self.valid = 0          # head KV rows computed from committed positions' features
        self.in_step = True     # False once a pass's rows could not be read (another source's separate passes)
        self.probs = np.zeros((MAX_DRAFT_TOKENS, model.manifest.model.vocab_size), np.float64)  # [γmax, V]
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
        """Greedy round outcomes (unused: the hybrid prices this source)."""

    def _pick(self, logits: np.ndarray, params: SamplingParams, rng, row: int) -> int:
        if params.greedy:
            return int(self.vocab_ids[int(logits.argmax())])
        q = warp(logits[None], params)[0]  # [V']
        self.probs[row] = 0.0
        self.probs[row, self.vocab_ids] = q
        return int(self.vocab_ids[sample(q, rng)])

    def draft(self, history, pending: int, start: int, num_draft_tokens: int, settings: DecodeSettings,
              rng) -> Draft | None:
        caught = self._catch_up(start) if self.in_step else None
        if caught is None or num_draft_tokens == 0:
            return None
        logits, hidden = caught
        tokens: list[int] = []
        for i in range(num_draft_tokens):
            tokens.append(self._pick(logits[-1], settings.sampling, rng, i))
            if i + 1 < num_draft_tokens:  # the chain: own output, the token just drafted, next position
                logits, hidden = self.model.feature_head_pass(hidden[-1:], tokens[-1:], start + i)
        rows = self.model.draft_pass([pending, *tokens], start)  # [m+1, H]
        probs = None if settings.sampling.greedy else self.probs[: len(tokens)]
        return Draft(tokens, probs, rows, SOURCE)
