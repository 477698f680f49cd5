"""How much a fold's chosen checkpoint is worth once the number of candidates is counted: the
deflated Sharpe ratio of Bailey & López de Prado (2014).

A fold scores ``N`` checkpoints on its validation window and keeps the best. The best of ``N``
noisy Sharpe ratios is high even where no candidate has skill (with 11 candidates and a year of
daily validation, about 1.6 annualised), so "it beat flat on validation" says little. The deflated
Sharpe ratio is the probability that the chosen checkpoint's true Sharpe ratio is above the one
the best of ``N`` skill-free candidates would show:

- ``SR0 = sqrt(V) ((1 - g) z(1 - 1/N) + g z(1 - 1/(N e)))``, ``V`` the variance of the ``N``
  candidates' Sharpe ratios, ``g`` the Euler-Mascheroni constant, ``z`` the standard normal quantile;
- ``DSR = Phi((SR - SR0) sqrt(T - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2))``, ``SR`` the chosen
  checkpoint's Sharpe ratio over its ``T`` validation bars, ``g3`` and ``g4`` their skewness and
  kurtosis (3 for a normal), ``Phi`` the standard normal distribution function.

Every Sharpe ratio here is per bar (mean over population standard deviation of the per-bar log
P&L after costs), as the validation scores them. With one candidate ``SR0`` is 0: the probabilistic
Sharpe ratio against no skill.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from gper.walkforward.scores import sharpe_per_bar

#: the Euler-Mascheroni constant
EULER_GAMMA = 0.5772156649015329
_NORMAL = NormalDist()


def expected_max_sharpe(sharpes: np.ndarray) -> float:
    """``SR0``: the Sharpe ratio the best of these candidates would show with no skill (0 for one)."""
    n = len(sharpes)
    if n < 2:
        return 0.0
    sd = float(np.std(sharpes, ddof=1))
    z = _NORMAL.inv_cdf
    return sd * ((1.0 - EULER_GAMMA) * z(1.0 - 1.0 / n) + EULER_GAMMA * z(1.0 - 1.0 / (n * math.e)))


def probabilistic_sharpe(pnl: np.ndarray, benchmark: float) -> float:
    """The probability that the true per-bar Sharpe ratio of ``pnl`` (float64 ``[T]``, ``T >= 2``) is
    above ``benchmark``, from its estimate, skewness and kurtosis (Bailey & López de Prado 2012)."""
    x = np.asarray(pnl, dtype=np.float64)
    if x.ndim != 1 or len(x) < 2 or not np.isfinite(x).all():
        raise ValueError(f"pnl must be 1-D, finite and of at least 2 bars, got shape {list(x.shape)}")
    sr = sharpe_per_bar(x)
    std = float(x.std())
    if sr == 0.0 or std == 0.0:  # constant (or mean 0): no shape to correct for
        g3, g4 = 0.0, 3.0
    else:
        z = (x - x.mean()) / std
        g3, g4 = float(np.mean(z**3)), float(np.mean(z**4))
    spread = 1.0 - g3 * sr + (g4 - 1.0) / 4.0 * sr * sr
    if spread <= 0.0:  # a shape the normal approximation cannot hold: no evidence either way
        return 0.5
    return _NORMAL.cdf((sr - benchmark) * math.sqrt(len(x) - 1) / math.sqrt(spread))


def deflated_sharpe(candidates: list[np.ndarray], chosen: int) -> dict[str, float | int]:
    """The deflated Sharpe ratio of candidate ``chosen`` among ``candidates`` (each a float64 ``[T]``
    per-bar log P&L over the same validation bars).

    Returns:
        ``{"deflated_sharpe": DSR, "sharpe_per_bar": SR, "expected_max_sharpe": SR0, "trials": N}``.
    """
    if not candidates or not 0 <= chosen < len(candidates):
        raise ValueError(f"chosen must index one of the {len(candidates)} candidates, got {chosen!r}")
    sharpes = np.array([sharpe_per_bar(np.asarray(c, dtype=np.float64)) for c in candidates])
    sr0 = expected_max_sharpe(sharpes)
    return {
        "deflated_sharpe": probabilistic_sharpe(candidates[chosen], sr0),
        "sharpe_per_bar": float(sharpes[chosen]),
        "expected_max_sharpe": sr0,
        "trials": len(candidates),
    }
