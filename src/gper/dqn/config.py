"""The settings of a training run: :class:`Config`, the per-environment :data:`PRESETS` that its
``None`` fields stand for (kept in :mod:`gper.dqn.presets`), the device pick and the checks
(:func:`resolve`)."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

from gper.dqn.presets import PRESETS as PRESETS  # the per-environment defaults (gper.dqn.config.PRESETS, as before)
from gper.dqn.walk_settings import WALK_ONLY, WalkForward, nest_walk
from gper.envs import registry
from gper.envs.folds import WalkSpec, spec_from
from gper.envs.market import action_positions, default_cost_bps
from gper.training.environment import pick_device as pick_device  # gper.dqn.pick_device, as before
from gper.training.tensorboard import installed as tensorboard_installed


@dataclass
class Config:
    """Settings of one training run; ``None`` means the environment's preset (:data:`PRESETS`),
    smaller on the CPU."""

    env: str = "cartpole"
    """environment: a name registered in gper.envs (gper train --help lists them with their help lines)"""
    data: str | None = None
    """market: arch:sp500 or arch:nasdaq (the S&P 500's or the NASDAQ's daily bars, 1999-2018, from the arch
    package: pip install ".[data]"), or a CSV of bars (timestamp, open, high, low, close, volume); default
    synthetic prices"""
    seed: int = 1
    """seed of torch, the environments and the replay buffer"""
    population: int = 1
    """agents trained at once, each with its own networks, Adam state, environments and exact
    prioritized replay (an instance of one buffer): agent i is the single run seeded seed + i (bit for bit
    on the CPU), all of them in the same launches and CUDA graphs; flat replay, one process (docs/training.md)"""
    sweep: tuple[str, ...] = ()
    """a grid of settings, NAME=V1,V2,... (repeatable: learning_rate, gamma, alpha, beta, tau, eps_start,
    eps_end, exploration_fraction); each grid point gets population agents, agent i seed + i"""
    total_steps: int | None = None
    """environment steps to train for (all environments together)"""
    num_envs: int | None = None
    """environments stepped together"""
    device: str = "auto"
    """cuda, cuda:N, cpu, or auto (the GPU if there is one and the replay fits, else the CPU)"""
    distributed: Literal["auto", "off", "exact", "local"] = "auto"
    """data-parallel training, one process per GPU, under torchrun --nproc-per-node N -m gper train: exact
    (the replay sharded over the ranks samples as one buffer) or local (each rank samples its own shard,
    weights carry the shard ratio); auto: exact when torchrun started more than one process, else off.
    batch_size, num_envs, total_steps, learning_starts and epoch_steps are then per rank (the global batch is
    N * batch_size), buffer_size is over every rank (a multiple of N); flat replay only (docs/distributed.md)"""
    threads: int | None = None
    """CPU threads for torch when training on the CPU; default 1 for a training step under 1 GFLOP
    (every preset's network: more threads slow such steps down, about 2x with the cores shared
    with other processes), else the cores this process may use"""
    backend: Literal["auto", "triton", "torch"] = "auto"
    """replay kernels (and fused_step's): triton on CUDA, torch on the CPU, when auto"""
    hidden: tuple[int, ...] | None = None
    """hidden layer sizes of the Q-network (the reference network 51 -> 512 -> 512 -> 45 uses 512 512)"""
    buffer_size: int | None = None
    """replay capacity in transitions (the trajectory replay: in steps, rounded down to a multiple of num_envs)"""
    batch_size: int | None = None
    """transitions per training step"""
    learning_rate: float | None = None
    """Adam's learning rate"""
    adam_eps: float | None = None
    """Adam's epsilon, added to the root of its second moment (None: the environment's preset, else
    torch's 1e-8). Where a weight's root is well below it (small losses) its step shrinks from
    about learning_rate to about learning_rate * m_hat / adam_eps"""
    max_grad_norm: float | None = None
    """clip the gradient's global norm to this before each Adam step (0: no clipping)"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int | None = None
    """steps of reward in each learning target, 1 to 64: y = r_t + gamma r_(t+1) + ... + gamma^(n-1) r_(t+n-1)
    + gamma^n Q(s_(t+n)), cut short where the episode ends; above 1 it needs the trajectory replay.
    Default: the environment's preset (3 for atari:<Game>, 1 for the others)"""
    replay: Literal["auto", "flat", "trajectory"] = "auto"
    """replay buffer: flat (PrioritizedReplayBuffer: one row per transition), trajectory
    (TrajectoryReplayBuffer: each environment's steps in time order, n-step returns, Gymnasium's
    next-step autoreset; its capacity is buffer_size rounded down to a multiple of num_envs), or
    auto: trajectory when n_step > 1 or the environment resets on the next step, else flat"""
    her: Literal["none", "future", "final", "episode"] = "none"
    """hindsight goal relabelling (goal environments: bitflip:<N>), at sample time on the device: a
    goal achieved later in the same episode (future), at its end (final) or anywhere in it (episode)
    replaces her_ratio of the drawn goals, and the reward is recomputed for it; none keeps every
    stored goal. A goal environment always runs on the trajectory replay"""
    her_ratio: float = 0.8
    """the fraction of drawn transitions whose goal is relabelled (the paper's k = 4 future goals per
    transition: 4 / (4 + 1) = 0.8)"""
    tau: float | None = None
    """target network: 1.0 copies the online network every target_every training steps; below 1,
    a soft update with this rate after every training step"""
    target_every: int | None = None
    """training steps between hard target updates (tau = 1)"""
    double_q: bool = True
    """double-Q targets: the online network picks the next action, the target network values it"""
    dueling: bool = False
    """a dueling head on the pixel network (atari:<Game>): value and advantage streams, V + A - mean(A)"""
    loss: Literal["huber", "mse"] = "huber"
    """the TD loss, times each transition's IS weight: huber (delta 1: DQN's, SB3's, CleanRL's) or
    mse, the squared error (PureJaxRL's: larger steps where TD errors are large)"""
    sampling: Literal["proportional", "stratified", "rank", "uniform"] = "proportional"
    """replay sampling; uniform turns prioritization off (IS weights all 1, no priority updates); rank re-sorts
    once an epoch"""
    alpha: float = 0.6
    """priority exponent"""
    weight_norm: Literal["global", "batch"] | None = None
    """IS weights divided by the largest weight over every stored transition (global: the least
    likely one's, as Schaul et al.) or over the batch's draws (batch); where some priorities fall near
    0 (a goal task's relabelled successes) global makes every other weight tiny"""
    beta: float = 0.4
    """IS-weight exponent at the start, annealed linearly to 1 at the last training step"""
    eps_start: float = 1.0
    """epsilon-greedy: exploration rate at the start"""
    eps_end: float | None = None
    """epsilon-greedy: final exploration rate"""
    exploration_fraction: float | None = None
    """fraction of total_steps over which epsilon decays linearly to eps_end"""
    learning_starts: int | None = None
    """environment steps of pure collection before training starts"""
    train_every: int = 1
    """collection steps (of num_envs env steps each) per training step"""
    precision: Literal["tf32", "fp32", "bf16"] = "tf32"
    """matmul and convolution precision on CUDA: TF32 tensor cores, full FP32, or bf16 autocast (fp32 on the CPU)"""
    cuda_graphs: bool = True
    """replay the collection and training steps from CUDA graphs (on CUDA; off on the CPU)"""
    fused_step: bool = True
    """the training step with fused kernels: each hidden layer one GEMM with a ReLU epilogue
    (bf16: the plain layers), the loss and TD errors in one Triton kernel, Adam and the soft target
    update in one kernel per parameter tensor, and on CUDA the two forwards on the next
    observations on a second stream; the same update as without, up to float rounding (its
    kernels follow backend: Triton on CUDA, the torch references on the CPU, when auto)"""
    time_every: int = 10
    """time every N-th step phase by phase with CUDA events (0: no phase timing)"""
    graph_iterations: int = 1
    """replay this many collection iterations, with their training steps and target updates, as one
    CUDA graph (gper train's loop on CUDA with cuda_graphs; blocks never hold a timed step: raise
    time_every or set it to 0); 1: each iteration its own graph replays"""
    epoch_steps: int | None = None
    """environment steps per epoch (one readback, one timing line, one metrics flush)"""
    run_dir: str = "runs"
    """folder under which each run gets its own folder"""
    run_name: str | None = None
    """the run's folder name (default: <env>__s<seed>__<time>)"""
    save: bool = True
    """write checkpoints to <run folder>/checkpoints/: every checkpoint_every epochs, at the end, on SIGINT/SIGTERM"""
    checkpoint_every: int = 10
    """epochs between checkpoints (0: only at the end and on SIGINT/SIGTERM, which then stop the run)"""
    keep_checkpoints: int = 2
    """checkpoints kept in the run folder; an older one is deleted only once a newer one is complete"""
    resume: str | None = None
    """continue a run folder (from its newest checkpoint) or a checkpoint directory;
    in that run folder unless run_name is given; flags not given keep the checkpoint's settings;
    total_steps and learning_rate may change, settings that change shapes or the method may not"""
    progress: bool = True
    """show a progress bar"""
    solve_return: float | None = None
    """report when the mean return of the last 100 episodes first reaches this (cartpole: 475)"""
    eval_every: int = 5
    """evaluate the greedy policy every N epochs and after the last one, on an environment of its own
    (market: the held-out test prices); 0: no evaluation"""
    eval_episodes: int = 10
    """episodes per evaluation (one on each copy of the evaluation environment)"""
    tensorboard: bool = dataclasses.field(default_factory=tensorboard_installed)
    """also write the metrics as TensorBoard event files in the run folder; default: on when the tensorboard
    package is installed (pip install ".[tensorboard]")"""
    episode_len: int = 256
    """market: bars per training episode"""
    bars: int | None = None
    """market, synthetic prices: bars to train on"""
    test_bars: int | None = None
    """market, synthetic prices: bars of the held-out test series the greedy policy is scored on"""
    cost_bps: float | None = None
    """market: transaction cost in basis points of the traded position (per unit of position, or of the
    asset held with vol_target); default 2 with --data (daily index futures: half a spread, fees and
    slippage at the contract sizes of 2003-2018, with a margin), 1 on the synthetic prices (their
    signal is sized for it)"""
    actions: int = 45
    """market: target positions to choose from, evenly spaced over [-1, 1] (odd, at least 3; 3 is
    short / flat / long)"""
    turnover_bps: float = 0.0
    """market: a penalty in the training reward on top of cost_bps, in basis points per unit of position
    traded (fewer trades); the log P&L the evaluation and the walks report leaves it out"""
    vol_target: float | None = None
    """market: hold each chosen position scaled to this annual volatility (0.15: 15%), over the
    exponentially weighted volatility (span 60) of the daily returns up to each bar, in the reward and
    every walk; None: positions as chosen"""
    walk: WalkForward = dataclasses.field(default_factory=WalkForward)
    """market walk-forward: the windows and how each fold trains (gper.dqn.walk_settings; flat on the command line)"""
    gym_autoreset: Literal["same-step", "next-step"] = "same-step"
    """gym:<ID>: when Gymnasium resets an ended copy: in the step that ended it (same-step), or in a reset
    step after it that belongs to no episode (next-step, Gymnasium's own default; the replay must then be
    the trajectory one, which auto picks)"""


#: a training step (forward, backward: about 6 flops per weight per transition) above this many
#: flops is worth more than one CPU thread; below it, threads cost more in handoffs than they save
#: (docs/performance.md, *Figures the launchers and the trainer rely on*, has the timings)
MULTITHREAD_FLOPS = 1e9


def step_flops(obs_dim: int, n_actions: int, hidden: tuple[int, ...], batch_size: int) -> float:
    """Multiply-adds of one training step's forward and backward passes, times two (flops)."""
    widths = (obs_dim, *hidden, n_actions)
    weights = sum(a * b for a, b in zip(widths, widths[1:], strict=False))
    return 6.0 * batch_size * weights


def cpu_threads(cfg: Config, obs_dim: int, n_actions: int) -> int:
    """The torch thread count for training ``cfg`` on the CPU: ``cfg.threads`` when set, else
    1 below :data:`MULTITHREAD_FLOPS` a step, else the cores this process may use."""
    if cfg.threads is not None:
        return cfg.threads
    if step_flops(obs_dim, n_actions, cfg.hidden, cfg.batch_size) < MULTITHREAD_FLOPS:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def as_run(cfg: Config, device: torch.device, threads: int | None) -> dict[str, Any]:
    """``cfg``'s settings as they take effect on ``device`` (what ``config.json`` records): on the
    CPU no CUDA graphs, plain fp32 matmuls (TF32 and bf16 autocast are CUDA's) and ``threads``
    torch threads. ``cfg`` itself keeps what was asked, so a checkpoint resumed on a GPU runs as
    a GPU run."""
    settings = dataclasses.asdict(cfg)
    if device.type != "cuda":
        settings.update(cuda_graphs=False, precision="fp32", threads=threads)
    return settings


#: --her's strategies (gper.HindsightRelabeling's)
HER_STRATEGIES = ("none", "future", "final", "episode")


def is_goal_env_name(env: str) -> bool:
    """Whether ``env`` names a goal-conditioned environment (one that hindsight relabelling applies to)."""
    family = env_family(env)
    return any(spec.goal and spec.family == family for spec in registry.specs())


#: Adam's epsilon where the preset names none: torch.optim.Adam's default
TORCH_ADAM_EPS = 1e-8

#: the largest n_step: each n is a CUDA graph of its own, and the replay keeps n steps after a drawable one
MAX_N_STEP = 64


def replay_kind(cfg: Config, autoreset: str) -> str:
    """The replay ``cfg`` runs with on an environment whose :attr:`~gper.envs.base.VecEnv.autoreset`
    is ``autoreset``: ``"flat"`` or ``"trajectory"`` (``auto``: trajectory when ``n_step`` > 1 or
    the environment resets on the next step).

    Raises:
        ValueError: the flat replay with a next-step environment: it would store each reset step
            as a transition from an episode's final observation to the next episode's first.
    """
    if cfg.replay == "flat" and autoreset == "next-step":
        raise ValueError(
            f"{cfg.env} resets on the next step, which the flat replay cannot tell from a transition: "
            "use --replay trajectory (or auto), or --gym-autoreset same-step"
        )
    if cfg.replay != "auto":
        return cfg.replay
    goal = is_goal_env_name(cfg.env)  # the episode index and the goal fields live in the trajectory replay
    return "trajectory" if (cfg.n_step or 1) > 1 or autoreset == "next-step" or goal else "flat"


def from_settings(settings: dict[str, Any]) -> Config:
    """The :class:`Config` of ``settings`` (keyword arguments of ``Config``, or a ``config.json``'s
    dict), where the walk-forward settings may be flat (``steps_per_bar=30``, as on the command
    line and in a config.json written before :attr:`Config.walk`) or a ``walk`` dict."""
    nested = nest_walk(settings)
    return Config(**nested | {"walk": WalkForward(**nested["walk"])})


def walk_spec(config: Config) -> WalkSpec | None:
    """The walk-forward windows ``config`` asks for (gper.walkforward), or None for a plain run.

    Raises:
        ValueError: windows in two units, or train, val or test missing.
    """
    c = config.walk
    return spec_from(
        (c.train_months, c.val_months, c.test_months, c.step_months),
        (c.train_days, c.val_days, c.test_days, c.step_days),
        (c.fold_train_bars, c.fold_val_bars, c.fold_test_bars, c.fold_step_bars),
    )


def check_plain_run(config: Config) -> None:
    """Refuse walk-forward windows, or a walk-forward setting changed from its default, in a plain
    training run (:func:`gper.dqn.train`): they would be ignored there.

    Raises:
        ValueError: naming the window flags or the setting.
    """
    if walk_spec(config) is not None:
        raise ValueError(
            "walk-forward windows (train/val/test months, days or bars) are run by gper.walkforward.walk_forward "
            "or the gper train command, not gper.dqn.train"
        )
    defaults = WalkForward()
    for name in WALK_ONLY:
        if getattr(config.walk, name) != getattr(defaults, name):
            raise ValueError(
                f"{name} is a walk-forward setting: give the windows too (--train-months, --val-months, "
                "--test-months, or days, or bars), or leave it out"
            )


def trajectory_capacity(cfg: Config) -> int:
    """The trajectory replay's capacity: ``buffer_size`` rounded down to a multiple of ``num_envs``
    (each environment gets a ring of ``buffer_size // num_envs`` steps)."""
    return cfg.buffer_size // cfg.num_envs * cfg.num_envs


def env_family(env: str) -> str:
    """The preset family of an environment name: ``gym:<ID>`` -> gym, ``bitflip:<N>`` -> bitflip; a
    name no registration matches is its own."""
    spec = registry.lookup(env)
    return spec.family if spec is not None else env


def resolve(config: Config, device: torch.device, family: str | None = None) -> Config:
    """``config`` with every ``None`` replaced by the preset of its environment on ``device`` (or of
    the preset ``family``: ``market-walk`` for walk-forward training on a few thousand bars)."""
    # a family's name alone (``gym``, ``atari``) is no environment: its pattern wants the part after the colon
    known = family is not None or registry.lookup(config.env) is not None
    preset = registry.preset(family or env_family(config.env), device.type) if known else None
    if preset is None:
        *names, last = registry.env_names()
        raise ValueError(f"unknown environment {config.env!r}: expected {', '.join(names)} or {last}")
    filled = {
        f.name: preset[f.name]
        for f in dataclasses.fields(config)
        if getattr(config, f.name) is None and f.name in preset
    }
    walk = {
        f.name: preset[f.name]
        for f in dataclasses.fields(config.walk)
        if getattr(config.walk, f.name) is None and f.name in preset
    }
    cfg = dataclasses.replace(config, **filled, walk=dataclasses.replace(config.walk, **walk))
    cfg.hidden = tuple(int(h) for h in cfg.hidden)
    if cfg.n_step is None:  # presets that do not name it learn from 1-step targets
        cfg.n_step = 1
    if cfg.adam_eps is None:  # presets that do not name it: torch's
        cfg.adam_eps = TORCH_ADAM_EPS
    if cfg.cost_bps is None:
        cfg.cost_bps = default_cost_bps(cfg.data)
    _check(cfg)
    return cfg


def _check(cfg: Config) -> None:
    from gper.dqn.fused_loss import check_loss

    check_loss(cfg.loss)
    if cfg.dueling and env_family(cfg.env) != "atari":
        raise ValueError("dueling is a head of the pixel network: for atari:<Game> only")
    if isinstance(cfg.population, bool) or not isinstance(cfg.population, int) or cfg.population < 1:
        raise ValueError(f"population must be an integer >= 1, got {cfg.population!r}")
    if cfg.sweep:
        from gper.dqn.sweep import parse_sweeps

        parse_sweeps(cfg.sweep)
    positive = ("total_steps", "num_envs", "buffer_size", "batch_size", "target_every", "train_every", "epoch_steps")
    for name in (*positive, "episode_len"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    _check_replay(cfg)
    if not cfg.hidden or any(h < 1 for h in cfg.hidden):
        raise ValueError(f"hidden must be one or more sizes >= 1, got {cfg.hidden!r}")
    for name in ("gamma", "tau", "eps_start", "eps_end", "alpha", "beta"):
        value = getattr(cfg, name)
        if not 0 <= value <= 1:  # NaN fails too
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if cfg.tau == 0:
        raise ValueError("tau must be > 0 (1.0 for hard target updates)")
    if not 0 < cfg.exploration_fraction <= 1:
        raise ValueError(f"exploration_fraction must be in (0, 1], got {cfg.exploration_fraction}")
    if not (math.isfinite(cfg.max_grad_norm) and cfg.max_grad_norm >= 0):
        raise ValueError(f"max_grad_norm must be a finite number >= 0 (0: no clipping), got {cfg.max_grad_norm}")
    for name in ("learning_rate", "adam_eps"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    cost = cfg.cost_bps
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"cost_bps must be a finite number >= 0, got {cfg.cost_bps}")
    action_positions(cfg.actions)  # an odd integer >= 3, or one line saying so
    if not (math.isfinite(cfg.turnover_bps) and cfg.turnover_bps >= 0):
        raise ValueError(f"turnover_bps must be a finite number >= 0, got {cfg.turnover_bps}")
    target = cfg.vol_target
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 10):
        raise ValueError(f"vol_target must be an annual volatility in (0, 10) (0.15 is 15%) or None, got {target!r}")
    if cfg.solve_return is not None and not math.isfinite(cfg.solve_return):
        raise ValueError(f"solve_return must be a finite number, got {cfg.solve_return}")
    for settings in (cfg, cfg.walk):
        _check_integers(settings)
    if cfg.seed < 0:
        raise ValueError(f"seed must be >= 0, got {cfg.seed}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1, got {cfg.threads}")
    if cfg.learning_starts < cfg.batch_size or cfg.learning_starts < 0:
        raise ValueError(f"learning_starts ({cfg.learning_starts}) must be >= batch_size ({cfg.batch_size})")
    if cfg.time_every < 0:
        raise ValueError(f"time_every must be >= 0, got {cfg.time_every}")
    if not isinstance(cfg.checkpoint_every, int) or cfg.checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an integer >= 0, got {cfg.checkpoint_every!r}")
    if cfg.eval_every < 0:
        raise ValueError(f"eval_every must be an integer >= 0 (0: no evaluation), got {cfg.eval_every}")
    if cfg.eval_episodes < 1:
        raise ValueError(f"eval_episodes must be an integer >= 1, got {cfg.eval_episodes}")
    if not isinstance(cfg.keep_checkpoints, int) or cfg.keep_checkpoints < 1:
        raise ValueError(f"keep_checkpoints must be an integer >= 1, got {cfg.keep_checkpoints!r}")


def _check_integers(settings: Config | WalkForward) -> None:
    """Every integer setting of ``settings`` (bars, seed, learning_starts, steps_per_bar, ...): an
    int, not a float (NaN, inf) or a bool."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{f.name} must be an integer, got {value!r}")
        if (
            f.type in ("int | None", "Optional[int]")
            and value is not None
            and (not isinstance(value, int) or isinstance(value, bool))
        ):
            raise ValueError(f"{f.name} must be an integer, got {value!r}")


def _check_replay(cfg: Config) -> None:
    """n_step, replay and gym_autoreset: their ranges, and what each needs of the others."""
    if not isinstance(cfg.n_step, int) or isinstance(cfg.n_step, bool) or not 1 <= cfg.n_step <= MAX_N_STEP:
        raise ValueError(f"n_step must be an integer from 1 to {MAX_N_STEP}, got {cfg.n_step!r}")
    if cfg.replay not in ("auto", "flat", "trajectory"):
        raise ValueError(f"replay must be auto, flat or trajectory, got {cfg.replay!r}")
    if cfg.distributed not in ("auto", "off", "exact", "local"):
        raise ValueError(f"distributed must be auto, off, exact or local, got {cfg.distributed!r}")
    if cfg.weight_norm not in ("global", "batch"):
        raise ValueError(f"weight_norm must be global or batch, got {cfg.weight_norm!r}")
    if cfg.her not in HER_STRATEGIES:
        raise ValueError(f"her must be one of {', '.join(HER_STRATEGIES)}, got {cfg.her!r}")
    if not 0 <= cfg.her_ratio <= 1:  # NaN fails too
        raise ValueError(f"her_ratio must be in [0, 1], got {cfg.her_ratio}")
    goal = is_goal_env_name(cfg.env)
    if cfg.her != "none" and not goal:
        raise ValueError(f"her {cfg.her} relabels goals: it needs a goal environment (bitflip:<N>), not {cfg.env}")
    if goal and cfg.replay == "flat":
        raise ValueError(
            f"{cfg.env} is goal-conditioned: it runs on the trajectory replay (--replay trajectory or auto)"
        )
    if cfg.gym_autoreset not in ("same-step", "next-step"):
        raise ValueError(f"gym_autoreset must be same-step or next-step, got {cfg.gym_autoreset!r}")
    spec = registry.lookup(cfg.env)
    gym = spec is not None and "next-step" in spec.autoreset  # an environment that can reset either way
    if cfg.gym_autoreset == "next-step" and not gym:
        both = ", ".join(s.name for s in registry.specs() if "next-step" in s.autoreset)
        raise ValueError(f"gym_autoreset next-step is for {both} environments; {cfg.env} resets in the same step")
    if cfg.replay == "flat" and cfg.n_step > 1:
        raise ValueError(f"n_step {cfg.n_step} needs the trajectory replay: use --replay trajectory (or auto)")
    # what the environment will say (VecEnv.autoreset); setup asks the environment itself too
    if replay_kind(cfg, cfg.gym_autoreset if gym else "same-step") == "flat":
        return
    # the trajectory replay: a ring of at least n_step + 2 steps per environment, and n_step + 1
    # collection steps before the first draw (it has no drawable transition before that); the first
    # training step follows collection iteration ceil(learning_starts / num_envs), the iteration's own
    # step included
    rows = cfg.buffer_size // cfg.num_envs
    if rows < cfg.n_step + 2:
        raise ValueError(
            f"buffer_size {cfg.buffer_size} is too small for the trajectory replay with num_envs {cfg.num_envs} "
            f"and n_step {cfg.n_step}: it needs at least num_envs * (n_step + 2) = {cfg.num_envs * (cfg.n_step + 2)}"
        )
    if math.ceil(cfg.learning_starts / cfg.num_envs) < cfg.n_step:
        raise ValueError(
            f"learning_starts {cfg.learning_starts} is too small for the trajectory replay: with num_envs "
            f"{cfg.num_envs} and n_step {cfg.n_step} it needs at least num_envs * n_step = "
            f"{cfg.num_envs * cfg.n_step} env steps before the first training step"
        )
