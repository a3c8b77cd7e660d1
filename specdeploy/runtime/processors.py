"""What a round's logits rows become before acceptance: penalties and a grammar, each row from its own prefix.

Row i of a verify pass scores the token after the committed text and drafts 0..i-1, so its
penalties count those drafts and its grammar mask is the grammar's state after them. A plain step
is the one-row case of the same arithmetic: where the drafts are accepted, each row is bitwise the
row a plain step would have processed, so greedy speculative output stays plain output and rejection
sampling keeps the processed distribution.
"""
from __future__ import annotations

import numpy as np

from ..config import Penalties
from .grammar import Constraint


class RowProcessor:
    """One generation's penalties and grammar. `commit` tells it the tokens the decoder kept."""

    def __init__(self, penalties: Penalties, prompt, vocab_size: int, constraint: Constraint | None = None):
        self.penalties, self.constraint = penalties, constraint
        self.counts = np.zeros(vocab_size, np.int32)    # [V] occurrences in the output
        self.seen = np.zeros(vocab_size, np.bool_)      # [V] in the prompt or the output
        self.seen[np.asarray(prompt, np.int64)] = True

    @property
    def active(self) -> bool:
        return self.penalties.active or self.constraint is not None

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing may follow but the end of the text."""
        return self.constraint is not None and self.constraint.done

    def allowed(self, drafts: list[int]) -> int:
        """How many of `drafts`, from the first, the grammar allows (all of them without one)."""
        return len(drafts) if self.constraint is None else self.constraint.allowed(drafts)

    def apply(self, logits: np.ndarray, drafts: list[int]) -> np.ndarray:
        """Processed logits [R, V] of raw rows [R, V]; row i follows drafts[:i]. The raw rows are
        returned as they are when nothing applies."""
        if not self.active:
            return logits
        out = np.array(logits, np.float32)                                      # [R, V]
        rows = out.shape[0]
        if self.penalties.active:
            self._penalize_rows(out, drafts[: rows - 1])
        if self.constraint is not None:
            masks = self.constraint.masks(drafts[: rows - 1])                   # [R, V'] allowed tokens
            out[:, : masks.shape[1]][~masks] = -np.inf
            out[:, masks.shape[1]:] = -np.inf  # columns past the tokenizer's vocabulary
        return out

    def _penalize_rows(self, out: np.ndarray, drafts: list[int]) -> None:
        """Row i penalized from the output so far plus drafts[:i]: the drafts are counted in place
        as the rows go and taken back after (no copy of the [V] counts a round)."""
        added: list[tuple[int, bool]] = []
        try:
            for i in range(out.shape[0]):
                if i:
                    token = drafts[i - 1]
                    added.append((token, bool(self.seen[token])))
                    self.counts[token] += 1
                    self.seen[token] = True
                self._penalize(out[i], self.counts, self.seen)
        finally:
            for token, was_seen in reversed(added):
                self.counts[token] -= 1
                self.seen[token] = was_seen

    def _penalize(self, row: np.ndarray, counts: np.ndarray, seen: np.ndarray) -> None:
        p = self.penalties
        if p.repetition != 1.0:  # CTRL / Hugging Face: shrink a seen token's score towards less likely
            ids = np.flatnonzero(seen)
            values = row[ids]
            row[ids] = np.where(values < 0, values * p.repetition, values / p.repetition)
        if p.presence or p.frequency:  # OpenAI: once per token seen in the output, once per occurrence
            ids = np.flatnonzero(counts)
            row[ids] -= p.frequency * counts[ids] + p.presence

    def commit(self, tokens: list[int]) -> None:
        if not tokens:
            return
        np.add.at(self.counts, np.asarray(tokens, np.int64), 1)
        self.seen[np.asarray(tokens, np.int64)] = True
        if self.constraint is not None:
            self.constraint.commit(tokens)
