import numpy as np

from specdeploy.runtime.copy_length import CONTESTED, CopyAcceptance, CopyLength, RowCosts


def _run(policy: CopyLength, rounds: int, step_s: float, row_s: float, accept, match: int = 2,
         offered: int = 4) -> list[int]:
    """Lengths chosen when a round over r rows takes step_s + row_s*(r-1) and accept(d) tokens are kept."""
    chosen = []
    for _ in range(rounds):
        d = policy.choose(match, offered)
        chosen.append(d)
        policy.observe(d + 1, match if d else 0, d, accept(d), step_s + row_s * d)
    return chosen


def test_row_costs_price_unseen_rows_with_a_line_through_the_measured_ones():
    costs = RowCosts()
    assert costs.seconds(3) is None
    for _ in range(5):
        costs.add(1, 0.010)
    assert costs.seconds(3) is None  # no longer round seen: no slope yet
    costs.add(5, 0.018)
    assert np.allclose(costs.seconds(5), [0.010, 0.012, 0.014, 0.016, 0.018])
    for _ in range(5):
        costs.add(2, 0.015)  # seen often enough: its own mean, and it moves the line
    prices = costs.seconds(3)
    assert np.isclose(prices[1], 0.015) and 0.014 < prices[2] < 0.020


def test_row_costs_follow_the_machine_when_its_speed_moves_between_copies():
    """Two-row rounds cost 20% more than the plain rounds around them; then the machine slows to
    half speed and only plain rounds run for a while: a row stays 20% of a plain round."""
    costs = RowCosts()
    for _ in range(10):
        costs.add(1, 0.010)
        costs.add(2, 0.012)
    assert np.allclose(costs.seconds(2), [0.010, 0.012])  # a steady machine: the plain means
    for _ in range(40):
        costs.add(1, 0.020)
    assert np.allclose(costs.seconds(3), [0.020, 0.024, 0.028], rtol=0.01)  # not the old rounds' 0.012
    costs.add(2, 0.024)
    assert np.allclose(costs.seconds(2), [0.020, 0.024], rtol=0.01)
    fresh = RowCosts()
    fresh.add(3, 0.015)  # before any plain round: nothing to price it against
    assert fresh.weight[3] == 0 and fresh.seconds(3) is None


def test_acceptance_counts_each_position_given_its_predecessors():
    acceptance = CopyAcceptance(decay=1.0)
    for _ in range(98):
        acceptance.add(3, drafted=4, accepted=1)  # first copy kept, second always rejected
    expected = acceptance.expected_tokens(3, 4)
    assert expected[0] == 1.0 and np.isclose(expected[1], 1.99, atol=0.01)
    assert np.isclose(expected[2], expected[1], atol=0.02)  # the second copy adds nothing
    # an unseen match length: a coin flip for the first copy, the pooled later positions after it
    # (0 of 98 kept, after a prior of two tries at the first copies' rate, 99 / 100)
    later = 2 * (99 / 100) / (98 + 2)
    assert np.allclose(acceptance.expected_tokens(2, 2), [1.0, 1.5, 1.5 + 0.5 * later])


def test_rarely_reached_positions_borrow_what_other_match_lengths_show():
    acceptance = CopyAcceptance(decay=1.0)
    for _ in range(50):
        acceptance.add(3, drafted=4, accepted=4)  # copies of 3-token matches go on
    acceptance.add(8, drafted=1, accepted=1)
    expected = acceptance.expected_tokens(8, 4)
    assert expected[4] - expected[3] > 0.5  # the 4th copy after a long match is expected to be kept


def test_a_passage_accepted_copy_by_copy_is_soon_copied_in_long_runs():
    """A verbatim repeat: every copy accepted. One slow 2-row round (a noisy machine) made a second
    copy look unprofitable on a coin-flip guess, and with no second copy tried the guess stayed:
    one or two tokens a round for most of a short passage (the example model's 2.1 a round)."""
    policy, chosen = CopyLength(), []
    for i, (match, offered) in enumerate([(0, 0), (1, 1)] + [(8, 8)] * 8):
        d = policy.choose(match, offered) if match else 0
        chosen.append(d)
        slow = 0.016 if i == 1 else 0.0
        policy.observe(d + 1, match if d else 0, d, d, 0.060 + 0.004 * d + slow)
    assert chosen[1] == 1 and max(chosen[2:6]) >= 4, chosen


def _geometric(p: float):
    """Each copied token kept with probability p once the ones before it were."""
    rng = np.random.default_rng(0)
    return lambda d: int(np.argmin(np.append(rng.random(d) < p, False)))


def test_cheap_rows_copy_everything_offered():
    chosen = _run(CopyLength(), 200, step_s=0.010, row_s=0.0005, accept=_geometric(0.8))
    assert chosen[50:].count(4) > 0.85 * 150


