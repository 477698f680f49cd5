"""The training run: :func:`setup` builds the agent, :func:`train` runs the epochs and writes the run folder."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

import gper
from gper.dqn import checkpoint
from gper.dqn._extra import INSTALL, require
from gper.dqn.agent import Agent
from gper.dqn.checkpoint import Checkpoint
from gper.dqn.config import Config, pick_device, resolve
from gper.dqn.network import padded_width, replay_spec
from gper.dqn.report import Results, RunReport
from gper.envs import VecEnv, make_env
from gper.training.checkpoints import list_checkpoints, remove_temporaries, step_of
from gper.training.plot import plot_run
from gper.training.readback import AsyncReadback
from gper.training.runlog import RunLog
from gper.training.signals import StopSignals
from gper.training.timing import PhaseTimer


def trains_at(cfg: Config, iteration: int) -> bool:
    """Whether collection iteration ``iteration`` (0-based) is followed by a training step."""
    start = math.ceil(cfg.learning_starts / cfg.num_envs)
    return iteration >= start and (iteration - start) % cfg.train_every == 0


def collect_iterations(cfg: Config) -> int:
    """Collection iterations of a run (each steps every environment once)."""
    return math.ceil(cfg.total_steps / cfg.num_envs)


def train_steps_before(cfg: Config, iteration: int) -> int:
    """Training steps done before collection iteration ``iteration`` (0-based)."""
    return sum(trains_at(cfg, it) for it in range(iteration))


def plan_steps(cfg: Config) -> tuple[int, int]:
    """(collection iterations, training steps) of a run: the host knows both without asking the GPU."""
    iterations = collect_iterations(cfg)
    return iterations, train_steps_before(cfg, iterations)


def build_env(cfg: Config, device: torch.device, split: str = "train") -> VecEnv:
    # the device environments draw from torch's default generator (seeded in train): a CUDA
    # graph capture handles that one by itself, so replays draw fresh numbers
    kwargs: dict[str, Any] = {"graph_safe_rng": True} if not cfg.env.startswith("gym:") else {}
    if cfg.env == "market":
        kwargs.update(data=cfg.data, split=split, episode_len=cfg.episode_len, cost_bps=cfg.cost_bps)
        if cfg.data is None:
            kwargs.update(n_bars=cfg.bars, test_bars=cfg.test_bars)
    elif cfg.data is not None:
        raise ValueError("--data is for the market environment only")
    return make_env(cfg.env, cfg.num_envs, device, seed=cfg.seed, **kwargs)


def build_replay(cfg: Config, obs_dim: int, device: torch.device) -> gper.PrioritizedReplayBuffer:
    """The replay buffer; on CUDA it falls back to the CPU by itself when the GPU lacks the memory."""
    return gper.PrioritizedReplayBuffer(
        cfg.buffer_size,
        replay_spec(obs_dim),
        alpha=cfg.alpha,
        beta=cfg.beta,
        sampling=cfg.sampling,
        device=device,
        backend=cfg.backend,
        seed=cfg.seed,
    )


def setup(config: Config, log: Any = print) -> tuple[Config, Agent, list[str]]:
    """The resolved settings, the agent (networks, optimizer, replay, environments) and notes on the device."""
    device = pick_device(config.device)
    notes: list[str] = []
    if device.type == "cpu":
        notes.append("no CUDA GPU: training on the CPU with the CPU presets (smaller sizes, no CUDA graphs)")
    cfg = resolve(config, device)
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed)
    env = build_env(cfg, device)
    rb = build_replay(cfg, padded_width(env.obs_dim), device)
    if rb.device != device:  # the replay did not fit on the GPU: everything moves to the CPU
        notes.append(
            f"not enough GPU memory for a replay of {rb.nbytes_estimate / 2**30:.1f} GiB: "
            "training on the CPU with the CPU presets"
        )
        del rb
        device = torch.device("cpu")
        cfg = resolve(dataclasses.replace(config, device="cpu"), device)
        env.close()
        env = build_env(cfg, device)
        rb = build_replay(cfg, padded_width(env.obs_dim), device)
    for note in notes:
        log(f"gper train: {note}")
    total_train = train_steps_before(cfg, collect_iterations(cfg))  # beta reaches 1 at the last one
    return cfg, Agent(cfg, env, rb, total_train), notes


def train(config: Config, log: Any = print) -> Results:
    """Train a DQN agent as ``config`` says; write the run folder; return the :class:`Results`.

    ``log`` receives the human-readable lines (the progress bar's ``write`` in the command).

    With ``save``, checkpoints go to the run folder's ``checkpoints/`` (:mod:`gper.dqn.checkpoint`)
    every ``checkpoint_every`` epochs and at the end; while it trains, SIGINT or SIGTERM makes it
    finish the collection iteration in progress, write a checkpoint and raise ``KeyboardInterrupt``
    (SIGINT) or ``SystemExit(143)`` (SIGTERM). With ``resume``, it continues from a checkpoint.

    Raises:
        ValueError: bad settings, settings a resume may not change, or a damaged checkpoint
            (:class:`~gper.training.checkpoints.CheckpointError`); each a one-line message.
    """
    # the bar's package is checked first, before anything is built
    tqdm = require("tqdm.auto", "the progress bar", "or progress=False").tqdm if config.progress else None
    resume = checkpoint.read(config.resume) if config.resume else None
    cfg, agent, notes = setup(config, log)
    if resume is not None:
        checkpoint.check_settings(cfg, resume)
        checkpoint.restore(agent, resume)
    runlog = _open_run_folder(cfg, agent.device, resume, log)
    try:
        start_it = 0 if resume is None else resume.iteration
        returns = [] if resume is None else [float(r) for r in resume.state["returns"]]
        iterations = collect_iterations(cfg)
        report = RunReport(cfg, agent.device, runlog, returns, log)
        report_state = None if resume is None else resume.state["report"]
        with StopSignals() if cfg.save else contextlib.nullcontext() as stop:
            train_steps, wall = _run_epochs(cfg, agent, report, start_it, iterations, tqdm, runlog, stop, report_state)
            # the end of the run: checkpoint, market evaluation, summary.json, plot
            if cfg.save:
                path = checkpoint.save(agent, iterations, report, runlog)
                if stop.requested:
                    _stop(stop, path, runlog, log)
        evaluation = _evaluate(cfg, agent, log) if cfg.env == "market" else None
        results = report.results(iterations * cfg.num_envs, train_steps, wall, evaluation, notes)
        runlog.write_json("summary.json", dataclasses.asdict(results))
    finally:
        runlog.close()
    if plot_run(runlog.metrics_path, runlog.folder / "plot.png", title=cfg.env) is None:
        log(f"gper train: no plot.png: the plot needs matplotlib: {INSTALL}")
    return results


def _open_run_folder(cfg: Config, device: torch.device, resume: Checkpoint | None, log: Any) -> RunLog:
    """The run's folder: a resumed run continues in its checkpoint's unless ``run_name`` is given
    (``metrics.jsonl`` cut back to what it held at the checkpoint, the directories of checkpoint
    writes that never finished deleted); any other run's must hold no checkpoints."""
    if resume is not None and resume.run_folder is not None and cfg.run_name is None:
        folder = resume.run_folder
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_name = cfg.run_name or f"{cfg.env.replace(':', '_').replace('/', '_')}__s{cfg.seed}__{stamp}"
        folder = Path(cfg.run_dir) / run_name
    continues = resume is not None and resume.run_folder is not None and _same(folder, resume.run_folder)
    if continues:
        for path in remove_temporaries(folder / checkpoint.CHECKPOINTS):
            log(f"gper train: removed {path}, a checkpoint whose writing never finished")
        # later checkpoints go before metrics.jsonl is cut back to this one: a crash in between
        # must not leave a newest checkpoint whose metrics were cut away
        for path in list_checkpoints(folder / checkpoint.CHECKPOINTS):
            if step_of(path) > step_of(resume.path) and not _same(path, resume.path):
                shutil.rmtree(path)
                log(f"gper train: removed {path}, a checkpoint past the one this run resumes from")
    elif list_checkpoints(folder / checkpoint.CHECKPOINTS):
        raise ValueError(f"{folder} holds the checkpoints of another run: resume it, or give another run_name")
    runlog = RunLog(folder, metrics_bytes=resume.state["metrics_bytes"] if continues else None)
    if resume is not None:
        log(f"gper train: resumed from {resume.path} at env step {resume.iteration * cfg.num_envs}")
    runlog.write_json("config.json", {**dataclasses.asdict(cfg), "device": str(device), "gper": gper.__version__})
    return runlog


def _same(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.samefile(b)


def _run_epochs(
    cfg: Config,
    agent: Agent,
    report: RunReport,
    start_it: int,
    iterations: int,
    tqdm: Any,
    runlog: RunLog,
    stop: StopSignals | None,
    report_state: dict[str, Any] | None,
) -> tuple[int, float]:
    """Collection iterations ``start_it`` to ``iterations``, in epochs of ``epoch_steps`` env steps,
    with a progress bar when ``tqdm`` (the class) is given; return (training steps done, wall seconds).

    Epochs end at multiples of ``epoch_steps`` counted from the run's start, so a run resumed from
    any iteration ends its epochs (and re-sorts ranks) where the uninterrupted run does. With
    ``stop`` (``cfg.save``), checkpoints are written every ``checkpoint_every`` epochs, and a stop
    signal ends the loop after the iteration in progress, with a checkpoint.
    """
    n = cfg.num_envs
    epoch_its = max(1, cfg.epoch_steps // n)
    timer = PhaseTimer(agent.device)
    readback = AsyncReadback({"sums": agent.sums, "beta": agent.beta_t, **agent.episodes.snapshot()})
    bar = None
    if tqdm is not None:
        desc = f"gper train {cfg.env}"
        bar = tqdm(total=iterations * n, initial=start_it * n, unit="step", dynamic_ncols=True, desc=desc)
    t0 = time.perf_counter()
    train_steps = train_steps_before(cfg, start_it)
    report.start(t0, agent.sums.cpu(), train_steps)
    if report_state is not None:
        report.load_state_dict(report_state)
    it = start_it
    try:
        while it < iterations:
            end = min((it // epoch_its + 1) * epoch_its, iterations)
            for i in range(it, end):
                if _step(cfg, agent, i, timer, train_steps):
                    train_steps += 1
                if bar is not None and (i + 1) % 64 == 0:
                    bar.update(64 * n)
                if stop is not None and stop.requested and i + 1 < end:
                    # a consistent point: the episodes not reported yet are in the checkpoint's ring
                    _stop(stop, checkpoint.save(agent, i + 1, report, runlog), runlog, report.log)
            host, now = _sync(cfg, agent, readback)
            episodes, lost = agent.episodes.drain(host)
            metrics = report.end_epoch(
                host,
                episodes,
                lost,
                env_step=end * n,
                iterations=end - it,
                train_steps=train_steps,
                epsilon=float(agent.epsilon(end * n)),
                phases=timer.summary(),
                now=now,
            )
            if bar is not None:
                bar.update(end * n - bar.n)
                bar.set_postfix(ret=f"{metrics['charts/mean_return_last100']:.1f}", sps=f"{metrics['charts/SPS']:.0f}")
            it = end
            if stop is not None and it < iterations:
                due = cfg.checkpoint_every > 0 and (it // epoch_its) % cfg.checkpoint_every == 0
                if due or stop.requested:
                    path = checkpoint.save(agent, it, report, runlog)
                    if stop.requested:
                        _stop(stop, path, runlog, report.log)
    finally:
        if bar is not None:
            bar.close()
    return train_steps, time.perf_counter() - t0


def _stop(stop: StopSignals, path: Path, runlog: RunLog, log: Any) -> None:
    """After a stop signal: say where the checkpoint is, then raise what the signal calls for."""
    log(f"gper train: {stop.name}: stopped after writing {path}; continue with --resume {runlog.folder}")
    raise stop.exception()


def _step(cfg: Config, agent: Agent, it: int, timer: PhaseTimer, train_steps: int) -> bool:
    """Collection iteration ``it``, and the training step after it when one is due (the target
    update after it too); every ``time_every``-th iteration phase by phase into ``timer``.
    Returns whether it trained."""
    timed = timer if cfg.time_every > 0 and it % cfg.time_every == 0 else None
    agent.collect.run(timed)
    if not trains_at(cfg, it):
        return False
    agent.learn.run(timed)
    agent.update_target(train_steps + 1)
    return True


def _sync(cfg: Config, agent: Agent, readback: AsyncReadback) -> tuple[dict[str, torch.Tensor], float]:
    """The epoch's end, its only synchronisation with the device: the host copy of the sums, beta
    and episode ring, and the time it arrived."""
    readback.start()
    host = readback.wait()
    now = time.perf_counter()
    if cfg.sampling == "rank":
        # ranks are re-sorted here, at the epoch's sync: the buffer's own schedule counts host
        # calls, which graph replays are not; stats() refreshes its count of stored items
        agent.rb.stats()
        agent.rb.refresh_ranks()
    return host, now


def _evaluate(cfg: Config, agent: Agent, log: Any) -> dict[str, float]:
    """Market: the greedy policy on held-out prices, against buy-and-hold and flat."""
    from gper.envs.market import evaluate

    test_env = build_env(dataclasses.replace(cfg, num_envs=1), agent.device, split="test")
    result = evaluate(agent.greedy, test_env)
    log(
        f"market test on held-out prices ({result['bars']} bars): greedy policy log P&L "
        f"{result['total_log_pnl']:+.4f} (Sharpe/bar {result['sharpe_per_bar']:+.4f}), buy-and-hold "
        f"{result['buy_and_hold_log_pnl']:+.4f}, flat {result['flat_log_pnl']:+.4f}"
    )
    return result
