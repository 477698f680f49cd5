"""The training run: :func:`setup` builds the agent, :func:`train` runs its epochs
(:class:`~gper.dqn.epochs.EpochLoop`) and writes the run folder."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch

import gper
from gper.distributed import ShardedPrioritizedReplayBuffer
from gper.dqn import checkpoint, parallel
from gper.dqn._extra import INSTALL, require
from gper.dqn.agent import Agent
from gper.dqn.checkpoint import Checkpoint
from gper.dqn.config import (
    Config,
    check_plain_run,
    cpu_threads,
    pick_device,
    replay_kind,
    resolve,
    trajectory_capacity,
)
from gper.dqn.epochs import EpochLoop, collect_iterations, train_steps_before
from gper.dqn.evaluation import Evaluator
from gper.dqn.network import GOAL_OBS_KEYS, goal_trajectory_spec, padded_width, replay_spec, trajectory_spec
from gper.dqn.parallel import Launch
from gper.dqn.report import Results, RunReport
from gper.dqn.run_folder import open_run_folder
from gper.envs import GoalEnv, VecEnv, is_goal_env, make_env, registry
from gper.training.plot import plot_run
from gper.training.runlog import RunLog
from gper.training.signals import StopSignals


def build_env(cfg: Config, device: torch.device, split: str = "train", own_rng: bool = False, rank: int = 0) -> VecEnv:
    """The environment of ``cfg`` on ``device`` (market: its ``split``). The training one draws from
    torch's default generator (seeded in :func:`setup`), which a CUDA graph capture handles by
    itself, so replays draw fresh numbers; with ``own_rng`` it draws from a generator of its own
    (seeded by ``cfg.seed`` and by its ``reset(seed)``), leaving torch's untouched (evaluation).
    A data-parallel run's rank ``rank`` seeds it with ``cfg.seed + rank``, so the ranks' streams differ."""
    spec = registry.lookup(cfg.env)  # None: make_env says it is unknown
    if cfg.data is not None and (spec is None or not spec.data):
        readers = " or ".join(s.name for s in registry.specs() if s.data)
        raise ValueError(f"--data is for the {readers} environment only")
    kwargs = spec.run_kwargs(cfg, split, own_rng) if spec is not None else {}
    return make_env(cfg.env, cfg.num_envs, device, seed=cfg.seed + rank, **kwargs)


def build_replay(
    cfg: Config,
    obs_dim: int,
    device: torch.device,
    autoreset: str = "same-step",
    goal_env: GoalEnv | None = None,
    launch: Launch | None = None,
) -> gper.PrioritizedReplayBuffer | gper.TrajectoryReplayBuffer | ShardedPrioritizedReplayBuffer:
    """The replay buffer of ``cfg`` for observations of ``obs_dim`` floats (the padded width) from
    an environment whose :attr:`~gper.envs.base.VecEnv.autoreset` is ``autoreset``
    (:func:`~gper.dqn.config.replay_kind` picks flat or trajectory). The trajectory replay holds
    ``buffer_size // num_envs`` steps of each environment, a window of ``n_step``. On CUDA either
    falls back to the CPU by itself when the GPU lacks the memory.

    For a goal task (``goal_env``, whose observations are ``obs_dim`` floats unpadded) the
    trajectory replay stores observation, achieved and desired goal apart
    (:func:`~gper.dqn.network.goal_trajectory_spec`) and relabels goals as ``cfg.her`` says, the
    rewards and terminations recomputed by the environment's ``compute_reward`` and
    ``compute_terminated``.

    With ``launch`` (a data-parallel run) this rank's part of one
    :class:`~gper.distributed.ShardedPrioritizedReplayBuffer` of ``buffer_size`` slots over the group,
    in ``launch.mode``: flat replay only (:func:`gper.dqn.parallel.check_settings`)."""
    if launch is not None:
        return ShardedPrioritizedReplayBuffer(
            cfg.buffer_size,
            replay_spec(obs_dim),
            alpha=cfg.alpha,
            beta=cfg.beta,
            sampling=cfg.sampling,
            weight_norm=cfg.weight_norm,
            mode=launch.mode,
            device=device,
            backend=cfg.backend,
            seed=cfg.seed,
        )
    if replay_kind(cfg, autoreset) == "trajectory":
        goal: dict[str, Any] = {}
        spec = trajectory_spec(obs_dim)
        if goal_env is not None:
            spec = goal_trajectory_spec(obs_dim, goal_env.goal_dim)
            her = gper.HindsightRelabeling(
                reward_fn=goal_env.compute_reward,
                terminated_fn=goal_env.compute_terminated,
                strategy=cfg.her,
                relabel_ratio=cfg.her_ratio,
            )
            goal = {"obs_keys": GOAL_OBS_KEYS, "her": her}
        return gper.TrajectoryReplayBuffer(
            trajectory_capacity(cfg),
            cfg.num_envs,
            spec,
            alpha=cfg.alpha,
            beta=cfg.beta,
            sampling=cfg.sampling,
            weight_norm=cfg.weight_norm,
            window=cfg.n_step,
            autoreset=autoreset,  # the env says how it resets: nothing is left to the buffer's guess
            device=device,
            backend=cfg.backend,
            seed=cfg.seed,
            **goal,
        )
    return gper.PrioritizedReplayBuffer(
        cfg.buffer_size,
        replay_spec(obs_dim),
        alpha=cfg.alpha,
        beta=cfg.beta,
        sampling=cfg.sampling,
        weight_norm=cfg.weight_norm,
        device=device,
        backend=cfg.backend,
        seed=cfg.seed,
    )


def setup(config: Config, log: Any = print, launch: Launch | None = None) -> tuple[Config, Agent, list[str]]:
    """The resolved settings, the agent (networks, optimizer, replay, environments) and notes on the device.

    With ``launch`` (a data-parallel run): this rank's agent, on ``launch.device``, its torch
    generators and environments seeded ``seed + rank``, its networks rank 0's (broadcast), its
    replay a shard of the group's, its gradients averaged over the group every step."""
    device = pick_device(config.device) if launch is None else launch.device
    notes: list[str] = []
    if device.type == "cpu":
        notes.append("no CUDA GPU: training on the CPU with the CPU presets (smaller sizes, no CUDA graphs)")
    cfg = resolve(config, device)
    rank = 0 if launch is None else launch.rank
    if launch is not None:
        parallel.check_settings(cfg, launch.world_size)
    torch.manual_seed(cfg.seed + rank)
    if device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed + rank)
    cfg, env, rb = _env_and_replay(cfg, device, launch)
    if launch is not None:
        notes.append(
            f"data-parallel on {launch.world_size} process{'es' if launch.world_size > 1 else ''} ({launch.mode} "
            f"sharded replay): global batch {launch.world_size * cfg.batch_size}, "
            f"{cfg.buffer_size // launch.world_size} replay slots a rank"
        )
    if rb.device != device:  # the replay did not fit on the GPU: everything moves to the CPU
        notes.append(
            f"not enough GPU memory for a replay of {rb.nbytes_estimate / 2**30:.1f} GiB: "
            "training on the CPU with the CPU presets"
        )
        del rb
        device = torch.device("cpu")
        env.close()
        cfg, env, rb = _env_and_replay(resolve(dataclasses.replace(config, device="cpu"), device), device)
    if device.type == "cpu" and cfg.threads is None:
        n = cpu_threads(cfg, padded_width(env.obs_dim), env.n_actions)
        notes.append(f"{n} torch thread{'s' if n > 1 else ''} for this network's size (--threads to change)")
    if cfg.solve_return is None and env.reward_threshold is not None:  # gym:<ID>: its registered threshold
        cfg = dataclasses.replace(cfg, solve_return=float(env.reward_threshold))
    for note in notes:
        log(f"gper train: {note}")
    total_train = train_steps_before(cfg, collect_iterations(cfg))  # beta reaches 1 at the last one
    if launch is None:
        return cfg, Agent(cfg, env, rb, total_train), notes
    average = parallel.GradientAverage(launch.world_size)
    agent = Agent(cfg, env, rb, total_train, grad_sync=average, env_seed=cfg.seed + rank)
    launch.broadcast_parameters([agent.qnet, agent.target])  # one network on every rank from the start
    return cfg, agent, notes


