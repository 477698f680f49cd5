"""An ensemble of seeds trading as one: each member walks its own copy of a window, and the ensemble
holds the mean of the members' positions.

A walk-forward fold with ``population`` S > 1 trains S agents at once (a population: seeds
``seed + i``, :class:`gper.dqn.population_agent.PopulationAgent`) and trades their mean target
position, scaled to the volatility target as a single policy's is. Each member observes what it
would trading alone (its own position and last reward among its features), so the members'
decisions are those of S single policies; only the P&L is the mean position's. Averaging over
seeds rather than picking one is what holds out of sample in the studies of deep RL for trading:
the members' errors partly cancel, and positions that disagree net out to smaller trades.

The ensemble's log P&L at step ``t`` is ``H_t r_{t+1} - cost |H_t - H_{t-1}|`` with ``H_t`` the
mean over members of the units held (``H_{-1} = 0``): the market environment's arithmetic
(:meth:`gper.envs.market.MarketEnv.step`) on the mean position, so an ensemble of one is its member,
bit for bit. A no-trade band (``trade_band``) keeps the position held until the mean moves more
than the band away from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from gper.envs.market import WARMUP, MarketEnv


class MemberWalk(NamedTuple):
    """What :func:`walk_members` returns, float64 on the environment's device."""

    pnl: torch.Tensor
    """``[S, T]``: each member's log P&L after costs, as it would earn alone"""
    traded: torch.Tensor
    """``[S, T]``: each member's ``|held' - held|``"""
    held: torch.Tensor
    """``[S, T]``: the units of the asset each member holds after each decision (the target position,
    times the bar's volatility scale when the environment targets a volatility)"""


def walk_members(policy: Callable[[torch.Tensor], torch.Tensor], env: MarketEnv) -> MemberWalk:
    """Walk ``env``'s S copies (``random_start=False``, an episode as long as its series), copy ``i``
    stepped by the actions ``policy`` gives for row ``i`` of the observations ``[S, obs_dim]``, from the
    first usable bar to the end; no host synchronisation of its own."""
    steps = env.n_bars - 1 - WARMUP
    if env.random_start or env.episode_len < steps:
        raise ValueError(
            f"walk_members() walks every copy from the first usable bar to the end: random_start False, "
            f"episode_len >= {steps}"
        )
    s = env.num_envs
    pnl, traded, held = (torch.zeros(s, steps, dtype=torch.float64, device=env.device) for _ in range(3))
    obs = env.reset()
    with torch.no_grad():
        for i in range(steps):
            actions = policy(obs).reshape(s).to(torch.int64)
            target = env.positions[actions]
            held[:, i] = target if env.vol_scale is None else target * env.vol_scale[env.bar]
            obs = env.step(actions).obs
            pnl[:, i] = env.last_log_pnl
            traded[:, i] = env.last_traded
    return MemberWalk(pnl, traded, held)


def banded(target: np.ndarray, band: float) -> np.ndarray:
    """The units held when a position moves to ``target`` (float64 ``[T]``) only where the two differ by
    more than ``band``, from a flat start: a no-trade band, which skips the small trades a changing
    volatility scale or a member's change of mind asks for."""
    held = np.empty_like(target)
    now = 0.0
    for t, want in enumerate(target.tolist()):
        if abs(want - now) > band:
            now = want
        held[t] = now
    return held


def ensemble_pnl(
    held: torch.Tensor, returns: torch.Tensor, cost: float, band: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log P&L and ``|H' - H|`` (float64 ``[T]`` each) of holding ``H_t``, the mean over the members
    of ``held`` (``[S, T]``), earning ``returns`` (``[T]``: the return of the bar after each decision)
    at ``cost`` per unit traded, from a flat start. With ``band`` > 0 the position moves to the mean
    only where it differs from the position held by more than ``band`` units (:func:`banded`)."""
    if held.dim() != 2 or returns.shape != held.shape[1:]:
        raise ValueError(f"held must be [S, T] and returns [T], got {tuple(held.shape)} and {tuple(returns.shape)}")
    if not (math.isfinite(band) and band >= 0):
        raise ValueError(f"band must be a finite number >= 0, got {band!r}")
    mean = held.mean(dim=0)
    if band > 0:  # a walk of a few hundred bars, step by step on the host
        mean = torch.from_numpy(banded(mean.cpu().numpy(), band)).to(mean)
    traded = (mean - torch.cat((mean.new_zeros(1), mean[:-1]))).abs()
    return mean * returns.to(mean) - cost * traded, traded


def trade_ensemble(
    policy: Callable[[torch.Tensor], torch.Tensor], env: MarketEnv, band: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, MemberWalk]:
    """:func:`walk_members`, then the ensemble's log P&L and trades (:func:`ensemble_pnl`, with the
    no-trade ``band``): ``(pnl [T], traded [T], members)``."""
    walk = walk_members(policy, env)
    pnl, traded = ensemble_pnl(walk.held, env.returns[WARMUP + 1 :], env.cost, band)
    return pnl, traded, walk


__all__ = ["MemberWalk", "banded", "ensemble_pnl", "trade_ensemble", "walk_members"]
