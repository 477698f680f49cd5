"""The market task's arithmetic per bar, apart from the environment (:mod:`gper.envs.market`, whose
docstring describes the observation and the reward): log returns and their scale, the 48 market
features, the target position of each action, and the checks of a price series and of a position
scale. Every name is also :mod:`gper.envs.market`'s.
"""

from __future__ import annotations

import math

import numpy as np
import torch

N_RETURNS = 40
WINDOWS = (5, 10, 20, 40)
WARMUP = max(N_RETURNS, *WINDOWS)
"""First bar with a full observation: it needs ``WARMUP`` returns, hence ``WARMUP + 1`` prices."""
N_MARKET_FEATURES = N_RETURNS + 2 * len(WINDOWS)
OBS_DIM = N_MARKET_FEATURES + 3
N_ACTIONS = 45
"""The default number of actions (target positions)."""


def action_positions(n_actions: int) -> torch.Tensor:
    """The target positions of ``n_actions`` actions, float64: ``linspace(-1, 1, n_actions)`` as exact
    quotients ``k / (n_actions // 2)``, so the middle action is exactly flat (linspace's is -1e-17).

    Raises:
        ValueError: ``n_actions`` is not an odd integer >= 3.
    """
    if isinstance(n_actions, bool) or not isinstance(n_actions, int) or n_actions < 3 or n_actions % 2 == 0:
        raise ValueError(f"the market's actions must be an odd integer >= 3 (3: short, flat, long), got {n_actions!r}")
    half = n_actions // 2
    return torch.arange(-half, half + 1, dtype=torch.float64) / half


#: the cost per unit traded on real daily bars (``data`` given), in basis points: daily equity index
#: futures pay half a spread (a quarter point on the E-mini S&P 500, about 1 bp of a contract's notional
#: in 2003 and 0.5 bp by 2018), exchange and broker fees (0.2 to 0.5 bp) and some slippage; 2 bp leaves
#: a margin over the early years
REAL_COST_BPS = 2.0
#: the cost per unit traded on the synthetic prices, whose signal is sized to pay after it
SYNTHETIC_COST_BPS = 1.0


def default_cost_bps(data: str | None) -> float:
    """The market's cost per unit traded when none is given: :data:`REAL_COST_BPS` for a series of real
    bars (``data``), :data:`SYNTHETIC_COST_BPS` for the synthetic prices (``data`` None)."""
    return SYNTHETIC_COST_BPS if data is None else REAL_COST_BPS


POSITIONS = action_positions(N_ACTIONS)
"""The target positions of the default :data:`N_ACTIONS` actions."""
FEATURE_CLIP = 5.0
MIN_BARS = WARMUP + 2
"""Bars needed for one step: ``WARMUP + 1`` for the first observation and one more to earn a return."""


def log_returns(prices: torch.Tensor) -> torch.Tensor:
    """float64 ``[T]``: ``r_t = log(p_t / p_{t-1})``, with ``r_0 = 0``."""
    log_p = torch.log(prices.double())
    return torch.cat((log_p.new_zeros(1), log_p[1:] - log_p[:-1]))


def return_std(prices: torch.Tensor) -> float:
    """The standard deviation of a series' log returns: the ``sigma`` its features and rewards are scaled by."""
    sigma = float(log_returns(prices)[1:].std())
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"the prices' log returns have standard deviation {sigma}: need a positive one")
    return sigma


def market_features(prices: torch.Tensor, sigma: float) -> torch.Tensor:
    """The 48 market features of every bar, float32 ``[T, 48]`` (rows before :data:`WARMUP` are zero)."""
    r = log_returns(prices)
    log_p = torch.log(prices.double())
    t = torch.arange(WARMUP, len(prices), device=prices.device)
    lagged = r.unfold(0, N_RETURNS, 1)[t - N_RETURNS + 1]
    vols = [r.unfold(0, w, 1)[t - w + 1].square().mean(1).sqrt() for w in WINDOWS]
    moms = [(log_p[t] - log_p[t - w]) / math.sqrt(w) for w in WINDOWS]
    feats = torch.cat((lagged, torch.stack(vols, 1), torch.stack(moms, 1)), 1) / sigma
    out = torch.zeros(len(prices), N_MARKET_FEATURES, dtype=torch.float32, device=prices.device)
    out[WARMUP:] = feats.clamp(-FEATURE_CLIP, FEATURE_CLIP).float()
    return out


def _check_prices(prices: torch.Tensor) -> torch.Tensor:
    prices = torch.as_tensor(prices, dtype=torch.float64)
    if prices.dim() != 1 or len(prices) < MIN_BARS:
        raise ValueError(f"prices must be a 1-D series of at least {MIN_BARS} bars, got shape {list(prices.shape)}")
    if not bool(torch.isfinite(prices).all()) or not bool((prices > 0).all()):
        raise ValueError("prices must be finite and positive")
    return prices


def _check_scale(scale: torch.Tensor | np.ndarray, n_bars: int) -> torch.Tensor:
    """``vol_scale`` as float64 ``[n_bars]`` with non-finite values 0, or a one-line ValueError."""
    out = torch.as_tensor(np.asarray(scale, dtype=np.float64) if not isinstance(scale, torch.Tensor) else scale)
    out = out.to(torch.float64)
    if out.shape != (n_bars,):
        raise ValueError(f"vol_scale must be [{n_bars}], one value a bar, got shape {list(out.shape)}")
    out = torch.where(torch.isfinite(out), out, 0.0)
    if (out < 0).any():
        raise ValueError("vol_scale must be >= 0")
    return out
