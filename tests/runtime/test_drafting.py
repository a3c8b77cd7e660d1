import numpy as np
import pytest

from specdeploy.errors import ConfigError
from specdeploy.config import check_ngram
from specdeploy.runtime.copy_length import CONTESTED
from specdeploy.runtime.drafting import Draft, HybridDrafter, LookupDrafter, find_continuation
from specdeploy.config import SamplingParams
from specdeploy.runtime.settings import DecodeSettings


def _settings(temperature: float) -> DecodeSettings:
    return DecodeSettings(True, 4, "hybrid", (1, 4), SamplingParams(temperature))


GREEDY, SAMPLED = _settings(0.0), _settings(1.0)


def test_lookup_prefers_longest_most_recent_match():
    history = np.array([1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 1, 2, 3])
    # suffix [1, 2, 3] matched at 0 -> continuation [9, 9, 7, ...]; [2, 3] alone would match later
    tokens, n = find_continuation(history, 3, 2, 4)
    assert (tokens.tolist(), n) == ([9, 9, 7], 3)
    tokens, n = find_continuation(history, 10, 2, 2)  # [2, 3] went on with 9 the time before
    assert (tokens.tolist(), n) == ([4, 5, 6, 1, 2, 3], 2 + CONTESTED)


def test_lookup_reports_how_far_back_the_match_agrees():
    history = np.array([7, 1, 2, 3, 4, 5, 9, 8, 1, 2, 3, 4, 5])
    tokens, match = find_continuation(history, 2, 2, 4)  # the 4-gram [2, 3, 4, 5] agrees back to 1
    assert (tokens.tolist(), match) == ([9, 8], 5)
    copied = np.array([*range(20), *range(20)])
    assert find_continuation(copied, 2, 2, 4)[1] == 8  # capped


def test_a_match_the_text_went_on_from_otherwise_before_is_contested():
    # [3] occurred twice before: followed by 4 most recently, by 9 the time before
    tokens, match = find_continuation(np.array([3, 9, 1, 3, 4, 2, 3]), 2, 1, 4)
    assert (tokens.tolist(), match) == ([4], 1 + CONTESTED)
    tokens, match = find_continuation(np.array([3, 4, 1, 3, 4, 2, 3]), 2, 1, 4)  # both times by 4
    assert (tokens.tolist(), match) == ([4], 1)
    assert find_continuation(np.array([3, 9, 2, 3]), 2, 1, 4)[1] == 1  # one occurrence: nothing against it
    assert find_continuation(np.array([3, 3, 3]), 2, 1, 4)[1] < CONTESTED  # overlapping: went on alike


def test_lookup_without_match_is_empty():
    assert find_continuation(np.array([1, 2, 3, 4]), 5, 2, 4)[1] == 0
    assert find_continuation(np.array([1]), 5, 1, 4)[0].tolist() == []


def test_single_token_matches_copy_one_token_when_the_range_allows_them():
    history = np.array([5, 6, 7, 8, 6])
    assert find_continuation(history, 3, 2, 4)[0].tolist() == []
    assert find_continuation(history, 3, 1, 4)[0].tolist() == [7]
    assert find_continuation(np.array([5, 6, 7, 8, 5, 6]), 3, 1, 4)[0].tolist() == [7, 8, 5]  # n = 2: up to γ


def test_lookup_search_ignores_byte_matches_across_tokens():
    history = np.array([256, 0, 5, 1])  # the bytes of token 1 start inside token 256
    assert find_continuation(history, 4, 1, 4)[1] == 0
    history = np.array([1, 9, 256, 0, 1])
    assert find_continuation(history, 4, 1, 4)[0].tolist() == [9]  # the aligned, earlier one


@pytest.mark.parametrize("bad", [(3, 2), (0, 2), (1, 17), (True, 2), ("2", 4), (2,), 4, None])
def test_bad_ngram_ranges_say_what_to_pass(bad):
    with pytest.raises(ConfigError, match=r"lookup_ngram=.*e\.g\. \(2, 4\)"):
        check_ngram(bad)


def test_ngram_ranges_from_json_lists_are_accepted():
    assert check_ngram([1, 3]) == (1, 3)


class _Never:
    def draft(self, *args):
        return None

    def propose(self, *args):
        return [], 0

    def observe(self, *args):
        pass


def _observe(hybrid: HybridDrafter, source: str, tokens: int, seconds: float) -> None:
    hybrid.observe(Draft([], None, np.zeros((1, 1)), source), tokens - 1, seconds)


class _Marker:
    def draft(self, history, pending, start, tokens, settings, rng):
        return ("early", tokens)

    def observe(self, *args):
        pass


def _picks(rounds: int, plain: tuple[int, float], probe: tuple[int, float],
           full: tuple[int, float] | None = None) -> list:
    """The hybrid's choices for rounds without a lookup match: None (a plain step), ("early", 1) (a
    one-token early-exit probe) or ("early", 4), when plain steps, probes and full rounds of four
    yield (tokens, seconds)."""
    hybrid = HybridDrafter(_Never(), _Marker())
    picks = []
    for _ in range(rounds):
        choice = hybrid.draft(None, 0, 0, 4, GREEDY, None)
        picks.append(choice)
        outcome = plain if choice is None else probe if choice[1] == 1 else full
        _observe(hybrid, "plain" if choice is None else "early_exit", *outcome)
    return picks


def test_hybrid_falls_back_to_the_faster_of_early_exit_and_plain():
    picks = _picks(64, plain=(1, 0.02), probe=(1, 0.022))  # one-token rounds 45 tok/s, plain 50 tok/s
    assert picks[:6].count(("early", 1)) == 3  # measures both first
    later = picks[10:]
    assert later.count(None) > 0.9 * len(later) and ("early", 1) in later  # plain wins, early re-checked
    clear = _picks(600, plain=(1, 0.02), probe=(1, 0.05))[10:]  # 20 vs 50 tok/s: re-checked 8x less often
    assert 1 <= clear.count(("early", 1)) <= len(clear) // 200


