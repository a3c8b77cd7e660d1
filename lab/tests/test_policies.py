from policies import CopyAll, FixedRule, Pooled
from specdeploy.runtime.copy_length import CONTESTED


def test_the_fixed_rule_reads_the_agreement_contested_or_not():
    rule = FixedRule()
    assert [rule.choose(m, 4) for m in (1, 2, 3, 4, 8)] == [0, 1, 1, 4, 4]
    assert [rule.choose(m + CONTESTED, 4) for m in (1, 2, 4)] == [0, 1, 4]
    assert CopyAll().choose(1 + CONTESTED, 3) == 3


def test_pooled_learns_contested_matches_with_the_rest_of_their_length():
    """Contested one-token copies kept, the others too: all of it lands in the length's class (the
    default keeps them apart: tests/runtime/test_copy_length.py)."""
    pooled = Pooled()
    for match in (1, 1 + CONTESTED) * 20:
        pooled.observe(2, match, 1, 1, 0.012)
    assert pooled.acceptance.tried[1 + CONTESTED].sum() == 0 and pooled.acceptance.tried[1, 0] > 0
    assert pooled.choose(1, 1) == pooled.choose(1 + CONTESTED, 1)
