"""The out-of-sample performance statistics of the field's own library, ``empyrical-reloaded``
(Quantopian's empyrical, kept up): annual return and volatility, the Sharpe, Sortino and Calmar
ratios and the maximum drawdown, of each strategy of a walk-forward report.

gper's own scores (:func:`gper.walkforward.scores.pnl_scores`) are in log units: summed log P&L, a
Sharpe ratio of the per-bar log P&L, a drawdown of the cumulative log P&L. empyrical reads simple
returns, so each bar's log P&L ``l`` enters as ``exp(l) - 1``; its annual return compounds them
(``(prod(1 + r)) ^ (bars_per_year / n) - 1``), its volatility and Sharpe ratio use the sample
standard deviation, its Sortino ratio the downside deviation ``sqrt(mean(min(r, 0)^2))`` over every
bar, and its drawdown is a fraction of the peak's equity.

empyrical-reloaded comes with gper's ``data`` extra (``pip install ".[data]"``, Python 3.11 or
later); without it :func:`performance` returns None and the report says how to get the statistics.
"""

from __future__ import annotations

import importlib
import math
import warnings
from typing import Any

import numpy as np

#: the statistics :func:`performance` reports, in table order, with their labels
STATISTICS = {
    "annual_return": "annual return",
    "annual_volatility": "annual volatility",
    "sharpe_ratio": "Sharpe",
    "sortino_ratio": "Sortino",
    "calmar_ratio": "Calmar",
    "max_drawdown": "max drawdown",
}

#: the statistics that take ``annualization``
ANNUALISED = ("annual_return", "annual_volatility", "sharpe_ratio", "sortino_ratio", "calmar_ratio")

#: what to install when empyrical-reloaded is missing
INSTALL = 'pip install ".[data]" in a checkout of gper (empyrical-reloaded, Python 3.11 or later)'


def empyrical() -> Any | None:
    """The ``empyrical`` module, or None when empyrical-reloaded is not installed."""
    try:
        return importlib.import_module("empyrical")
    except ImportError:
        return None


def _number(x: Any) -> float | None:
    value = float(x)
    return value if math.isfinite(value) else None


def performance(log_pnl: np.ndarray, bars_per_year: float | None) -> dict[str, float | None] | None:
    """empyrical's :data:`STATISTICS` of a strategy earning ``log_pnl`` (float64 ``[n]``, per bar,
    after costs), annualised at ``bars_per_year``; None without empyrical-reloaded or without a
    year's length (``bars_per_year`` None). A statistic empyrical leaves undefined (the Sortino ratio
    of a strategy that never loses, every ratio of flat) is None."""
    ep = empyrical()
    if ep is None or bars_per_year is None:
        return None
    returns = np.expm1(np.asarray(log_pnl, dtype=np.float64))
    if returns.ndim != 1 or len(returns) == 0 or not np.isfinite(returns).all():
        raise ValueError(f"log_pnl must be a finite 1-D array of at least one bar, got shape {list(returns.shape)}")
    with warnings.catch_warnings():  # empyrical's own divide-by-zero warnings for flat
        warnings.simplefilter("ignore", RuntimeWarning)
        out = {name: _number(getattr(ep, name)(returns, annualization=bars_per_year)) for name in ANNUALISED}
        out["max_drawdown"] = _number(ep.max_drawdown(returns))
    return {name: out[name] for name in STATISTICS}


__all__ = ["INSTALL", "STATISTICS", "empyrical", "performance"]