def _env_and_replay(cfg: Config, device: torch.device, launch: Launch | None = None) -> tuple[Config, VecEnv, Any]:
    """The environment and the replay of ``cfg`` (resolved) on ``device``, and ``cfg`` with ``replay``
    set to the kind built (``auto`` resolved against the environment's autoreset), which the run's
    record and checkpoints keep."""
    env = build_env(cfg, device, rank=0 if launch is None else launch.rank)
    try:
        cfg = dataclasses.replace(cfg, replay=replay_kind(cfg, env.autoreset))
        if launch is not None and cfg.replay != "flat":
            raise ValueError(parallel.NO_TRAJECTORY)
    except ValueError:
        env.close()
        raise
    if is_goal_env(env):  # its fields are the observation's parts, unpadded (the network input is padded)
        return cfg, env, build_replay(cfg, env.obs_dim, device, env.autoreset, goal_env=env)
    return cfg, env, build_replay(cfg, padded_width(env.obs_dim), device, env.autoreset, launch=launch)


def train(config: Config, log: Any = print) -> Results:
    """Train a DQN agent as ``config`` says; write the run folder; return the :class:`Results`.

    ``log`` receives the human-readable lines (the progress bar's ``write`` in the command).

    With ``save``, checkpoints go to the run folder's ``checkpoints/`` (:mod:`gper.dqn.checkpoint`)
    every ``checkpoint_every`` epochs and at the end. While it trains, SIGINT or SIGTERM makes it
    finish the collection iteration in progress, write a checkpoint (with ``save``), then
    ``summary.json`` (``stopped``: the signal) and ``plot.png`` of the run so far, and raise
    ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM). With ``resume``, it continues
    from a checkpoint, and continues its record (``metrics.jsonl``, TensorBoard, the report).

    Under torchrun (``distributed`` exact or local, :mod:`gper.dqn.parallel`) it is one rank of a
    data-parallel run: it joins the process group, trains its part, and leaves the group at the end
    (on an error too); rank 0 writes the run folder, logs and evaluates, the other ranks are quiet.

    Raises:
        ValueError: bad settings, settings a resume may not change, or a damaged checkpoint
            (:class:`~gper.training.checkpoints.CheckpointError`); each a one-line message.
    """
    check_plain_run(config)
    mode = parallel.resolve_mode(config.distributed)
    config = dataclasses.replace(config, distributed=mode)
    launch = parallel.start(mode, config.device)
    finished = False
    try:
        if launch is not None and not launch.main:  # quiet: rank 0 speaks for the group
            config = dataclasses.replace(config, progress=False)
            log = _quiet
        results = _train_process(config, log, launch)
        finished = True
        return results
    finally:
        parallel.stop(launch, finished)


