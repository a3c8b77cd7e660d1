"""Lookup copy-length policies the default's is measured against (lab/scripts/copy_replay.py,
lab/scripts/copy_length_ab.py): each is a `CopyLength` with one choice changed, so it learns as the
default does and only its choices differ."""
from __future__ import annotations

from specdeploy.runtime.copy_length import CONTESTED, CopyLength


class CopyAll(CopyLength):
    """What the lookup drafter did before copies were priced: everything a match offers."""

    def choose(self, match: int, available: int) -> int:
        return available


class FixedRule(CopyLength):
    """Nothing after a one-token agreement, one token after two or three, all of it after four."""

    def choose(self, match: int, available: int) -> int:
        match %= CONTESTED  # the agreement alone, contested or not
        return 0 if match < 2 else (1 if match < 4 else available)


class Pooled(CopyLength):
    """The default's pricing before contested matches had acceptance classes of their own."""

    def choose(self, match: int, available: int) -> int:
        return super().choose(match % CONTESTED, available)

    def observe(self, rows: int, match: int, drafted: int, accepted: int, seconds: float) -> None:
        super().observe(rows, match % CONTESTED, drafted, accepted, seconds)
