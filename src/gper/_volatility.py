"""Volatility of a price series from the prices up to each bar: the exponentially weighted standard
deviation of daily returns (span 60, at least 60 returns), as pandas computes
``ewm(span=60, min_periods=60).std()``, and the position scale that targets an annual volatility.

Used by the market environment's volatility targeting (``MarketEnv(vol_scale=...)``,
``gper train --vol-target``) and by the classical baselines of the walk-forward report
(:mod:`gper.walkforward.baselines`). numpy only.
"""

from __future__ import annotations

import math

import numpy as np

#: span (and fewest returns) of the exponentially weighted volatility of daily returns
VOL_SPAN = 60
#: trading days a year: daily volatility times its square root is annual volatility
DAYS_PER_YEAR = 252


def check_prices(prices: np.ndarray) -> np.ndarray:
    out = np.asarray(prices, dtype=np.float64)
    if out.ndim != 1:
        raise ValueError(f"prices must be 1-D, got shape {list(out.shape)}")
    if not (np.isfinite(out).all() and (out > 0).all()):
        raise ValueError("prices must be finite and > 0")
    return out


def ewm_mean(x: np.ndarray, alpha: float) -> np.ndarray:
    """pandas' ``ewm(alpha=alpha, adjust=True).mean()`` of float64 ``x`` (no NaN): the mean of every
    value so far, weighted ``(1 - alpha)^age``."""
    out = np.empty_like(x)
    num = den = 0.0
    keep = 1.0 - alpha
    for t, value in enumerate(x):
        num = value + keep * num
        den = 1.0 + keep * den
        out[t] = num / den
    return out


def ewm_std(x: np.ndarray, span: int, min_periods: int) -> np.ndarray:
    """pandas' ``ewm(span=span, min_periods=min_periods).std()`` of float64 ``x`` (no NaN, bias
    corrected as pandas corrects it); NaN before ``min_periods`` values."""
    alpha = 2.0 / (span + 1.0)
    keep = 1.0 - alpha
    out = np.full_like(x, np.nan)
    w = w2 = mean = var = 0.0  # the weights' sum and squares' sum, the weighted mean and (biased) variance
    for t, value in enumerate(x):
        if t == 0:
            w, w2, mean, var = 1.0, 1.0, value, 0.0
        else:
            w, w2 = keep * w, keep * keep * w2
            old_mean = mean
            mean = (w * mean + value) / (w + 1.0)
            var = (w * (var + (old_mean - mean) ** 2) + (value - mean) ** 2) / (w + 1.0)
            w, w2 = w + 1.0, w2 + 1.0
        if t + 1 >= min_periods and t > 0:
            out[t] = math.sqrt(max(var * w * w / (w * w - w2), 0.0))
    return out


def rolling_std(x: np.ndarray, window: int) -> np.ndarray:
    """pandas' ``rolling(window).std()`` (ddof 1) of float64 ``x``: NaN until ``window`` values,
    and where any value of the window is NaN."""
    out = np.full_like(x, np.nan)
    if len(x) >= window:
        out[window - 1 :] = np.lib.stride_tricks.sliding_window_view(x, window).std(axis=1, ddof=1)
    return out


def volatility_scale(prices: np.ndarray, target: float) -> np.ndarray:
    """``target / (sigma_t sqrt(252))`` at every bar: the position that holds an annual volatility of
    ``target`` (0.15: 15%), ``sigma_t`` the exponentially weighted standard deviation (span
    :data:`VOL_SPAN`) of the daily returns up to bar ``t``; NaN before :data:`VOL_SPAN` returns.
    Bar ``t``'s reads ``prices[: t + 1]`` only."""
    p = check_prices(prices)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"the volatility target must be > 0, got {target!r}")
    daily = p[1:] / p[:-1] - 1.0
    sigma = np.full_like(p, np.nan)
    if len(p) > 1:
        sigma[1:] = ewm_std(daily, VOL_SPAN, VOL_SPAN)
    with np.errstate(divide="ignore"):
        return target / (sigma * math.sqrt(DAYS_PER_YEAR))
