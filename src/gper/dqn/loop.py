"""The training run: :func:`setup` builds the agent, :func:`train` runs the epochs and writes the run folder."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import gper
from gper.dqn.agent import SUM_ABS_TD, SUM_LOSS, SUM_Q, Agent
from gper.dqn.config import Config, pick_device, resolve
from gper.dqn.network import padded_width, replay_spec
from gper.dqn.report import _busy_fraction, format_phase_line
from gper.envs import VecEnv, make_env
from gper.training.readback import AsyncReadback
from gper.training.runlog import RunLog, plot_run
from gper.training.timing import PhaseTimer

# ---------------------------------------------------------------------------------------- loop


@dataclass
class Results:
    """What :func:`train` returns (also written to the run folder's ``summary.json``)."""

    run_dir: str
    device: str
    env_steps: int
    train_steps: int
    wall_s: float
    episodes: int
    mean_return_last100: float
    best_mean_return_last100: float | None
    solved_at_step: int | None
    """first env step at which the mean of the last 100 episodes reached ``solve_return``"""
    solved_at_s: float | None
    """wall seconds from the start to the end of the epoch in which it was reached"""
    phase_ms: dict[str, float]
    """mean ms per phase over the last epoch that was timed"""
    evaluation: dict[str, float] | None = None
    """market: greedy test P&L on held-out prices against buy-and-hold and flat"""
    notes: list[str] = dataclasses.field(default_factory=list)


def trains_at(cfg: Config, iteration: int) -> bool:
    """Whether collection iteration ``iteration`` (0-based) is followed by a training step."""
    start = math.ceil(cfg.learning_starts / cfg.num_envs)
    return iteration >= start and (iteration - start) % cfg.train_every == 0


def plan_steps(cfg: Config) -> tuple[int, int]:
    """(collection iterations, training steps) of a run: the host knows both without asking the GPU."""
    iterations = math.ceil(cfg.total_steps / cfg.num_envs)
    return iterations, sum(trains_at(cfg, it) for it in range(iterations))


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
    iterations, total_train = plan_steps(cfg)
    return cfg, Agent(cfg, env, rb, total_train), notes


def train(config: Config, log: Any = print) -> Results:
    """Train a DQN agent as ``config`` says; write the run folder; return the :class:`Results`.

    ``log`` receives the human-readable lines (the progress bar's ``write`` in the command).
    """
    cfg, agent, notes = setup(config, log)
    device = agent.device
    iterations, _ = plan_steps(cfg)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_name = cfg.run_name or f"{cfg.env.replace(':', '_').replace('/', '_')}__s{cfg.seed}__{stamp}"
    runlog = RunLog(Path(cfg.run_dir) / run_name)
    runlog.write_json("config.json", {**dataclasses.asdict(cfg), "device": str(device), "gper": gper.__version__})
    start_it, returns = 0, []
    if cfg.resume:
        state = torch.load(cfg.resume, map_location=device, weights_only=False)
        agent.load_state_dict(state["agent"])
        start_it, returns = int(state["iteration"]), list(state["returns"])
        log(f"gper train: resumed from {cfg.resume} at env step {start_it * cfg.num_envs}")
    return _loop(cfg, agent, runlog, iterations, start_it, returns, notes, log)


def _loop(
    cfg: Config,
    agent: Agent,
    runlog: RunLog,
    iterations: int,
    start_it: int,
    returns: list[float],
    notes: list[str],
    log: Any,
) -> Results:
    device, n = agent.device, cfg.num_envs
    epoch_its = max(1, cfg.epoch_steps // n)
    timer = PhaseTimer(device)
    readback = AsyncReadback({"sums": agent.sums, "beta": agent.beta_t, **agent.episodes.snapshot()})
    best = -math.inf
    solved_at: tuple[int, float] | None = None
    last_phase: dict[str, float] = {}
    bar = _progress(cfg, iterations * n, start_it * n)
    t0 = t_epoch = time.perf_counter()
    host_train = sum(trains_at(cfg, it) for it in range(start_it))
    prev_sums, prev_train = agent.sums.cpu(), host_train
    epoch_start_it = start_it
    it = start_it
    while it < iterations:
        timed = cfg.time_every > 0 and it % cfg.time_every == 0
        agent.collect.run(timer if timed else None)
        if trains_at(cfg, it):
            agent.learn.run(timer if timed else None)
            host_train += 1
            agent.update_target(host_train)
        it += 1
        if bar is not None and it % 64 == 0:
            bar.update(64 * n)
        if (it - epoch_start_it) % epoch_its and it < iterations:
            continue
        # ---- epoch end: the only synchronisation with the device
        readback.start()
        host = readback.wait()
        now = time.perf_counter()
        wall, t_epoch = now - t_epoch, now
        if cfg.sampling == "rank":
            # ranks are re-sorted here, at the epoch's sync: the buffer's own schedule counts host
            # calls, which graph replays are not; stats() refreshes its count of stored items
            agent.rb.stats()
            agent.rb.refresh_ranks()
        episodes, lost = agent.episodes.drain(host)
        if lost:
            log(f"gper train: {lost} finished episodes were not recorded (more than the ring holds in one epoch)")
        env_step = it * n
        for ret, length, step in episodes:
            returns.append(ret)
            runlog.log(step, **{"charts/episodic_return": ret, "charts/episodic_length": length})
        last100 = sum(returns[-100:]) / len(returns[-100:]) if returns else float("nan")
        # every 100-episode window that ends in this epoch: the best one, and the first at solve_return
        first_new = len(returns) - len(episodes)
        for k in range(max(100, first_new + 1), len(returns) + 1):
            window = sum(returns[k - 100 : k]) / 100
            best = max(best, window)
            if solved_at is None and cfg.solve_return is not None and window >= cfg.solve_return:
                solved_at = (episodes[k - 1 - first_new][2], now - t0)
        sums = host["sums"].clone()
        delta = sums - prev_sums
        prev_sums = sums
        steps_in_epoch = it - epoch_start_it
        epoch_start_it = it
        phases = timer.summary()
        if phases:
            last_phase = {name: ms for name, (ms, _) in phases.items()}
        trained, prev_train = host_train - prev_train, host_train
        metrics = {
            "charts/SPS": steps_in_epoch * n / wall,
            "charts/train_steps_per_s": trained / wall,
            "charts/epsilon": float(agent.epsilon(env_step)),
            "charts/beta": float(host["beta"]),
            "charts/mean_return_last100": last100,
        }
        if trained:
            metrics.update(
                {
                    "losses/td_loss": float(delta[SUM_LOSS] / trained),
                    "losses/q_values": float(delta[SUM_Q] / trained),
                    "losses/abs_td": float(delta[SUM_ABS_TD] / trained),
                }
            )
        metrics.update({f"timing/{name}_ms": ms for name, (ms, _) in phases.items()})
        runlog.log(env_step, **metrics)
        runlog.flush()
        busy = _busy_fraction(phases, steps_in_epoch, trained, wall, device.type == "cuda")
        log(format_phase_line(phases, device))
        log(
            f"step {env_step:>9d}  return(last100) {last100:8.2f}  episodes {len(returns):6d}  "
            f"env steps/s {metrics['charts/SPS']:9.0f}  train steps/s {metrics['charts/train_steps_per_s']:8.0f}  "
            f"wall {now - t0:7.1f}s" + (f"  busy {busy:.0%}" if busy is not None else "")
        )
        if bar is not None:
            bar.update(env_step - bar.n)
            bar.set_postfix(ret=f"{last100:.1f}", sps=f"{metrics['charts/SPS']:.0f}")
    if bar is not None:
        bar.close()
    wall_total = time.perf_counter() - t0
    if cfg.save:
        torch.save(
            {
                "agent": agent.state_dict(),
                "iteration": iterations,
                "returns": returns,
                "config": dataclasses.asdict(cfg),
            },
            runlog.folder / "checkpoint.pt",
        )
    evaluation = _evaluate(cfg, agent, log) if cfg.env == "market" else None
    results = Results(
        run_dir=str(runlog.folder),
        device=str(device),
        env_steps=iterations * n,
        train_steps=host_train,
        wall_s=wall_total,
        episodes=len(returns),
        mean_return_last100=sum(returns[-100:]) / len(returns[-100:]) if returns else float("nan"),
        best_mean_return_last100=best if returns and best > -math.inf else None,
        solved_at_step=solved_at[0] if solved_at else None,
        solved_at_s=solved_at[1] if solved_at else None,
        phase_ms=last_phase,
        evaluation=evaluation,
        notes=notes,
    )
    runlog.write_json("summary.json", dataclasses.asdict(results))
    runlog.close()
    plot_run(runlog.metrics_path, runlog.folder / "plot.png", title=cfg.env)
    return results


def _progress(cfg: Config, total: int, initial: int):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, desc=f"gper train {cfg.env}")


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
