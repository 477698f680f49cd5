"""The classical strategies a trading policy is judged beside, after the same costs.

As the Oxford-Man group's code computes them (``kieranjwood/trading-momentum-transformer``,
``mom_trans/classical_strategies.py``; Moskowitz, Ooi & Pedersen 2012; Baz et al. 2015):

- **long only**, volatility-scaled: the signal ``X_t = 1``;
- **time-series momentum**: ``X_t = sign(p_t / p_{t-252} - 1)``;
- **MACD**: for ``(S, L)`` in (8, 24), (16, 48), (32, 96), ``m = EWMA_HL(S)(p) - EWMA_HL(L)(p)`` with
  half-lives ``HL(n) = ln 0.5 / ln(1 - 1/n)``, ``q = m / std_63(p)``, ``Y = q / std_252(q)``,
  ``phi(Y) = Y exp(-Y^2 / 4) / 0.89``; ``X_t`` the mean of the three ``phi(Y)``.

Each signal is held at ``X_t * 0.15 / (sigma_t sqrt(252))`` units of the asset: a 15% annual
volatility target over ``sigma_t``, the exponentially weighted standard deviation of daily returns
(span 60, at least 60 returns; pandas' ``ewm(span=60, min_periods=60).std()``). A position decided
at bar ``t`` reads the prices up to bar ``t`` and none after, and earns the log return of bar
``t + 1``; trading costs ``cost * |change of position|`` as gper's market environment charges the
policy. Where a signal is not yet defined (too little history) the position is 0.

Where this differs from the Oxford-Man code: the P&L is in log units, like the policy's and
buy-and-hold's in the walk-forward report (theirs scores simple returns); a signal or volatility
not yet defined holds 0 where theirs back-fills the first defined value (which reads later prices);
the MACD signal is the mean of the three ``phi(Y)`` bar by bar (the formula of Baz et al.). The
long-only baseline is the volatility-scaled one (buy-and-hold, +1 throughout, is reported beside
it).
"""

from __future__ import annotations

import math

import numpy as np

from gper._volatility import check_prices, ewm_mean, rolling_std, volatility_scale

#: annual volatility the positions are scaled to
VOL_TARGET = 0.15
#: bars back the momentum signal compares the price with
TSMOM_LOOKBACK = 252
#: (short, long) time scales of the three MACD signals
MACD_PAIRS = ((8, 24), (16, 48), (32, 96))
#: the windows of the MACD's normalisations: the price's and the signal's rolling standard deviations
MACD_PRICE_STD, MACD_SIGNAL_STD = 63, 252
#: the baselines, in report order
BASELINES = ("long_only", "tsmom", "macd")
LABELS = {"long_only": "long only (vol-scaled)", "tsmom": "TS momentum", "macd": "MACD"}


def half_life(n: int) -> float:
    """The EWMA half-life of time scale ``n``: ``ln 0.5 / ln(1 - 1/n)``."""
    return math.log(0.5) / math.log(1.0 - 1.0 / n)


def macd_signal(prices: np.ndarray) -> np.ndarray:
    """The mean over :data:`MACD_PAIRS` of ``phi(Y)`` at every bar (NaN until each is defined)."""
    p = check_prices(prices)
    price_std = rolling_std(p, MACD_PRICE_STD)
    total = np.zeros_like(p)
    for short, long in MACD_PAIRS:
        fast = ewm_mean(p, 1.0 - math.exp(math.log(0.5) / half_life(short)))
        slow = ewm_mean(p, 1.0 - math.exp(math.log(0.5) / half_life(long)))
        with np.errstate(divide="ignore", invalid="ignore"):
            q = (fast - slow) / price_std
            y = q / rolling_std(q, MACD_SIGNAL_STD)
        total += y * np.exp(-(y**2) / 4.0) / 0.89
    return total / len(MACD_PAIRS)


def signals(prices: np.ndarray) -> dict[str, np.ndarray]:
    """Each baseline's signal ``X_t`` at every bar of ``prices`` (float64 ``[n]``), NaN where undefined."""
    p = check_prices(prices)
    momentum = np.full_like(p, np.nan)
    if len(p) > TSMOM_LOOKBACK:
        momentum[TSMOM_LOOKBACK:] = np.sign(p[TSMOM_LOOKBACK:] / p[:-TSMOM_LOOKBACK] - 1.0)
    return {"long_only": np.ones_like(p), "tsmom": momentum, "macd": macd_signal(p)}


def positions(prices: np.ndarray, vol_target: float = VOL_TARGET) -> dict[str, np.ndarray]:
    """Each baseline's position at every bar of ``prices``, in units of the asset, at the annual
    volatility ``vol_target``; 0 where its signal or the volatility is not defined yet. Bar ``t``'s
    reads ``prices[: t + 1]`` only."""
    scale = volatility_scale(prices, vol_target)
    out = {}
    for name, signal in signals(prices).items():
        pos = signal * scale
        out[name] = np.where(np.isfinite(pos), pos, 0.0)
    return out


def baseline_walk(
    prices: np.ndarray, start: int, end: int, cost: float, vol_target: float = VOL_TARGET
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each baseline's log P&L and trades on the bars ``[start, end)`` of ``prices``: the position
    decided at bar ``t - 1`` earns bar ``t``'s log return, as a walk-forward fold's policy does; it
    starts flat, so the first position is entered (and paid for) at bar ``start - 1``.

    Args:
        prices: float64 ``[n]``, positive: the whole series (only bars before ``end - 1`` are read
            for positions: bar ``end - 1``'s price only for its return).
        start, end: the test bars, ``1 <= start < end <= n``.
        cost: cost per unit traded (``cost_bps * 1e-4``).
        vol_target: the annual volatility the positions are scaled to (the literature's 15% by
            default; a walk-forward run with ``vol_target`` scales them to the policy's).

    Returns:
        ``{name: (log_pnl, traded)}``, float64 ``[end - start]`` each.
    """
    p = check_prices(prices)
    if not (1 <= start < end <= len(p)):
        raise ValueError(f"the test bars [{start}, {end}) must lie in [1, {len(p)}] and hold at least one bar")
    if not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"cost must be >= 0, got {cost!r}")
    returns = np.log(p[start:end] / p[start - 1 : end - 1])
    out = {}
    for name, pos in positions(p[: end - 1], vol_target).items():  # the decisions of bars start - 1 .. end - 2
        held = pos[start - 1 :]
        traded = np.abs(np.diff(held, prepend=0.0))
        out[name] = (held * returns - cost * traded, traded)
    return out
