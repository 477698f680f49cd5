"""Walk-forward folds by calendar months, calendar days and bars: windows, steps, edges, errors."""

from __future__ import annotations

import numpy as np
import pytest

from gper.envs.folds import HISTORY, WalkSpec, bar_units, spec_from, walk_forward_folds
from gper.envs.market import MIN_BARS
from gper.envs.market_data import business_days


def days(first: str, n: int) -> np.ndarray:
    return business_days(n, first).numpy()


def months_of(t: np.ndarray) -> np.ndarray:
    return t.astype("datetime64[ns]").astype("datetime64[M]")


def test_monthly_folds_hold_whole_calendar_months_and_roll_by_the_step():
    t = days("2001-01-01", 1300)  # weekdays into 2005
    folds = walk_forward_folds(t, WalkSpec("months", 12, 3, 2, 2))
    m = months_of(t)
    for k, f in enumerate(folds):
        assert f.index == k
        first = np.datetime64("2001-01", "M") + 2 * k
        assert m[f.train.start] == first and m[f.train.end - 1] == first + 11
        assert m[f.val.start] == first + 12 and m[f.val.end - 1] == first + 14
        assert m[f.test.start] == first + 15 and m[f.test.end - 1] == first + 16
        # adjacent windows: no bar skipped, none shared
        assert f.train.end == f.val.start and f.val.end == f.test.start
        # every bar of a month is in it: the month before the window starts ends just before
        assert m[f.train.start - 1] < first if f.train.start else True
    # the last fold's test window is the last whole one inside the data
    last_month = m[-1]
    assert m[folds[-1].test.end - 1] <= last_month
    assert m[folds[-1].test.end - 1] + 2 > last_month
    # test windows never overlap and follow each other in time
    tests = [(f.test.start, f.test.end) for f in folds]
    assert all(a[1] <= b[0] for a, b in zip(tests, tests[1:], strict=False))


def test_step_longer_than_test_leaves_gaps_between_test_windows():
    t = days("2010-01-01", 800)
    folds = walk_forward_folds(t, WalkSpec("months", 6, 1, 1, 3))
    m = months_of(t)
    starts = [m[f.test.start] for f in folds]
    assert all(b - a == 3 for a, b in zip(starts, starts[1:], strict=False))


def test_day_and_bar_units():
    t = days("2020-01-06", 400)
    by_days = walk_forward_folds(t, WalkSpec("days", 140, 28, 28, 28))
    d = t.astype("datetime64[ns]").astype("datetime64[D]")
    f = by_days[0]
    assert d[f.val.start] - d[0] >= np.timedelta64(140, "D") and d[f.train.end - 1] - d[0] < np.timedelta64(140, "D")
    by_bars = walk_forward_folds(t, WalkSpec("bars", 100, 20, 30, 30))
    assert [(f.train.start, f.val.start, f.test.start, f.test.end) for f in by_bars[:2]] == [
        (0, 100, 120, 150),
        (30, 130, 150, 180),
    ]
    assert by_bars[-1].test.end <= 400 and by_bars[-1].test.end + 30 > 400
    assert list(bar_units(t, "bars")[:3]) == [0, 1, 2]


def test_intraday_bars_group_by_their_utc_day():
    ns = np.int64(60 * 10**9)
    day0 = np.datetime64("2024-03-04T14:30", "ns").astype(np.int64)
    t = np.concatenate([day0 + k * 86_400 * 10**9 + np.arange(390) * ns for k in range(6)])
    folds = walk_forward_folds(t, WalkSpec("days", 3, 1, 1, 1))
    assert [(f.train.bars, f.val.bars, f.test.bars) for f in folds] == [(3 * 390, 390, 390)] * 2


@pytest.mark.parametrize(
    "spec, match",
    [
        (dict(unit="weeks", train=1, val=1, test=1, step=1), "unit"),
        (dict(unit="months", train=0, val=1, test=1, step=1), "train window"),
        (dict(unit="months", train=3, val=1, test=2, step=1), "overlap"),
        (dict(unit="bars", train=3, val=1.5, test=2, step=2), "val window"),
    ],
)
def test_bad_windows_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        WalkSpec(**spec)


def test_too_little_data_and_too_few_bars_are_refused():
    t = days("2001-01-01", 300)
    with pytest.raises(ValueError, match="no complete fold"):
        walk_forward_folds(t, WalkSpec("months", 12, 2, 2, 2))  # 14 months hold 16 months of windows: none
    with pytest.raises(ValueError, match=f"at least {MIN_BARS}"):
        walk_forward_folds(t, WalkSpec("bars", MIN_BARS - 1, 5, 5, 5))
    with pytest.raises(ValueError, match="strictly increasing"):
        walk_forward_folds(t[::-1], WalkSpec("bars", 50, 5, 5, 5))
    assert walk_forward_folds(t, WalkSpec("bars", MIN_BARS, 5, 5, 5))[0].val.start >= HISTORY


def test_spec_from_flags():
    assert spec_from((None,) * 4, (None,) * 4, (None,) * 4) is None
    assert spec_from((3, 1, 1, None), (None,) * 4, (None,) * 4) == WalkSpec("months", 3, 1, 1, 1)
    assert spec_from((3, 1, 1, 3), (None,) * 4, (None,) * 4).step == 3
    with pytest.raises(ValueError, match="one unit only"):
        spec_from((3, 1, 1, None), (None, None, 5, None), (None,) * 4)
    with pytest.raises(ValueError, match="val missing"):
        spec_from((None,) * 4, (None,) * 4, (100, None, 10, None))
