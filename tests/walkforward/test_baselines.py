"""The classical baselines (:mod:`gper.walkforward.baselines`): their indicators
(:mod:`gper._volatility`) against pandas, the
Oxford-Man group's formulas written out in pandas, a plain-Python walk, and no look-ahead."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gper import _volatility as vol
from gper.walkforward import baselines as bl

pd = pytest.importorskip("pandas")


def _prices(n: int = 1500, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(np.cumsum(rng.normal(0.0003, 0.012, n)))


def _oxford_man(prices: np.ndarray) -> dict[str, np.ndarray]:
    """The positions as ``mom_trans/classical_strategies.py`` computes them, in pandas."""
    srs = pd.Series(prices)
    vol = srs.pct_change().ewm(span=60, min_periods=60).std()
    scale = 0.15 / (vol * np.sqrt(252))
    macd = 0.0
    for short, long in ((8, 24), (16, 48), (32, 96)):
        hl = lambda n: np.log(0.5) / np.log(1 - 1 / n)  # noqa: E731
        m = srs.ewm(halflife=hl(short)).mean() - srs.ewm(halflife=hl(long)).mean()
        q = m / srs.rolling(63).std()
        y = q / q.rolling(252).std()
        macd = macd + y * np.exp(-(y**2) / 4) / 0.89
    signals = {
        "long_only": pd.Series(1.0, index=srs.index),
        "tsmom": np.sign(srs / srs.shift(252) - 1),
        "macd": macd / 3,
    }
    return {name: (x * scale).fillna(0.0).to_numpy() for name, x in signals.items()}


def test_the_indicators_are_pandas():
    x = np.random.default_rng(1).normal(0.0, 0.01, 800)
    s = pd.Series(x)
    np.testing.assert_allclose(vol.ewm_mean(x, 0.07), s.ewm(alpha=0.07).mean(), rtol=1e-12, atol=0)
    want = s.ewm(span=60, min_periods=60).std().to_numpy()
    got = vol.ewm_std(x, 60, 60)
    assert (np.isnan(got) == np.isnan(want)).all() and np.isnan(got[:59]).all()
    np.testing.assert_allclose(got[59:], want[59:], rtol=1e-9)
    np.testing.assert_allclose(vol.rolling_std(x, 63), s.rolling(63).std(), rtol=1e-9)
    assert bl.half_life(8) == pytest.approx(math.log(0.5) / math.log(7 / 8))
    p = _prices()
    want = 0.2 / (pd.Series(p).pct_change().ewm(span=60, min_periods=60).std() * np.sqrt(252))
    got = vol.volatility_scale(p, 0.2)
    assert np.isnan(got[:60]).all() and np.isfinite(got[60:]).all()
    np.testing.assert_allclose(got[60:], want.to_numpy()[60:], rtol=1e-9)
    with pytest.raises(ValueError, match="volatility target must be > 0"):
        vol.volatility_scale(p, 0.0)


def test_positions_are_the_oxford_man_codes():
    p = _prices()
    want, got = _oxford_man(p), bl.positions(p)
    assert set(got) == set(bl.BASELINES)
    for name in bl.BASELINES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-8, atol=1e-12, err_msg=name)
    assert (got["tsmom"][:252] == 0).all() and (got["tsmom"][300:] != 0).all()  # defined from bar 252
    assert (got["macd"][:313] == 0).all()  # 63 + 252 - 2 bars before the signal's first value


def test_no_position_reads_a_later_price():
    p = _prices()
    whole = bl.positions(p)
    for k in (70, 260, 400, 1200):
        changed = p.copy()
        changed[k:] *= np.exp(np.random.default_rng(k).normal(0.0, 0.2, len(p) - k))
        for name, pos in bl.positions(changed).items():
            np.testing.assert_array_equal(pos[:k], whole[name][:k], err_msg=f"{name} at {k}")
            np.testing.assert_array_equal(bl.positions(p[:k])[name], whole[name][:k])


def test_a_walk_earns_the_next_bars_return_less_costs():
    p, cost = _prices(), 3e-4
    start, end = 900, 1150
    walked = bl.baseline_walk(p, start, end, cost)
    pos = bl.positions(p)
    for name, (pnl, traded) in walked.items():
        assert pnl.shape == traded.shape == (end - start,)
        prev = 0.0
        for i, t in enumerate(range(start, end)):  # the decision at t - 1 earns bar t's return
            held = pos[name][t - 1]
            assert traded[i] == pytest.approx(abs(held - prev), abs=1e-15)
            assert pnl[i] == pytest.approx(held * math.log(p[t] / p[t - 1]) - cost * abs(held - prev), abs=1e-15)
            prev = held
    # the last test bar's price is read for its return only
    changed = p.copy()
    changed[end - 1 :] *= 1.5
    again = bl.baseline_walk(changed, start, end, cost)
    for name in bl.BASELINES:
        np.testing.assert_array_equal(again[name][1], walked[name][1])
        np.testing.assert_array_equal(again[name][0][:-1], walked[name][0][:-1])


@pytest.mark.parametrize(
    "prices, start, end, cost, match",
    [
        ([1.0, -2.0, 3.0], 1, 3, 0.0, "finite and > 0"),
        ([[1.0, 2.0]], 1, 2, 0.0, "1-D"),
        ([1.0, 2.0, 3.0], 0, 3, 0.0, r"\[0, 3\)"),
        ([1.0, 2.0, 3.0], 2, 2, 0.0, r"\[2, 2\)"),
        ([1.0, 2.0, 3.0], 1, 4, 0.0, r"\[1, 4\)"),
        ([1.0, 2.0, 3.0], 1, 3, -1.0, "cost"),
    ],
)
def test_bad_input_is_refused(prices, start, end, cost, match):
    with pytest.raises(ValueError, match=match):
        bl.baseline_walk(np.asarray(prices), start, end, cost)
