import numpy as np

from specdeploy.runtime.drafting import find_continuation


def test_lookup_prefers_longest_most_recent_match():
    history = np.array([1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 1, 2, 3])
    # suffix [1, 2, 3] matched at 0 -> continuation [9, 9, 7, ...]; [2, 3] alone would match later
    assert find_continuation(history, 3, 2, 4).tolist() == [9, 9, 7]
    assert find_continuation(history, 10, 2, 2).tolist() == [4, 5, 6, 1, 2, 3]


def test_lookup_without_match_is_empty():
    assert find_continuation(np.array([1, 2, 3, 4]), 5, 2, 4).tolist() == []
    assert find_continuation(np.array([1]), 5, 1, 4).tolist() == []
