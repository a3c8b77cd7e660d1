import numpy as np
import pytest

from specdeploy.errors import ConfigError
from specdeploy.config import check_ngram
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
    tokens, n = find_continuation(history, 10, 2, 2)
    assert (tokens.tolist(), n) == ([4, 5, 6, 1, 2, 3], 2)


def test_lookup_reports_how_far_back_the_match_agrees():
    history = np.array([7, 1, 2, 3, 4, 5, 9, 8, 1, 2, 3, 4, 5])
    tokens, match = find_continuation(history, 2, 2, 4)  # the 4-gram [2, 3, 4, 5] agrees back to 1
    assert (tokens.tolist(), match) == ([9, 8], 5)
    copied = np.array([*range(20), *range(20)])
    assert find_continuation(copied, 2, 2, 4)[1] == 8  # capped


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

    def observe(self, *args):
        pass


def _observe(hybrid: HybridDrafter, source: str, tokens: int, seconds: float) -> None:
    hybrid.observe(Draft([], None, np.zeros((1, 1)), source), tokens - 1, seconds)


class _Marker:
    def draft(self, *args):
        return "early"


def _picks(rounds: int, early: tuple[int, float], plain: tuple[int, float]) -> list:
    """The hybrid's fallback choices when early exit and plain rounds yield (tokens, seconds)."""
    hybrid = HybridDrafter(_Never(), _Marker())
    picks = []
    for _ in range(rounds):
        choice = hybrid.draft(None, 0, 0, 4, GREEDY, None)
        picks.append(choice)
        _observe(hybrid, *(("early_exit", *early) if choice == "early" else ("plain", *plain)))
    return picks


def test_hybrid_falls_back_to_the_faster_of_early_exit_and_plain():
    picks = _picks(64, early=(1, 0.022), plain=(1, 0.02))  # early exit 45 tok/s, plain 50 tok/s
    assert picks[:6].count("early") == 3  # measures both first
    later = picks[10:]
    assert later.count(None) > 0.9 * len(later) and "early" in later  # plain wins, early re-checked
    clear = _picks(600, early=(1, 0.05), plain=(1, 0.02))[10:]  # 20 vs 50 tok/s: re-checked 8x less often
    assert 1 <= clear.count("early") <= len(clear) // 200


def test_hybrid_rechecks_a_standing_verdict_ever_more_rarely():
    """Each re-check of a source that loses clearly costs ~2 plain steps: the interval doubles."""
    picks = _picks(6000, early=(1, 0.05), plain=(1, 0.02))[10:]
    checks = [i for i, pick in enumerate(picks) if pick == "early"]
    assert 3 <= len(checks) <= 5  # after ~256, 512, 1024, 2048 choices (was every 256: 23)
    assert all(b - a > 1.5 * (a - c) for c, a, b in zip(checks, checks[1:], checks[2:]))


def test_hybrid_needs_a_margin_to_leave_plain_steps():
    picks = _picks(80, early=(101, 2.0), plain=(1, 0.02))  # early exit 1% faster: within the margin
    assert picks[10:].count(None) > 0.9 * len(picks[10:])


def test_hybrid_keeps_early_exit_when_it_is_faster():
    picks = _picks(40, early=(3, 0.03), plain=(1, 0.03))
    assert picks[10:].count("early") > 0.85 * len(picks[10:])


def test_hybrid_never_times_its_choice_when_sampling():
    """A seed must give the same text whatever the machine measured: no early exit when sampling."""
    hybrid = HybridDrafter(_Never(), _Marker())
    for _ in range(20):
        _observe(hybrid, "early_exit", 5, 0.01)  # early exit looks much faster
        _observe(hybrid, "plain", 1, 0.05)
    assert hybrid.draft(None, 0, 0, 4, GREEDY, None) == "early"
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
    and how many tokens ending there equal the last ones (at most max(8, ngram_max))."""
    for n in range(min(ngram_max, len(history) - 1), ngram_min - 1, -1):
        for at in range(len(history) - 1 - n, -1, -1):
            if history[at : at + n].tolist() == history[len(history) - n :].tolist():
                cap = min(max(8, ngram_max), at + n)
                agree = next((k for k in range(cap) if history[at + n - 1 - k] != history[-1 - k]), cap)
                return history[at + n : at + n + (num_draft_tokens if n > 1 else 1)].tolist(), agree
    return [], 0


def test_lookup_search_matches_its_definition():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        history = rng.integers(0, rng.integers(2, 8), rng.integers(1, 40))
        low = int(rng.integers(1, 4))
        high, gamma = int(rng.integers(low, 6)), int(rng.integers(1, 6))
        tokens, match = find_continuation(history, gamma, low, high)
        assert (tokens.tolist(), match) == _reference_continuation(history, gamma, low, high)
