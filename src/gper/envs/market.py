"""A futures-style trading task: pick a target position in [-1, 1] at each bar's close.

Observation (float32, :data:`OBS_DIM` = 51 features), at bar ``t`` with log returns
``r_t = log(p_t / p_{t-1})`` scaled by ``sigma``, the standard deviation of the *training* series'
log returns (so held-out data is scaled like the data the agent learnt on):

====== ==========================================================================================
index  feature
====== ==========================================================================================
0-39   ``r_{t-39} / sigma, ..., r_t / sigma``, oldest first
40-43  realized volatility ``sqrt(mean(r^2))`` over the last 5, 10, 20, 40 returns, ``/ sigma``
44-47  momentum z-score ``log(p_t / p_{t-w}) / (sigma * sqrt(w))`` for w = 5, 10, 20, 40
48     current position, in [-1, 1] (0 at an episode's start)
49     the previous step's reward (0 at an episode's start)
50     fraction of the episode elapsed, ``steps / episode_len`` (cycling in :func:`evaluate`)
====== ==========================================================================================

Features 0-47 are clipped to [-5, 5] so one bad bar of real data cannot blow up the network's
input; they depend on prices only, so they are computed once per bar (:func:`market_features`) and
a step gathers them.

Action ``a`` in [0, n) sets the target position ``(a - h) / h``, ``h = n // 2``, evenly spaced over
[-1, 1] with the middle action exactly flat: ``n = 45`` by default (:data:`POSITIONS`), 3 for short /
flat / long (``n_actions``, ``gper train --actions``). Moving
from position ``p`` to ``p'`` at bar ``t`` earns the log P&L ``p' * r_{t+1} - cost * |p' - p|``
(``cost = cost_bps * 1e-4`` per unit traded), and the reward is that divided by ``sigma``: P&L in
units of a typical bar's move, so rewards are O(1) whatever the instrument's volatility. The
unscaled log P&L of the last step is :attr:`MarketEnv.last_log_pnl`.

With ``turnover_bps`` the reward (not the log P&L) is lowered by a further ``turnover_bps * 1e-4``
per unit traded, which teaches fewer trades than the costs alone without counting in the P&L the
walks report.

With volatility targeting (``vol_scale``: :func:`gper._volatility.volatility_scale`, ``gper train
--vol-target``) the chosen position ``p'`` is held as ``p' * s_t`` units of the asset, ``s_t`` the
bar's scale (the target over the annualised volatility of the returns up to bar ``t``, 0 where it
is not known yet): the step earns ``p' s_t r_{t+1} - cost * |p' s_t - p s_{t-1}|``, the cost on
the change of the units held. Feature 48 stays the chosen position ``p'``.

Episodes start flat at a random bar and are truncated (never terminated: a market has no
terminal state) after ``episode_len`` steps or where the data ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gper._volatility import volatility_scale
from gper.envs._rng import EnvRng
from gper.envs.base import Step, VecEnv, canonical_device, check_num_envs
from gper.envs.market_data import SYNTHETIC_KINDS, load_bars_csv, synthetic_prices

# the per-bar arithmetic, in a module of its own; every name is this module's too (the package's API)
from gper.envs.market_series import (  # noqa: F401
    FEATURE_CLIP,
    MIN_BARS,
    N_ACTIONS,
    N_MARKET_FEATURES,
    N_RETURNS,
    OBS_DIM,
    POSITIONS,
    REAL_COST_BPS,
    SYNTHETIC_COST_BPS,
    WARMUP,
    WINDOWS,
    _check_prices,
    _check_scale,
    action_positions,
    default_cost_bps,
    log_returns,
    market_features,
    return_std,
)
from gper.envs.packaged import read_bars
from gper.envs.registry import EnvSpec


class MarketEnv(VecEnv):
    """``num_envs`` traders on one price series, each walking its own episode (see the module docstring).

    Args:
        prices: close prices, float64 ``[T]``, ``T >= MIN_BARS``.
        num_envs: copies stepped together.
        device: where everything lives and every step runs.
        seed: seeds the environment's own generator of start bars.
        episode_len: steps per episode (fewer where the data ends first).
        cost_bps: trading cost in basis points of notional per unit of position traded.
        random_start: start episodes at random bars; otherwise every episode starts at the first
            usable bar (:data:`WARMUP`), as :func:`evaluate` needs.
        generator, graph_safe_rng: where start bars are drawn from (see :mod:`gper.envs._rng`).
        sigma: the return scale; default the standard deviation of ``prices``' own log returns.
            Pass the training series' value for held-out data (:meth:`from_source` does).
        n_actions: target positions to choose from, evenly spaced over [-1, 1] (odd, >= 3).
        turnover_bps: a penalty in the reward on top of ``cost_bps``, in basis points per unit
            traded, not counted in the log P&L (see the module docstring).
        vol_scale: float64 ``[T]``, each bar's units of the asset per unit of chosen position
            (volatility targeting, see the module docstring); NaN or infinite values are 0 (no
            position while the volatility is unknown). None: the chosen position is held as is.

    Random starts are uniform over the bars from which a whole episode fits in the data (all usable
    bars when the series is shorter than an episode).
    """

    name = "market"
    obs_dim = OBS_DIM
    n_actions = N_ACTIONS
    graph_safe = True

    def __init__(
        self,
        prices: torch.Tensor,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        episode_len: int = 256,
        cost_bps: float = 1.0,
        random_start: bool = True,
        generator: torch.Generator | None = None,
        graph_safe_rng: bool = False,
        sigma: float | None = None,
        n_actions: int = N_ACTIONS,
        vol_scale: torch.Tensor | np.ndarray | None = None,
        turnover_bps: float = 0.0,
    ) -> None:
        check_num_envs(num_envs)
        if not (isinstance(turnover_bps, (int, float)) and math.isfinite(turnover_bps) and turnover_bps >= 0):
            raise ValueError(f"turnover_bps must be >= 0, got {turnover_bps!r}")
        positions = action_positions(n_actions)
        if not isinstance(episode_len, int) or episode_len < 1:
            raise ValueError(f"episode_len must be an int >= 1, got {episode_len!r}")
        if not (math.isfinite(cost_bps) and cost_bps >= 0):
            raise ValueError(f"cost_bps must be >= 0, got {cost_bps!r}")
        self.num_envs = num_envs
        self.device = canonical_device(device)
        self.episode_len = episode_len
        self.horizon = episode_len
        """Period of feature 50 (steps into the episode / horizon): the training episode length, kept
        by :func:`evaluate`, whose single episode spans the whole series."""
        self.cost_bps = float(cost_bps)
        self.cost = self.cost_bps * 1e-4
        self.turnover_bps = float(turnover_bps)
        self.penalty = self.turnover_bps * 1e-4
        self.random_start = random_start
        prices = _check_prices(prices)
        self.sigma = return_std(prices) if sigma is None else float(sigma)
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be positive, got {sigma!r}")
        self.prices = prices.to(self.device)
        self.returns = log_returns(self.prices)
        self.features = market_features(self.prices, self.sigma)
        self.positions = positions.to(self.device)
        self.n_actions = n_actions
        self.vol_scale = None if vol_scale is None else _check_scale(vol_scale, len(prices)).to(self.device)
        """[T] float64 units held per unit of chosen position at each bar, or None (held as chosen)"""
        self.n_bars = len(prices)
        self.last_start = max(WARMUP, self.n_bars - 1 - episode_len)
        self._rng = EnvRng(self.device, seed, generator, graph_safe_rng)

        def zeros(dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(num_envs, dtype=dtype, device=self.device)

        self.bar = zeros(torch.int64)
        """[N] int64: the bar each trader decides at next."""
        self.steps = zeros(torch.int64)
        """[N] int64: steps taken in the current episode."""
        self.position = zeros(torch.float64)
        """[N] float64: the position held coming into :attr:`bar`."""
        self.exposure = zeros(torch.float64)
        """[N] float64: the units of the asset held coming into :attr:`bar` (with ``vol_scale``; else unused)"""
        self.prev_reward = zeros(torch.float32)
        """[N] float32: the reward of the step that led to :attr:`bar` (0 at an episode's start)."""
        self.last_log_pnl = zeros(torch.float64)
        """[N] float64: the unscaled log P&L after costs of the last step."""
        self.last_traded = zeros(torch.float64)
        """[N] float64: ``|p' - p|`` of the last step."""
        self.reset()

    @classmethod
    def from_source(
        cls,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        data: str | Path | None = None,
        split: str = "train",
        synthetic_kind: str = "regime",
        n_bars: int = 400_000,
        test_bars: int = 20_000,
        test_fraction: float = 0.2,
        vol_target: float | None = None,
        cost_bps: float | None = None,
        **kwargs: Any,
    ) -> MarketEnv:
        """The ``split`` ("train" or "test") of a synthetic market or of a CSV bar file.

        With ``data=None``, :func:`synthetic_prices` of ``synthetic_kind`` are made: ``n_bars`` for
        training from ``seed`` (enough that a network cannot memorise the series) and ``test_bars``
        from an independent seed derived from it, so the test split is held-out data of the same law.
        With a CSV path (:func:`load_bars_csv`), the first ``1 - test_fraction`` of the bars are
        train and the rest test; the test env also gets the :data:`WARMUP` + 1 bars before the split
        as history, so its first decision earns the first held-out return. Both splits are scaled
        by the train series' ``sigma``. With ``vol_target`` each split's positions are scaled to it
        (:func:`gper._volatility.volatility_scale`), from the returns up to each bar: of the
        whole file for a CSV's test split, whose bars follow the training ones. ``cost_bps``: None
        is :func:`default_cost_bps` (2 bp on real bars, 1 on synthetic prices). ``kwargs`` go to
        the constructor.
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        if data is None:
            if synthetic_kind not in SYNTHETIC_KINDS:
                raise ValueError(f"unknown synthetic_kind {synthetic_kind!r}: expected one of {SYNTHETIC_KINDS}")
            n_train, n_test = n_bars, test_bars
            if min(n_train, n_test) < MIN_BARS:
                raise ValueError(f"n_bars and test_bars must be >= {MIN_BARS}, got {n_bars} and {test_bars}")
            train = synthetic_prices(n_train, seed, synthetic_kind)
            test_seed = int(np.random.SeedSequence([int(seed), 1]).generate_state(1)[0])
            prices = train if split == "train" else synthetic_prices(n_test, test_seed, synthetic_kind)
            history, first = prices, 0  # the series the volatility is read from, and where prices start in it
        else:
            needed = math.ceil(MIN_BARS / (1 - test_fraction)) + 1
            bars = read_bars(data, min_rows=needed).close
            n_train = len(bars) - max(1, round(len(bars) * test_fraction))
            if n_train < MIN_BARS:
                raise ValueError(f"{data}: {len(bars)} bars leave {n_train} for training, at least {MIN_BARS} needed")
            train = bars[:n_train]
            prices = train if split == "train" else bars[n_train - 1 - WARMUP :]
            history, first = bars, 0 if split == "train" else n_train - 1 - WARMUP
        if vol_target is not None:
            scale = volatility_scale(history[: first + len(prices)].double().numpy(), vol_target)
            kwargs["vol_scale"] = scale[first:]
        cost = default_cost_bps(data) if cost_bps is None else cost_bps
        return cls(prices, num_envs, device, seed=seed, sigma=return_std(train), cost_bps=cost, **kwargs)

    @property
    def generator(self) -> torch.Generator | None:
        """The generator start bars come from (``None``: torch's default one of the device)."""
        return self._rng.generator

    def _start_bars(self) -> torch.Tensor:
        if not self.random_start:
            return torch.full((self.num_envs,), WARMUP, dtype=torch.int64, device=self.device)
        return torch.randint(
            WARMUP, self.last_start + 1, (self.num_envs,), generator=self._rng.generator, device=self.device
        )

    def _observe(self, bar: torch.Tensor, position: torch.Tensor, prev_reward: torch.Tensor, steps: torch.Tensor):
        # steps / horizon within an episode; past the horizon (evaluate) it starts again after 1
        clock = torch.where(steps > 0, (steps - 1) % self.horizon + 1, 0).float() / self.horizon
        info = torch.stack((position.float(), prev_reward, clock), 1)
        return torch.cat((self.features[bar], info), 1)

    def observe(self) -> torch.Tensor:
        """The current observations, float32 ``[N, 51]``."""
        return self._observe(self.bar, self.position, self.prev_reward, self.steps)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self._rng.seed(seed)
        self.bar.copy_(self._start_bars())
        for t in (self.steps, self.position, self.exposure, self.prev_reward, self.last_log_pnl, self.last_traded):
            t.zero_()
        return self.observe()

    def step(self, actions: torch.Tensor) -> Step:
        self.check_actions(actions)
        target = self.positions[actions]
        if self.vol_scale is None:
            held = target
            traded = (target - self.position).abs()
        else:  # the chosen position in units of the asset at this bar's volatility
            held = target * self.vol_scale[self.bar]
            traded = (held - self.exposure).abs()
        log_pnl = held * self.returns[self.bar + 1] - self.cost * traded
        shaped = log_pnl if self.penalty == 0 else log_pnl - self.penalty * traded
        reward = (shaped / self.sigma).float()
        bar, steps = self.bar + 1, self.steps + 1
        truncated = (steps >= self.episode_len) | (bar >= self.n_bars - 1)
        next_obs = self._observe(bar, target, reward, steps)
        self.last_log_pnl.copy_(log_pnl)
        self.last_traded.copy_(traded)
        self.bar.copy_(torch.where(truncated, self._start_bars(), bar))
        self.steps.copy_(torch.where(truncated, 0, steps))
        self.position.copy_(torch.where(truncated, 0.0, target))
        if self.vol_scale is not None:
            self.exposure.copy_(torch.where(truncated, 0.0, held))
        self.prev_reward.copy_(torch.where(truncated, 0.0, reward))
        return Step(next_obs, reward, torch.zeros_like(truncated), truncated, self.observe())

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            name: getattr(self, name).clone() for name in ("bar", "steps", "position", "prev_reward")
        }
        if self.vol_scale is not None:
            out["exposure"] = self.exposure.clone()
        if self._rng.owned:
            out["generator"] = self._rng.generator.get_state()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("bar", "steps", "position", "prev_reward"):
            getattr(self, name).copy_(state[name])
        if self.vol_scale is not None:
            self.exposure.copy_(state["exposure"])
        if self._rng.owned and "generator" in state:
            self._rng.generator.set_state(state["generator"])


def evaluate(
    policy: Callable[[torch.Tensor], torch.Tensor],
    source: MarketEnv | torch.Tensor,
    *,
    sigma: float | None = None,
    cost_bps: float | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Trade one env with ``policy`` over a whole series, from its first usable bar to its end.

    ``policy`` maps observations float32 ``[1, 51]`` to actions ``[1]`` (greedy, for a fair score);
    it runs under ``torch.no_grad``. The position features depend on its earlier choices, so this is
    a loop of single steps, but one with no host synchronisation of its own.

    Args:
        source: a :class:`MarketEnv` (typically ``MarketEnv.from_source(1, dev, split="test")``),
            whose prices, ``sigma``, cost and device are used, or a price series.
        sigma, cost_bps, device: override those of ``source`` (for a price series: its own
            return std, 1 bp, the CPU).

    Returns:
        ``total_log_pnl`` (log P&L after costs, summed), ``buy_and_hold_log_pnl`` (+1 throughout,
        paying the cost of entering), ``flat_log_pnl`` (0), ``bars`` (steps walked), ``turnover``
        (sum of ``|p' - p|``, the entry included), ``sharpe_per_bar`` and
        ``buy_and_hold_sharpe_per_bar`` (mean over standard deviation of the per-bar log P&L,
        not annualised).
    """
    n_actions, scale = N_ACTIONS, None
    if isinstance(source, MarketEnv):
        prices, n_actions = source.prices, source.n_actions  # the actions the policy was trained on
        scale = source.vol_scale
        sigma = source.sigma if sigma is None else sigma
        cost_bps = source.cost_bps if cost_bps is None else cost_bps
        device = source.device if device is None else device
    else:
        prices = _check_prices(source)
    cost_bps = 1.0 if cost_bps is None else cost_bps
    device = torch.device("cpu" if device is None else device)
    n_steps = len(prices) - 1 - WARMUP
    env = MarketEnv(
        prices, 1, device, episode_len=n_steps, cost_bps=cost_bps, random_start=False, sigma=sigma,
        n_actions=n_actions, vol_scale=None if scale is None else scale.cpu(),
    )  # fmt: skip
    if isinstance(source, MarketEnv):
        env.horizon = source.horizon  # feature 50 cycles as it did in training
    pnl, traded = trade(policy, env)
    held = env.returns[WARMUP + 1 :].clone()
    held[0] -= env.cost
    return {
        "total_log_pnl": float(pnl.sum()),
        "buy_and_hold_log_pnl": float(held.sum()),
        "flat_log_pnl": 0.0,
        "bars": n_steps,
        "turnover": float(traded.sum()),
        "sharpe_per_bar": _sharpe(pnl),
        "buy_and_hold_sharpe_per_bar": _sharpe(held),
    }


def trade(policy: Callable[[torch.Tensor], torch.Tensor], env: MarketEnv) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk ``env`` (one copy, ``random_start=False``, an episode as long as its series) with
    ``policy`` from its first usable bar to its end: float64 ``[steps]`` log P&L after costs and
    ``|p' - p|`` of each step, on ``env``'s device (no host synchronisation of its own)."""
    n_steps = env.n_bars - 1 - WARMUP
    if env.num_envs != 1 or env.random_start or env.episode_len < n_steps:
        raise ValueError(
            "trade() walks one copy from the first usable bar to the end: num_envs 1, random_start "
            f"False, episode_len >= {n_steps}"
        )
    pnl = torch.zeros(n_steps, dtype=torch.float64, device=env.device)
    traded = torch.zeros(n_steps, dtype=torch.float64, device=env.device)
    obs = env.reset()
    with torch.no_grad():
        for i in range(n_steps):
            actions = policy(obs).reshape(1).to(torch.int64)
            obs = env.step(actions).obs
            pnl[i : i + 1].copy_(env.last_log_pnl)
            traded[i : i + 1].copy_(env.last_traded)
    return pnl, traded


def _sharpe(pnl: torch.Tensor) -> float:
    std = float(pnl.std(correction=0))
    return float(pnl.mean()) / std if std > 0 else 0.0


def market_settings(run: Any, split: str) -> dict[str, Any]:
    """:meth:`MarketEnv.from_source`'s arguments from a training run's settings, for ``split``."""
    kwargs: dict[str, Any] = dict(data=run.data, split=split, episode_len=run.episode_len, cost_bps=run.cost_bps)
    kwargs["n_actions"] = getattr(run, "actions", N_ACTIONS)  # settings of an algorithm without the choice: 45
    kwargs["vol_target"] = getattr(run, "vol_target", None)
    if split == "train":  # a lesson of the training reward only: the evaluation scores without it
        kwargs["turnover_bps"] = getattr(run, "turnover_bps", 0.0)
    if run.data is None:
        kwargs.update(n_bars=run.bars, test_bars=run.test_bars)
    return kwargs


def final_test(policy: Callable[[torch.Tensor], torch.Tensor], env: MarketEnv) -> dict[str, float]:
    """The trainer's test at a run's end (:attr:`EnvSpec.final_test`): :func:`evaluate` over ``env``'s whole series."""
    return evaluate(policy, env)


def describe_final_test(result: dict[str, float], run: Any) -> str:
    """The log line of :func:`final_test`'s scores for a run of settings ``run``."""
    # the eval lines' greedy return is another number: a mean over short episodes of the same series
    return (
        f"market test, one walk over the whole held-out series ({result['bars']} bars): greedy policy log P&L "
        f"{result['total_log_pnl']:+.4f} (Sharpe/bar {result['sharpe_per_bar']:+.4f}), buy-and-hold "
        f"{result['buy_and_hold_log_pnl']:+.4f}, flat {result['flat_log_pnl']:+.4f} (the eval lines: the mean "
        f"return of {run.eval_episodes} episodes of {run.episode_len} bars of it, in the training reward's units)"
    )


# The trainer's presets (gper.envs.registry.PRESETS), a line per concern as cartpole's. Walk-forward
# (gper.walkforward): a fold trains on a window of a few hundred to a few thousand bars, so the network
# is small and training is counted in passes over the window (steps_per_bar), with validation picking
# the checkpoint; chosen on validation windows only (benchmarks/market_walk.py, docs/training.md
# "Walk-forward"): the best of 4 candidates (steps_per_bar 30 / 100 x hidden 64-64 / 256-256) on the
# validation windows of arch:sp500 and arch:nasdaq, seed 1 (market-walk-select-cpu-20261201-215141);
# those windows (2002-2017) are also the test windows of earlier folds, so only test years after the
# validation years used are free of the choice: docs/training.md, walk-forward results. Small
# already: the same on the CPU.
# fmt: off
SPEC = EnvSpec(
    "market",
    MarketEnv.from_source,
    data=True,
    settings=market_settings,
    eval_split="test",
    final_test=final_test,
    describe_final_test=describe_final_test,
    presets={
        "cuda": dict(
            total_steps=2_000_000, num_envs=256, hidden=(512, 512), buffer_size=2**21, batch_size=4096,
            learning_rate=1e-4, max_grad_norm=0.0, tau=0.005, target_every=1, eps_end=0.05,
            exploration_fraction=0.3, learning_starts=50_000, epoch_steps=100_000, solve_return=None,
            bars=400_000, test_bars=50_000, weight_norm="global",
        ),
        "cpu": dict(
            total_steps=300_000, num_envs=16, hidden=(128, 128), buffer_size=2**17, batch_size=256,
            learning_starts=10_000, epoch_steps=20_000, bars=100_000, test_bars=20_000,
        ),
    },
    walk_forward_presets={
        "cuda": dict(
            steps_per_bar=100, num_envs=64, hidden=(256, 256), buffer_size=2**17, batch_size=256,
            learning_rate=1e-4, max_grad_norm=10.0, tau=0.005, target_every=1, eps_end=0.05,
            exploration_fraction=0.3, learning_starts=5_000, solve_return=None, weight_norm="global",
        ),
        "cpu": {},
    },
)
# fmt: on


__all__ = [
    "MIN_BARS",
    "N_ACTIONS",
    "action_positions",
    "default_cost_bps",
    "REAL_COST_BPS",
    "SYNTHETIC_COST_BPS",
    "OBS_DIM",
    "POSITIONS",
    "WARMUP",
    "MarketEnv",
    "evaluate",
    "load_bars_csv",
    "market_features",
    "return_std",
    "synthetic_prices",
    "trade",
]
