"""Scores of one strategy's per-bar log P&L: total, Sharpe ratio, maximum drawdown, turnover.

A bar's log P&L after costs is ``p' * r_{t+1} - cost * |p' - p|`` (:mod:`gper.envs.market`), so
log P&L adds up over bars and the cumulative sum is the log of the equity curve. Every figure here
is in those log units; nothing is compounded or converted to percent.
"""

from __future__ import annotations

import math

import numpy as np

#: nanoseconds in a year of 365.25 days: the calendar the annualised Sharpe ratio counts bars in
NS_PER_YEAR = 365.25 * 86_400 * 1_000_000_000

#: a standard deviation at most this fraction of the largest |log P&L| is rounding of a constant
#: series (np.std of [0.1, 0.1, 0.1] is 1.4e-17, not 0), so its Sharpe ratio is 0, not 1e16
CONSTANT_RTOL = 1e-12


def _floats(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` as float64 ``[n]``, or a one-line ValueError naming ``name``."""
    out = np.asarray(values)
    if out.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {list(out.shape)}")
    if not (np.issubdtype(out.dtype, np.floating) or np.issubdtype(out.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {out.dtype}")
    out = out.astype(np.float64, copy=False)
    if not np.isfinite(out).all():
        bad = int(np.flatnonzero(~np.isfinite(out))[0])
        raise ValueError(f"{name} must be finite: bar {bad} is {out[bad]}")
    return out


def sharpe_per_bar(log_pnl: np.ndarray) -> float:
    """Mean over population standard deviation of float64 ``[n]`` per-bar log P&L; 0 for a constant series."""
    std = float(log_pnl.std())
    if std <= CONSTANT_RTOL * float(np.abs(log_pnl).max(initial=0.0)):
        return 0.0
    return float(log_pnl.mean()) / std


def max_drawdown(log_pnl: np.ndarray) -> float:
    """The largest fall of the cumulative log P&L from its running peak, >= 0, in log units.

    The peak starts at 0 before the first bar, so a series that only falls has the drawdown of its
    whole fall. ``exp(-max_drawdown) - 1`` is the fall as a fraction of the equity at the peak.
    """
    equity = np.concatenate(([0.0], np.cumsum(log_pnl)))
    return float((np.maximum.accumulate(equity) - equity).max())


def pnl_scores(
    log_pnl: np.ndarray, traded: np.ndarray, bars_per_year: float | None = None
) -> dict[str, float | int | None]:
    """The scores of one strategy over its bars.

    Args:
        log_pnl: float64 ``[n]``, ``n >= 1``: each bar's log P&L after costs.
        traded: float64 ``[n]``: each bar's ``|p' - p|`` (>= 0), the entry included.
        bars_per_year: bars in a 365.25-day year (:func:`bars_per_year`), for the annualised
            Sharpe ratio; None leaves it None.

    Returns:
        ``log_pnl`` (the sum), ``sharpe_per_bar`` (mean over population std of the per-bar log
        P&L, 0 when the std is 0), ``sharpe_annual`` (``sharpe_per_bar * sqrt(bars_per_year)``,
        or None), ``max_drawdown`` (:func:`max_drawdown`), ``turnover`` (the sum of ``traded``),
        ``bars`` (``n``). Plain Python numbers, ready for JSON.
    """
    pnl, trades = _floats("log_pnl", log_pnl), _floats("traded", traded)
    if len(pnl) != len(trades):
        raise ValueError(f"log_pnl and traded must have the same length, got {len(pnl)} and {len(trades)}")
    if len(pnl) == 0:
        raise ValueError("log_pnl is empty: scores need at least one bar")
    if (trades < 0).any():
        raise ValueError(f"traded must be >= 0 (it is |p' - p|), got {trades.min()}")
    if bars_per_year is not None and not (math.isfinite(bars_per_year) and bars_per_year > 0):
        raise ValueError(f"bars_per_year must be positive and finite or None, got {bars_per_year!r}")
    sharpe = sharpe_per_bar(pnl)
    return {
        "log_pnl": float(pnl.sum()),
        "sharpe_per_bar": sharpe,
        "sharpe_annual": None if bars_per_year is None else sharpe * math.sqrt(bars_per_year),
        "max_drawdown": max_drawdown(pnl),
        "turnover": float(trades.sum()),
        "bars": len(pnl),
    }


def check_times(name: str, time_ns: np.ndarray) -> np.ndarray:
    """``time_ns`` as int64 ``[n]`` nanoseconds since the epoch, strictly increasing, or a one-line ValueError."""
    out = np.asarray(time_ns)
    if out.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {list(out.shape)}")
    if len(out) and not np.issubdtype(out.dtype, np.integer):
        raise ValueError(f"{name} must hold integer nanoseconds, got dtype {out.dtype}")
    out = out.astype(np.int64, copy=False)
    if len(out) > 1 and not (np.diff(out) > 0).all():
        bad = int(np.flatnonzero(np.diff(out) <= 0)[0]) + 1
        raise ValueError(f"{name} must be strictly increasing: bar {bad} ({out[bad]}) follows {out[bad - 1]}")
    return out


def bars_per_year(time_ns: np.ndarray) -> float | None:
    """Bars per 365.25-day year of a series whose bars fall at ``time_ns``.

    Estimated from the span: ``(n - 1)`` intervals over ``time_ns[-1] - time_ns[0]``, so days and
    hours without bars (weekends, nights) count as time, as they do in a year: daily bars of a
    market open five days a week give about 252 (``365.25 * 5 / 7 = 261`` less holidays).

    Args:
        time_ns: int64 ``[n]``, strictly increasing nanoseconds since the epoch.

    Returns:
        The estimate, or None for fewer than 2 bars.
    """
    times = check_times("time_ns", time_ns)
    if len(times) < 2:
        return None
    return (len(times) - 1) * NS_PER_YEAR / float(times[-1] - times[0])


def buy_and_hold(returns: np.ndarray, cost: float) -> tuple[np.ndarray, np.ndarray]:
    """The per-bar log P&L and trades of holding +1 throughout, entering on the first bar.

    Args:
        returns: float64 ``[n]``, ``n >= 1``: the log returns the bars earn (``r_{t+1}`` for the
            decision at bar ``t``).
        cost: cost per unit traded (``cost_bps * 1e-4``), paid once, on the first bar.

    Returns:
        ``(log_pnl, traded)``, float64 ``[n]`` each: ``returns`` less ``cost`` on the first bar,
        and 1 on the first bar, 0 after.
    """
    pnl = _floats("returns", returns).copy()
    if len(pnl) == 0:
        raise ValueError("returns is empty: buy-and-hold needs at least one bar")
    if not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"cost must be >= 0, got {cost!r}")
    traded = np.zeros_like(pnl)
    pnl[0] -= cost
    traded[0] = 1.0
    return pnl, traded