def _quiet(line: str) -> None:
    pass


def _train_process(config: Config, log: Any, launch: Launch | None) -> Results:
    # the bar's package is checked first, before anything is built
    tqdm = require("tqdm.auto", "the progress bar", "or progress=False").tqdm if config.progress else None
    resume = None
    if config.resume and launch is None:
        resume = checkpoint.read(config.resume, 0, 1)
    elif config.resume:
        resume = launch.agree(
            lambda: checkpoint.read(config.resume, launch.rank, launch.world_size), "reading the checkpoint"
        )
    cfg, agent, notes = (
        setup(config, log, launch)
        if launch is None
        else launch.agree(lambda: setup(config, log, launch), "setting up the run")
    )
    before = torch.get_num_threads()
    threads = None
    if agent.device.type == "cpu":  # put back when the run ends
        threads = cpu_threads(cfg, agent.obs_width, agent.env.n_actions)
        torch.set_num_threads(threads)
    try:
        return _train(cfg, agent, notes, resume, log, tqdm, threads, launch)
    finally:
        torch.set_num_threads(before)


def _train(
    cfg: Config,
    agent: Agent,
    notes: list[str],
    resume: Checkpoint | None,
    log: Any,
    tqdm: Any,
    threads: int | None,
    launch: Launch | None = None,
) -> Results:
    main = launch is None or launch.main
    if resume is not None:
        checkpoint.check_settings(cfg, resume)  # the same settings and checkpoint on every rank: alike
        checkpoint.restore(agent, resume, launch)
    if launch is None:
        runlog = open_run_folder(cfg, agent.device, resume, log, threads)
    else:  # rank 0 names the folder (a time stamp) and writes it; the others checkpoint into it
        made = launch.agree(
            lambda: open_run_folder(cfg, agent.device, resume, log, threads) if main else None, "opening the run folder"
        )
        folder = launch.broadcast(str(made.folder) if main else None)
        runlog = made if main else parallel.QuietRunLog(folder)
    evaluator = None
    try:
        if cfg.eval_every > 0 and main:
            evaluator = Evaluator(cfg, functools.partial(build_env, device=agent.device))
        start_it = 0 if resume is None else resume.iteration
        returns = [] if resume is None else [float(r) for r in resume.state["returns"]]
        iterations = collect_iterations(cfg)
        report = RunReport(cfg, agent.device, runlog, returns, log)
        report_state = None if resume is None else resume.state["report"]
        with StopSignals() as signals:
            stop = signals if launch is None else parallel.GroupStop(signals, launch)
            run = EpochLoop(cfg, agent, report, stop, evaluator, launch, tqdm).run(start_it, iterations, report_state)
            # the end of the run: checkpoint, market evaluation (a signal stops it too), summary.json, plot
            path = run.checkpoint
            if cfg.save and run.iteration == iterations:
                path = checkpoint.save(agent, iterations, report, runlog, launch)
            market = cfg.env == "market" and not stop.requested and main
            evaluation = _evaluate(cfg, agent, log, stop) if market else None
            if stop.requested:  # the record of the run so far, then the signal's exception
                env_steps = run.iteration * cfg.num_envs
                results = report.results(env_steps, run.train_steps, run.wall, None, notes, stop.name)
                if main:
                    _write_record(cfg, results, runlog, log, stopped=True)
                _say_stopped(stop, path, env_steps, runlog, log)
                raise stop.exception()
        results = report.results(iterations * cfg.num_envs, run.train_steps, run.wall, evaluation, notes)
        if main:
            _write_record(cfg, results, runlog, log)
    finally:
        if evaluator is not None:
            evaluator.close()
        runlog.close()
    return results


