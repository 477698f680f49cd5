"""The reports' 100-episode windows (:func:`gper.training.report.scan_windows`) against a written-out
oracle: the best window's mean and the first window at the goal, for any epoch split."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gper.training.report import mean_last100, scan_windows


def _oracle(returns: list[float], steps: list[int], new: int, goal: float | None):
    """Every window of 100 that ends at one of the newest ``new`` returns, summed in Python."""
    best, solved = -math.inf, None
    for end in range(len(returns) - new + 1, len(returns) + 1):
        if end < 100:
            continue
        window = math.fsum(returns[end - 100 : end]) / 100
        best = max(best, window)
        if solved is None and goal is not None and window >= goal:
            solved = steps[end - 1]
    return best, solved


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("integers", [True, False], ids=["integer-returns", "real-returns"])
def test_windows_match_the_oracle_for_any_epoch_split(seed, integers):
    rng = random.Random(seed)
    total = rng.randint(150, 600)
    returns = [float(rng.randint(0, 500)) if integers else rng.uniform(-3.0, 500.0) for _ in range(total)]
    returns[rng.randrange(100, total)] = 501.0  # a window at the goal somewhere
    steps = sorted(rng.sample(range(10 * total), total))
    goal = sorted(_oracle(returns, steps, total, None)[0] - d for d in (0.0, 5.0))[rng.randrange(2)]
    cuts = sorted(rng.sample(range(1, total), 5))
    seen, best, solved = 0, -math.inf, None
    for cut in [*cuts, total]:  # epoch by epoch, as a report scans them
        b, s = scan_windows(returns[:cut], steps[seen:cut], goal)
        want_b, want_s = _oracle(returns[:cut], steps[:cut], cut - seen, goal)
        assert b == pytest.approx(want_b, rel=1e-12, abs=1e-12) if want_b > -math.inf else b == -math.inf
        if solved is None:
            assert s == want_s
            solved = s
        best, seen = max(best, b), cut
    assert best == scan_windows(returns, np.asarray(steps, dtype=np.float64), goal)[0]  # one scan of all
    assert solved == scan_windows(returns, steps, goal)[1] is not None
    if integers:  # whole numbers: every summation order is exact
        assert best == _oracle(returns, steps, total, None)[0]


def test_short_histories_and_no_goal():
    assert scan_windows([1.0] * 99, list(range(99)), 0.0) == (-math.inf, None)  # no window of 100 yet
    assert scan_windows([1.0] * 100, [5], None) == (1.0, None)
    assert scan_windows([1.0] * 100 + [2.0] * 5, list(range(5)), 1.04) == (1.05, 3)  # the 4th new episode's window
    assert math.isnan(mean_last100([]))
    assert mean_last100([2.0, 4.0]) == 3.0


def test_the_last_window_is_the_running_mean():
    rng = random.Random(7)
    returns = [rng.uniform(0.0, 1.0) for _ in range(250)]
    means = [scan_windows(returns[:k], [0], None)[0] for k in range(100, 251)]
    assert means == [mean_last100(returns[:k]) for k in range(100, 251)]


def test_a_nan_return_leaves_the_other_windows_their_best():
    """A NaN return (an environment's) spoils the windows that hold it, not the epoch's best."""
    returns = [float("nan")] + [1.0] * 99 + [2.0] * 50
    best, solved = scan_windows(returns, list(range(150)), 1.4)
    assert best == 1.5 and solved == 139  # best: the last window (50 of each); first at 1.4: 40 of 2.0
    assert scan_windows([float("nan")] * 100, list(range(100)), 0.0) == (-math.inf, None)
