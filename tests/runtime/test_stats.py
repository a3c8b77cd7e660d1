"""Per-generation statistics: acceptance by draft position, merged over generations."""
import pytest

from specdeploy.runtime.stats import GenerationStats

pytestmark = pytest.mark.unit


def test_acceptance_by_draft_position_counts_only_positions_reached():
    stats = GenerationStats()
    stats.record_round("feature", drafted=4, accepted=1)  # the 1st accepted, the 2nd rejected: 3rd, 4th unjudged
    stats.record_round("feature", drafted=2, accepted=2)
    stats.record_round("lookup", drafted=3, accepted=0)
    other = GenerationStats()
    other.record_round("feature", drafted=3, accepted=3)
    stats.merge(other)
    assert stats.per_position("feature") == [1.0, 2 / 3, 1.0, 0.0]
    assert stats.per_position("lookup") == [0.0, 0.0, 0.0]
    assert stats.positions["lookup"] == [[1, 0], [0, 0], [0, 0]]
    assert stats.to_dict()["acceptance_per_position"]["feature"] == [1.0, 0.6667, 1.0, 0.0]