def test_rows_that_cost_more_than_their_expected_tokens_give_plain_steps():
    chosen = _run(CopyLength(), 200, step_s=0.010, row_s=0.006, accept=_geometric(0.5))
    assert chosen[50:].count(0) > 0.85 * 150


def test_expensive_rows_copy_only_what_tends_to_be_accepted():
    chosen = _run(CopyLength(), 200, step_s=0.010, row_s=0.004, accept=lambda d: min(d, 1))
    later = chosen[50:]
    assert later.count(1) > 0.85 * len(later)  # one copy pays (2 tokens for 1.4 steps), more do not
    assert later.count(2) >= len(later) // 40  # one more copy still re-checked now and then


def test_copies_that_are_always_rejected_give_plain_steps():
    chosen = _run(CopyLength(), 200, step_s=0.010, row_s=0.003, accept=lambda d: 0)
    later = chosen[50:]
    assert later.count(0) > 0.85 * len(later)


def test_match_lengths_are_priced_apart():
    policy = CopyLength()
    for _ in range(100):  # 1-token matches are rejected, 4-token matches accepted
        for match, accept in ((1, lambda d: 0), (4, lambda d: d)):
            d = policy.choose(match, 4)
            policy.observe(d + 1, match if d else 0, d, accept(d), 0.010 + 0.003 * d)
    assert policy.choose(1, 4) == 0 and policy.choose(4, 4) == 4


def test_contested_matches_are_priced_apart_from_the_rest_of_their_length():
    """One-token matches whose n-gram went on otherwise before are rejected, the others mostly
    accepted: pooled, a copy pays at 60% of tries (0.5 tokens for 0.3 of a step); apart, only the
    uncontested ones are copied."""
    policy = CopyLength()
    for _ in range(150):
        for match, accept in ((1, lambda d: min(d, 1)), (1 + CONTESTED, lambda d: 0), (1, lambda d: min(d, 1))):
            d = policy.choose(match, 1)
            policy.observe(d + 1, match if d else 0, d, accept(d), 0.010 + 0.003 * d)
    assert policy.choose(1, 1) == 1 and policy.choose(1 + CONTESTED, 1) == 0


def _priced_now(policy: CopyLength, match: int, available: int) -> int:
    """The best length from the measurements as they stand: expected tokens per second of each."""
    rates = policy.acceptance.expected_tokens(match, available) / policy.costs.seconds(available + 1)
    best = int(rates.argmax())
    return best if best and rates[best] > rates[0] * (1 + policy.MARGIN) else 0


def test_the_priced_table_is_the_best_length_for_every_match_and_offer():
    rng = np.random.default_rng(1)
    for _ in range(20):
        policy = CopyLength()
        policy.observe(1, 0, 0, 0, 0.01)  # decoding starts with plain rounds: nothing is copied before one
        for _ in range(int(rng.integers(5, 80))):
            d = int(rng.integers(0, 5))
            match = int(rng.integers(1, 9)) if d else 0
            policy.observe(d + 1, match, d, int(rng.integers(0, d + 1)), 0.01 + float(rng.random()) * 0.004 * d)
        policy.observe(1, 0, 0, 0, 0.01)
        table = policy._price()
        for match in range(1, 9):
            for available in range(1, 6):
                assert table[match, available] == _priced_now(policy, match, available)


def test_lengths_are_repriced_every_few_observed_rounds_not_at_every_match():
    policy = CopyLength()
    for _ in range(policy.REFRESH // 2):  # priced at the first match after these
        policy.observe(1, 0, 0, 0, 0.010)
        policy.observe(3, 2, 2, 2, 0.011)  # cheap rows, copies kept: copy what is offered
    assert policy.choose(2, 2) == 2
    for _ in range(policy.REFRESH - 1):
        policy.observe(3, 2, 2, 0, 0.030)  # now rows are dear and copies rejected
    assert policy.choose(2, 2) == 2       # the table stands until the next re-pricing
    for _ in range(30):
        policy.observe(3, 2, 2, 0, 0.030)
    assert policy.choose(2, 2) == 0


def test_young_measurements_are_repriced_sooner():
    """Text that rarely repeats: each 1-token copy is rejected and a row costs a fifth of a step.
    The first table, priced on the acceptance prior's coin flip, copies; re-priced after 1, 2, 4,
    ... rounds (not only every REFRESH) it stops within a few, but for the re-checks."""
    chosen = _run(CopyLength(), 64, step_s=0.0076, row_s=0.0014, accept=lambda d: 0, match=1, offered=1)
    assert chosen[:2].count(1) >= 1          # the prior copies at first
    assert chosen[16:].count(1) <= 2         # then only the every-32nd re-check

