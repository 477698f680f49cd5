"""pnl_scores, bars_per_year and buy_and_hold on arrays small enough to score by hand, their input
checks, and agreement with the market task's own evaluation (gper.envs.market.evaluate)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gper.envs.market import WARMUP, evaluate, log_returns, synthetic_prices
from gper.walkforward.scores import NS_PER_YEAR, bars_per_year, buy_and_hold, max_drawdown, pnl_scores

DAY = 86_400 * 10**9


def test_a_peak_in_the_middle_sets_the_drawdown():
    # cumulative 0.1, 0.3, 0.15, 0.05, 0.1: the peak 0.3 at bar 1, the trough 0.05 at bar 3
    pnl = np.array([0.1, 0.2, -0.15, -0.1, 0.05])
    s = pnl_scores(pnl, np.array([1.0, 0.0, 0.5, 0.0, 0.0]), bars_per_year=252.0)
    # mean 0.02; deviations 0.08, 0.18, -0.17, -0.12, 0.03 whose squares sum to 0.083
    sharpe = 0.02 / math.sqrt(0.083 / 5)
    assert s["log_pnl"] == pytest.approx(0.1, abs=1e-15)
    assert s["max_drawdown"] == pytest.approx(0.25, abs=1e-15)
    assert s["sharpe_per_bar"] == pytest.approx(sharpe, rel=1e-12)
    assert s["sharpe_annual"] == pytest.approx(sharpe * math.sqrt(252), rel=1e-12)
    assert s["turnover"] == 1.5 and s["bars"] == 5
    assert all(type(v) in (float, int) for v in s.values())  # plain numbers, for JSON


def test_a_series_that_only_falls_draws_down_from_zero():
    s = pnl_scores(np.array([-0.1, -0.2, -0.05]), np.zeros(3))
    assert s["max_drawdown"] == pytest.approx(0.35, abs=1e-15)
    assert s["log_pnl"] == pytest.approx(-0.35, abs=1e-15)
    assert s["sharpe_per_bar"] < 0 and s["sharpe_annual"] is None


def test_the_peak_starts_at_zero_before_the_first_bar():
    assert max_drawdown(np.array([-0.1, 0.5, -0.2])) == pytest.approx(0.2)
    assert max_drawdown(np.array([-0.3, 0.5, -0.2])) == pytest.approx(0.3)
    assert max_drawdown(np.array([0.1, 0.2, 0.3])) == 0.0


def test_all_zeros_score_zero():
    s = pnl_scores(np.zeros(4), np.zeros(4), bars_per_year=100.0)
    assert s == {
        "log_pnl": 0.0,
        "sharpe_per_bar": 0.0,
        "sharpe_annual": 0.0,
        "max_drawdown": 0.0,
        "turnover": 0.0,
        "bars": 4,
    }


def test_a_constant_series_has_sharpe_zero_not_the_inverse_of_rounding():
    pnl = np.full(7, 0.1)
    assert pnl.std() > 0  # rounding: the reason for the tolerance
    assert pnl_scores(pnl, np.zeros(7))["sharpe_per_bar"] == 0.0
    assert pnl_scores(np.array([0.5]), np.array([1.0]))["sharpe_per_bar"] == 0.0


@pytest.mark.parametrize(
    "pnl, traded, per_year, message",
    [
        (np.zeros((2, 2)), np.zeros((2, 2)), None, "log_pnl must be 1-D"),
        (np.zeros(3), np.zeros(2), None, "same length"),
        (np.array([0.0, np.nan]), np.zeros(2), None, "log_pnl must be finite: bar 1"),
        (np.zeros(2), np.array([0.0, np.inf]), None, "traded must be finite: bar 1"),
        (np.zeros(0), np.zeros(0), None, "empty"),
        (np.zeros(2), np.array([0.0, -1.0]), None, "traded must be >= 0"),
        (np.array(["a", "b"]), np.zeros(2), None, "real numbers"),
        (np.zeros(2), np.zeros(2), 0.0, "bars_per_year must be positive"),
        (np.zeros(2), np.zeros(2), float("nan"), "bars_per_year must be positive"),
    ],
)
def test_bad_input_is_refused_in_one_line(pnl, traded, per_year, message):
    with pytest.raises(ValueError, match=message) as err:
        pnl_scores(pnl, traded, per_year)
    assert "\n" not in str(err.value)


def test_bars_per_year_counts_bars_over_the_span():
    days = np.arange(366, dtype=np.int64) * DAY  # 365 one-day intervals
    assert bars_per_year(days) == pytest.approx(365.25)
    hours = np.arange(25, dtype=np.int64) * (DAY // 24)  # 24 one-hour intervals over a day
    assert bars_per_year(hours) == pytest.approx(24 * 365.25)
    # 52 weeks of weekdays: 260 bars from day 0 to day 361, the weekends counted as time
    weekdays = np.array([d for d in range(7 * 52) if d % 7 < 5], dtype=np.int64) * DAY
    assert len(weekdays) == 260 and weekdays[-1] == 361 * DAY
    assert bars_per_year(weekdays) == pytest.approx(259 * 365.25 / 361)
    assert bars_per_year(weekdays) == pytest.approx(259 * NS_PER_YEAR / (361 * DAY))
    assert bars_per_year(np.zeros(0, dtype=np.int64)) is None
    assert bars_per_year(np.array([5], dtype=np.int64)) is None


@pytest.mark.parametrize(
    "times, message",
    [
        (np.array([0, DAY, DAY]), "strictly increasing: bar 2"),
        (np.array([DAY, 0]), "strictly increasing: bar 1"),
        (np.array([0.0, 1.0]), "integer nanoseconds"),
        (np.zeros((2, 2), dtype=np.int64), "1-D"),
    ],
)
def test_bars_per_year_refuses_times_out_of_order(times, message):
    with pytest.raises(ValueError, match=message):
        bars_per_year(times)


def test_buy_and_hold_pays_the_entry_once():
    pnl, traded = buy_and_hold(np.array([0.01, -0.02, 0.03]), cost=1e-4)
    np.testing.assert_array_equal(pnl, [0.01 - 1e-4, -0.02, 0.03])
    np.testing.assert_array_equal(traded, [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="cost must be >= 0"):
        buy_and_hold(np.zeros(2), cost=-1.0)
    with pytest.raises(ValueError, match="empty"):
        buy_and_hold(np.zeros(0), cost=0.0)


def test_the_scores_agree_with_the_market_tasks_evaluation():
    """A policy that always holds +1 is buy-and-hold: evaluate's figures for it and for its
    buy-and-hold baseline are pnl_scores of buy_and_hold over the returns the bars earn."""
    prices = synthetic_prices(WARMUP + 61, seed=3, kind="regime")  # 60 steps
    long = torch.tensor([44])  # POSITIONS[44] = +1
    out = evaluate(lambda obs: long, prices, cost_bps=2.0)
    returns = log_returns(prices)[WARMUP + 1 :].numpy()
    s = pnl_scores(*buy_and_hold(returns, cost=2e-4))
    assert s["bars"] == out["bars"] == 60
    assert s["log_pnl"] == pytest.approx(out["buy_and_hold_log_pnl"], rel=1e-12)
    assert s["log_pnl"] == pytest.approx(out["total_log_pnl"], rel=1e-12)
    assert s["sharpe_per_bar"] == pytest.approx(out["buy_and_hold_sharpe_per_bar"], rel=1e-9)
    assert s["sharpe_per_bar"] == pytest.approx(out["sharpe_per_bar"], rel=1e-9)
    assert s["turnover"] == out["turnover"] == 1.0
