"""One walk-forward fold: train a DQN on the training window, keep the checkpoint that scores best
on the validation window, score it once on the test window.

What each stage may read, which is what keeps the test window out of training and selection:

- **training**: the training window's bars only (its own return scale ``sigma``, its episodes);
- **selection**: the validation window, walked whole by the greedy policy every
  ``epoch_steps`` env steps (``total_steps / validations``); its environment reads the
  :data:`~gper.envs.folds.HISTORY` bars before the window as features (the training window's last);
- **test**: after training, once, with the chosen network (or flat, see ``flat_fallback`` and
  ``min_deflated_sharpe``: :mod:`gper.walkforward.selection`); its
  environment reads the bars before it as features (the validation window's last).

Validation and test are scaled by the training window's ``sigma`` and cost ``cost_bps`` per unit
traded, as training. Everything is seeded from the run's seed and the fold's index.

With ``population`` S > 1 the fold trains S agents at once (seeds ``seed + i`` of the fold's seed)
and the policy is their **ensemble**: it holds the mean of the members' target positions
(:mod:`gper.walkforward.ensemble`). Validation scores the ensemble (one candidate per validation,
every member at the same training step), the chosen checkpoint is the whole population's, and the
test walk reports each member beside the ensemble.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gper._volatility import volatility_scale
from gper.dqn.agent import Agent
from gper.dqn.build import build_replay
from gper.dqn.config import Config, resolve
from gper.dqn.network import padded_width
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.sweep import agent_configs
from gper.envs.folds import HISTORY, Fold
from gper.envs.market import N_ACTIONS, WARMUP, MarketEnv, return_std
from gper.envs.market_data import Bars
from gper.training.epochs import collect_iterations, step_iteration, train_steps_before
from gper.training.precision import matmul_precision
from gper.walkforward.baselines import VOL_TARGET, baseline_walk
from gper.walkforward.ensemble import trade_ensemble
from gper.walkforward.scores import buy_and_hold
from gper.walkforward.selection import deflated_sharpe

FLAT_ACTION = N_ACTIONS // 2
"""The action whose target position is exactly 0, of the default :data:`~gper.envs.market.N_ACTIONS`
actions (``env.n_actions // 2`` of any)."""


def fold_seed(seed: int, index: int) -> int:
    """The seed of fold ``index`` of a run of ``seed`` (independent streams per fold)."""
    return int(np.random.SeedSequence([int(seed), 3, int(index)]).generate_state(1)[0] >> 1)


def fold_config(config: Config, fold: Fold, device: torch.device) -> Config:
    """``config`` resolved for ``fold`` on ``device`` with the ``market-walk`` preset: ``total_steps``
    (when not given) ``steps_per_bar`` times the training window's bars, ``epoch_steps`` a
    ``validations``-th of it, no phase timing, the fold's seed.

    Raises:
        ValueError: bad settings, or a fold too short to train (fewer steps than ``learning_starts``).
    """
    walk = config.walk
    spb = walk.steps_per_bar
    if spb is None:
        preset = resolve(dataclasses.replace(config, total_steps=1, epoch_steps=1), device, "market-walk")
        spb = preset.walk.steps_per_bar
    if not isinstance(spb, int) or isinstance(spb, bool) or spb < 1:
        raise ValueError(f"steps_per_bar must be an integer >= 1, got {spb!r}")
    if not isinstance(walk.validations, int) or isinstance(walk.validations, bool) or walk.validations < 1:
        raise ValueError(f"validations must be an integer >= 1, got {walk.validations!r}")
    least = walk.min_deflated_sharpe
    if least is not None and (isinstance(least, bool) or not isinstance(least, (int, float)) or not 0 < least < 1):
        raise ValueError(f"min_deflated_sharpe must be a probability in (0, 1) or None, got {least!r}")
    band = walk.trade_band
    if isinstance(band, bool) or not isinstance(band, (int, float)) or not (math.isfinite(band) and band >= 0):
        raise ValueError(f"trade_band must be a finite number >= 0 (units of the asset), got {band!r}")
    total = config.total_steps if config.total_steps is not None else spb * fold.train.bars
    epoch = config.epoch_steps if config.epoch_steps is not None else max(1, total // walk.validations)
    walk = dataclasses.replace(walk, steps_per_bar=spb)
    asked = dataclasses.replace(config, total_steps=total, epoch_steps=epoch, walk=walk, time_every=0)
    cfg = resolve(asked, device, "market-walk")
    if cfg.learning_starts >= cfg.total_steps:
        given = "total_steps" if config.total_steps is not None else f"{fold.train.bars} bars x {spb} steps_per_bar"
        more = "raise total_steps" if config.total_steps is not None else "raise steps_per_bar"
        raise ValueError(
            f"fold {fold.index}: {cfg.total_steps} training steps ({given}) do not pass learning_starts "
            f"({cfg.learning_starts}): {more} or lower learning_starts"
        )
    return dataclasses.replace(cfg, seed=fold_seed(config.seed, fold.index))


def window_env(
    prices: torch.Tensor,
    start: int,
    end: int,
    like: MarketEnv,
    vol_scale: np.ndarray | None = None,
    copies: int = 1,
) -> MarketEnv:
    """A trader (``copies`` of it: an ensemble's members) walking bars ``[start, end)`` whole, with
    :data:`HISTORY` bars before them as features, the scale and cost of the training environment
    ``like``: its first decision, at bar ``start - 1``, earns bar ``start``'s return. ``vol_scale``:
    the whole series' (volatility targeting), of which the window's bars are read."""
    window = prices[start - HISTORY : end]
    env = MarketEnv(
        window,
        copies,
        like.device,
        episode_len=len(window) - 1 - WARMUP,
        cost_bps=like.cost_bps,
        random_start=False,
        sigma=like.sigma,
        n_actions=like.n_actions,
        vol_scale=None if vol_scale is None else vol_scale[start - HISTORY : end],
    )
    env.horizon = like.horizon  # feature 50 cycles as in training
    return env


def score(pnl: torch.Tensor, metric: str) -> float:
    """A validation score of per-bar log P&L after costs: Sharpe per bar, or the summed log P&L."""
    if metric == "log_pnl":
        return float(pnl.sum())
    std = float(pnl.std(correction=0))
    return float(pnl.mean()) / std if std > 0 else 0.0


def member_scores(pnl: torch.Tensor, metric: str) -> list[float]:
    """:func:`score` of each row of ``pnl`` (``[S, T]``: an ensemble's members), read back at once."""
    if metric == "log_pnl":
        return pnl.sum(dim=1).tolist()
    std = pnl.std(dim=1, correction=0)
    return torch.where(std > 0, pnl.mean(dim=1) / std, 0.0).tolist()


@dataclasses.dataclass
class FoldRun:
    """What :func:`run_fold` returns: the chosen network, the validation record, the test walk."""

    cfg: Config
    """the fold's resolved settings"""
    chosen: dict[str, Any]
    """epoch, env_step and validation score of the chosen checkpoint; ``flat``: True when it stays flat"""
    validations: list[dict[str, Any]]
    """every validation: env_step, epoch, score, log P&L, turnover (the ensemble's), and for an
    ensemble ``member_scores``, each member's score alone"""
    state: dict[str, torch.Tensor] | None
    """the chosen network's parameters (on the CPU; a population's stacked), None when no validation ran"""
    test: dict[str, Any] | None
    """the test walk (``time_ns``, ``policy_pnl``, ``policy_traded``, ``hold_pnl``, ``hold_traded``,
    ``baselines``, and for an ensemble ``members``: each member's ``(log_pnl, traded)``, ``[S, T]``
    each), None when not scored"""
    sigma: float
    """the training window's return scale"""


def run_fold(
    config: Config,
    bars: Bars,
    fold: Fold,
    device: torch.device,
    progress: Callable[[int], None] | None = None,
    score_test: bool = True,
) -> FoldRun:
    """Train, select and (with ``score_test``) test ``fold`` of ``bars`` (see the module docstring).

    ``progress(n)`` is called with the env steps done since its last call. Its matmuls run at the
    settings' ``precision`` (:func:`gper.training.precision.matmul_precision`).
    """
    with matmul_precision(fold_config(config, fold, device).precision):
        return _run_fold(config, bars, fold, device, progress, score_test)


def _run_fold(
    config: Config,
    bars: Bars,
    fold: Fold,
    device: torch.device,
    progress: Callable[[int], None] | None,
    score_test: bool,
) -> FoldRun:
    cfg = fold_config(config, fold, device)
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed)
    prices = bars.close
    train_prices = prices[fold.train.start : fold.train.end]
    # volatility targeting: each bar's scale from the returns up to it, over the whole series (a
    # window's first bars have their history), so no bar reads a later one
    scale = None if cfg.vol_target is None else volatility_scale(prices.double().numpy(), cfg.vol_target)
    sigma = return_std(train_prices)

    def make_env(settings: Config, on: torch.device) -> MarketEnv:
        return MarketEnv(
            train_prices,
            settings.num_envs,
            on,
            seed=settings.seed,
            episode_len=settings.episode_len,
            cost_bps=settings.cost_bps,
            graph_safe_rng=True,
            sigma=sigma,
            n_actions=settings.actions,
            vol_scale=None if scale is None else scale[fold.train.start : fold.train.end],
            turnover_bps=settings.turnover_bps,  # the training reward's; validation and test score the P&L
        )

    iterations = collect_iterations(cfg)
    learner, env = _learner(cfg, device, make_env, train_steps_before(cfg, iterations))
    try:
        val_env = window_env(prices, fold.val.start, fold.val.end, env, scale, copies=cfg.population)
        record, best, best_state, candidates = _train_and_validate(cfg, learner, val_env, iterations, progress)
        # the chosen checkpoint's worth among every candidate the fold scored (reported, and a rule with
        # min_deflated_sharpe)
        chosen = dict(best or {})
        if best is not None:
            chosen |= deflated_sharpe(candidates, best["epoch"] - 1)
        least = cfg.walk.min_deflated_sharpe
        flat = (
            best is None
            or (cfg.walk.flat_fallback and best["score"] <= 0)
            or (least is not None and chosen["deflated_sharpe"] < least)
        )
        chosen |= {"flat": flat, "metric": cfg.walk.select_metric}
        if cfg.population > 1:
            chosen["members"] = cfg.population
        test = None
        if score_test:
            # the baselines at the policy's volatility target, or the literature's 15% without one
            target = cfg.vol_target if cfg.vol_target is not None else VOL_TARGET
            test = _test_walk(prices, bars.time_ns, fold, env, learner, best_state, flat, scale, target)
        return FoldRun(cfg, chosen, record, best_state, test, env.sigma)
    finally:
        env.close()


def _learner(cfg: Config, device: torch.device, make_env, total_train_steps: int):
    """The fold's learner and its training environment (the first agent's, for a population): one
    agent, or ``cfg.population`` of them trained at once (seeds ``seed + i``) whose mean position trades."""
    if cfg.population == 1:
        env = make_env(cfg, device)
        rb = build_replay(cfg, padded_width(env.obs_dim), device)
        return Agent(cfg, env, rb, total_train_steps), env
    learner = PopulationAgent(agent_configs(cfg, cfg.population), device, total_train_steps, make_env=make_env)
    return learner, learner.blocks[0].env


def _train_and_validate(cfg: Config, learner, val_env: MarketEnv, iterations: int, progress):
    n = cfg.num_envs
    epoch_its = max(1, cfg.epoch_steps // n)
    record: list[dict[str, Any]] = []
    candidates: list[np.ndarray] = []  # every validation's per-bar log P&L (the ensemble's), in order
    best: dict[str, Any] | None = None
    best_state = None
    train_steps, done = 0, 0
    for it in range(iterations):
        if step_iteration(cfg, learner, it, None, train_steps):
            train_steps += 1
        if (it + 1) % epoch_its and it + 1 < iterations:
            continue
        if progress is not None:
            progress((it + 1) * n - done)
            done = (it + 1) * n
        if train_steps == 0:  # still collecting: nothing learnt to score
            continue
        pnl, traded, members = trade_ensemble(learner.greedy, val_env, cfg.walk.trade_band)
        candidates.append(pnl.detach().to("cpu", torch.float64).numpy())
        value = score(pnl, cfg.walk.select_metric)
        if not math.isfinite(value):
            raise ValueError(f"validation score {value} at env step {(it + 1) * n}: training diverged")
        entry: dict[str, Any] = {
            "env_step": (it + 1) * n,
            "epoch": len(record) + 1,
            "score": value,
            "log_pnl": float(pnl.sum()),
            "turnover": float(traded.sum()),
        }
        if cfg.population > 1:  # each member's own score, as it would trade alone
            entry["member_scores"] = member_scores(members.pnl, cfg.walk.select_metric)
        record.append(entry)
        if best is None or value > best["score"]:
            best = {k: v for k, v in entry.items() if k != "member_scores"}
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in learner.qnet.state_dict().items()}
    return record, best, best_state, candidates


def _test_walk(
    prices,
    time_ns,
    fold: Fold,
    env: MarketEnv,
    learner,
    state,
    flat: bool,
    scale: np.ndarray | None,
    baseline_target: float,
) -> dict[str, Any]:
    members = learner.cfg.population
    test_env = window_env(prices, fold.test.start, fold.test.end, env, scale, copies=members)
    if flat:

        def policy(obs: torch.Tensor) -> torch.Tensor:
            return torch.full((obs.shape[0],), env.n_actions // 2, dtype=torch.int64, device=obs.device)

    else:
        # training is over: the learner's own network takes the chosen checkpoint's weights
        learner.qnet.load_state_dict(state)
        policy = learner.greedy

    pnl, traded, walk = trade_ensemble(policy, test_env, learner.cfg.walk.trade_band)
    hold, hold_traded = buy_and_hold(test_env.returns[WARMUP + 1 :].cpu().numpy(), test_env.cost)
    # the classical baselines from the prices before each decision (the whole history: none after it)
    series = prices.detach().to("cpu", torch.float64).numpy()
    test: dict[str, Any] = {
        "time_ns": time_ns[fold.test.start : fold.test.end].numpy().copy(),
        "policy_pnl": pnl.cpu().numpy(),
        "policy_traded": traded.cpu().numpy(),
        "hold_pnl": hold,
        "hold_traded": hold_traded,
        "baselines": baseline_walk(series, fold.test.start, fold.test.end, test_env.cost, baseline_target),
    }
    if members > 1:
        test["members"] = (walk.pnl.cpu().numpy(), walk.traded.cpu().numpy())
    return test


__all__ = ["FLAT_ACTION", "FoldRun", "fold_config", "fold_seed", "run_fold", "score", "window_env"]