def test_a_losing_early_exit_is_only_ever_tried_one_draft_token_at_a_time():
    """The first draft token is the likeliest accepted at the same cost a row: when one-token rounds
    lose to plain steps, longer ones would lose more, so they are never run."""
    picks = _picks(3000, plain=(1, 0.02), probe=(1, 0.05), full=(1, 0.1))
    assert ("early", 1) in picks and ("early", 4) not in picks


def test_hybrid_rechecks_a_standing_verdict_ever_more_rarely():
    """Each re-check of a source that loses clearly costs a slow round: the interval doubles."""
    picks = _picks(6000, plain=(1, 0.02), probe=(1, 0.05))[10:]
    checks = [i for i, pick in enumerate(picks) if pick is not None]
    assert 3 <= len(checks) <= 5  # after ~256, 512, 1024, 2048 choices (was every 256: 23)
    assert all(b - a > 1.5 * (a - c) for c, a, b in zip(checks, checks[1:], checks[2:]))


def test_rounds_that_yield_no_more_tokens_are_never_judged_faster_by_their_timings():
    """A probe whose drafts are all rejected emits one token, as a plain step does, at a higher cost:
    timings that say it is faster (noise) do not make the hybrid run it beyond its re-checks."""
    picks = _picks(600, plain=(1, 0.02), probe=(1, 0.015))[10:]
    assert picks.count(None) > 0.95 * len(picks) and ("early", 4) not in picks
    picks = _picks(600, plain=(1, 0.03), probe=(2, 0.035), full=(2, 0.03))[16:]  # full: no more tokens
    assert picks.count(("early", 1)) > 0.95 * len(picks)


def test_hybrid_needs_a_margin_to_leave_plain_steps():
    picks = _picks(80, plain=(1, 0.02), probe=(101, 2.0))  # one-token rounds 1% faster: within the margin
    assert picks[10:].count(None) > 0.9 * len(picks[10:])


def test_hybrid_drafts_the_full_length_when_it_beats_one_token_rounds():
    picks = _picks(60, plain=(1, 0.03), probe=(2, 0.035), full=(4, 0.05))  # 33 / 57 / 80 tok/s
    assert picks[16:].count(("early", 4)) > 0.85 * len(picks[16:])


def test_hybrid_keeps_one_token_rounds_when_longer_ones_lose_to_them():
    picks = _picks(60, plain=(1, 0.03), probe=(2, 0.035), full=(2.5, 0.06))  # 33 / 57 / 42 tok/s
    assert picks[16:].count(("early", 1)) > 0.85 * len(picks[16:])


def test_hybrid_never_times_its_choice_when_sampling():
    """A seed must give the same text whatever the machine measured: no early exit when sampling."""
    hybrid = HybridDrafter(_Never(), _Marker())
    for _ in range(20):
        _observe(hybrid, "early_exit", 5, 0.01)  # early exit looks much faster
        _observe(hybrid, "plain", 1, 0.05)
    assert hybrid.draft(None, 0, 0, 4, GREEDY, None)[0] == "early"
    assert all(hybrid.draft(None, 0, 0, 4, SAMPLED, None) is None for _ in range(40))


class _DraftGraph:
    def draft_pass(self, tokens, start):
        return np.zeros((len(tokens), 2))  # [S, H]


def test_lookup_length_is_priced_at_greedy_only():
    """A seed's text must not depend on measurements: sampled rounds copy what the match offers."""
    lookup = LookupDrafter(_DraftGraph())
    lookup.length.choose = lambda match, offered: 0  # as if every copy had been measured to lose
    history = np.array([5, 6, 7, 8, 9, 5, 6])
    assert lookup.draft(history, 6, 6, 4, GREEDY, None) is None
    sampled = lookup.draft(history, 6, 6, 4, SAMPLED, None)
    assert sampled.tokens == [7, 8, 9, 5] and sampled.match == 0
    lookup.length.choose = lambda match, offered: 2
    greedy = lookup.draft(history, 6, 6, 4, GREEDY, None)
    assert greedy.tokens == [7, 8] and greedy.match == 2 and greedy.hidden.shape == (3, 2)


def _reference_continuation(history, num_draft_tokens, ngram_min, ngram_max):
    """The definition, searched the slow way: longest suffix n-gram first, its most recent match,
    how many tokens ending there equal the last ones (at most max(8, ngram_max)), and CONTESTED
    added when the match before it went on with another token."""
    for n in range(min(ngram_max, len(history) - 1), ngram_min - 1, -1):
        found = [at for at in range(len(history) - 1 - n, -1, -1)
                 if history[at : at + n].tolist() == history[len(history) - n :].tolist()]
        if found:
            at = found[0]
            cap = min(max(8, ngram_max), at + n)
            agree = next((k for k in range(cap) if history[at + n - 1 - k] != history[-1 - k]), cap)
            contested = len(found) > 1 and history[found[1] + n] != history[at + n]
            return history[at + n : at + n + (num_draft_tokens if n > 1 else 1)].tolist(), agree + CONTESTED * contested
    return [], 0


def test_lookup_search_matches_its_definition():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        history = rng.integers(0, rng.integers(2, 8), rng.integers(1, 40))
        low = int(rng.integers(1, 4))
        high, gamma = int(rng.integers(low, 6)), int(rng.integers(1, 6))
        tokens, match = find_continuation(history, gamma, low, high)
        assert (tokens.tolist(), match) == _reference_continuation(history, gamma, low, high)