def _say_stopped(stop: StopSignals, path: Path | None, env_steps: int, runlog: RunLog, log: Any) -> None:
    """The line a stopped run ends with: where its checkpoint is and how to go on."""
    if path is None:
        log(f"gper train: {stop.name}: stopped at env step {env_steps} (save is off: no checkpoint)")
    else:
        log(f"gper train: {stop.name}: stopped after writing {path}; continue with --resume {runlog.folder}")


def _write_record(cfg: Config, results: Results, runlog: RunLog, log: Any, stopped: bool = False) -> None:
    """``summary.json`` and ``plot.png`` (one line instead when matplotlib is missing)."""
    runlog.write_json("summary.json", dataclasses.asdict(results))
    runlog.flush()
    title = cfg.env + (f" (stopped at env step {results.env_steps:,})" if stopped else "")
    if plot_run(runlog.metrics_path, runlog.folder / "plot.png", title=title, solve_return=cfg.solve_return) is None:
        log(f"gper train: no plot.png: the plot needs matplotlib: {INSTALL}")


def _evaluate(cfg: Config, agent: Agent, log: Any, stop: StopSignals) -> dict[str, float] | None:
    """Market: the greedy policy on held-out prices, against buy-and-hold and flat; None when a
    stop signal arrives before it is done (it walks the whole series, seconds on a long one)."""
    from gper.envs.market import evaluate

    def greedy(obs: torch.Tensor) -> torch.Tensor:
        if stop.requested:
            raise _EvaluationStopped
        return agent.greedy(obs)

    test_env = build_env(dataclasses.replace(cfg, num_envs=1), agent.device, split="test")
    try:
        result = evaluate(greedy, test_env)
    except _EvaluationStopped:
        return None
    # the eval lines' greedy return is another number: a mean over short episodes of the same series
    log(
        f"market test, one walk over the whole held-out series ({result['bars']} bars): greedy policy log P&L "
        f"{result['total_log_pnl']:+.4f} (Sharpe/bar {result['sharpe_per_bar']:+.4f}), buy-and-hold "
        f"{result['buy_and_hold_log_pnl']:+.4f}, flat {result['flat_log_pnl']:+.4f} (the eval lines: the mean "
        f"return of {cfg.eval_episodes} episodes of {cfg.episode_len} bars of it, in the training reward's units)"
    )
    return result


class _EvaluationStopped(Exception):
    """A stop signal arrived during the market evaluation."""
