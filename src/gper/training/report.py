"""What a run reports: once an epoch, from the host copy of the device values, the episodes, the
100-episode windows (the best one, the solve point), the metrics and two log lines; after an
evaluation, its metrics and one line; at the end, the :class:`Results`.

The phase line has this format (DQN's, whose learn step has these phases; one line):

    GPU phase timing (178 batches avg): per_sample=0.02ms upload=0.01ms fwd_bwd=0.90ms adam=0.10ms
    per_update=0.01ms total=1.04ms | collect=0.050ms (40 collections avg)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gper.training.runlog import RunLog
from gper.training.settings import RunSettings

#: the charts the core reports itself (a learner's ``charts()`` adds others)
CORE_CHARTS = ("charts/SPS", "charts/train_steps_per_s", "charts/mean_return_last100")


@dataclass
class Results:
    """What a training run returns (:func:`gper.training.train`, :func:`gper.dqn.train`; also written
    to the run folder's ``summary.json``)."""

    run_dir: str
    device: str
    env_steps: int
    train_steps: int
    wall_s: float
    """wall seconds of training, over all the run's segments (a resumed run adds its own to the checkpoint's)"""
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
    """the environment's test at the run's end (:attr:`gper.envs.registry.EnvSpec.final_test`; market:
    greedy test P&L on held-out prices against buy-and-hold and flat), or None"""
    notes: list[str] = dataclasses.field(default_factory=list)
    eval_mean_return: float | None = None
    """the greedy policy's mean return at the last periodic evaluation (``eval_every``)"""
    eval_at_step: int | None = None
    """the env step of that evaluation"""
    best_eval_mean_return: float | None = None
    """the best mean return of the periodic evaluations"""
    eval_success_rate: float | None = None
    """a goal task (bitflip:<N>): the fraction of the last evaluation's episodes that reached their goal"""
    first_success_90_step: int | None = None
    """a goal task: the env step of the first evaluation whose success rate reached 0.9"""
    first_success_90_s: float | None = None
    """a goal task: the wall seconds from the start to that evaluation's end"""
    stopped: str | None = None
    """the signal that stopped the run (SIGINT, SIGTERM) before it was done (``env_steps``: where); None
    when it ran to its end"""
    population: dict[str, Any] | None = None
    """a population's (:mod:`~gper.training.population_report`): its aggregate and each agent's record;
    None for one agent (whose ``summary.json`` then has no such entry)"""


#: episodes in the window of the running mean (the reports' and the solve criterion's)
WINDOW = 100


def mean_last100(returns: list[float]) -> float:
    """The mean of the last 100 returns (fewer when there are fewer; NaN when there are none),
    summed as :func:`scan_windows` sums a window."""
    tail = returns[-WINDOW:]
    return float(np.sum(np.asarray(tail, dtype=np.float64))) / len(tail) if tail else float("nan")


def scan_windows(
    returns: list[float], steps: Sequence[int] | np.ndarray, goal: float | None
) -> tuple[float, int | None]:
    """Every 100-episode window of ``returns`` that ends in its newest ``len(steps)`` entries
    (``steps``: the env step at the end of each of those entries): the best window's mean (-inf
    when none ends there), and the env step of the first window at ``goal`` or above (None if none).

    The windows are summed by numpy, each on its own (its sum does not depend on which epoch
    scanned it), so a population's 10^5 episodes an epoch take a few array operations, not a
    Python sum a window."""
    first_new = len(returns) - len(steps)
    start = max(WINDOW, first_new + 1)  # the end (exclusive) of the first window to scan
    if start > len(returns):
        return -math.inf, None
    tail = np.asarray(returns[start - WINDOW :], dtype=np.float64)
    means = np.lib.stride_tricks.sliding_window_view(tail, WINDOW).sum(axis=1) / WINDOW
    solved = None
    if goal is not None:
        at_goal = np.flatnonzero(means >= goal)
        if at_goal.size:
            solved = int(steps[start + int(at_goal[0]) - 1 - first_new])
    seen = means[~np.isnan(means)]  # a NaN window (an environment's NaN return) counts for no best
    return (float(seen.max()) if seen.size else -math.inf), solved


class RunReport:
    """What one run reports: at each epoch's end (:meth:`end_epoch`) and at its end (:meth:`results`).

    Args:
        cfg: the run's settings.
        device: where the run trains (the phase line says GPU or CPU).
        runlog: the run folder the episodes and metrics go to.
        returns: the returns of the episodes finished so far (a resumed run's history); grows.
        log: receives the human-readable lines.
        sum_metrics: the metric each slot of the learner's device sums is reported as (the mean
            per training step; :attr:`~gper.training.algorithm.AlgorithmSpec.sum_metrics`).
        learn_phases: the learn step's phases in the phase line's order (:func:`format_phase_line`).
    """

    agents = 1
    """the agents whose env steps one collection iteration takes (``num_envs`` each)"""

    def __init__(
        self,
        cfg: RunSettings,
        device: torch.device,
        runlog: RunLog,
        returns: list[float],
        log: Callable[[str], object],
        sum_metrics: Mapping[int, str] | None = None,
        learn_phases: tuple[str, ...] = (),
    ) -> None:
        self.cfg, self.device, self.runlog, self.returns, self.log = cfg, device, runlog, returns, log
        self.sum_metrics, self.learn_phases = dict(sum_metrics or {}), learn_phases
        self.best = -math.inf
        self.solved_at: tuple[int, float] | None = None
        """(env step, wall seconds) of the first 100-episode window at ``solve_return``"""
        self.last_phase: dict[str, float] = {}
        """mean ms per phase of the last epoch that was timed"""
        self.last_eval: tuple[int, float] | None = None
        """(env step, mean return) of the last evaluation"""
        self.best_eval = -math.inf
        self.last_success: float | None = None
        """a goal task: the success rate of the last evaluation"""
        self.success_90: tuple[int, float] | None = None
        """a goal task: (env step, wall seconds) of the first evaluation at a success rate of 0.9 or more"""

    def start(self, t0: float, sums: torch.Tensor, train_steps: int) -> None:
        """The loop starts at ``t0`` (``time.perf_counter``) from the host copy of the device
        ``sums`` and ``train_steps`` training steps done: the first epoch's deltas start there, and
        its rates count from there whatever :meth:`load_state_dict` restores."""
        self.t0 = self._t_epoch = t0
        self._sums, self._train_steps = sums, train_steps
        # the training steps the epoch's rate counts from: a run resumed inside an epoch reports the
        # whole epoch's losses, but only the steps it took itself over its own wall time
        self._rate_train_steps = train_steps

    def state_dict(self) -> dict[str, object]:
        """What a resumed run needs to report as the uninterrupted run would: the best 100-episode
        window, the solve point, and the sums and training steps where the current epoch began."""
        return {
            "best": self.best,
            "solved_at": self.solved_at,
            "epoch_sums": self._sums,
            "epoch_train_steps": self._train_steps,
            **self._record_state(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict` (after :meth:`start`, whose epoch start it replaces)."""
        self.best = float(state["best"])
        solved = state["solved_at"]
        self.solved_at = None if solved is None else (int(solved[0]), float(solved[1]))
        self._sums = state["epoch_sums"].clone()
        self._train_steps = int(state["epoch_train_steps"])
        self._load_record_state(state)

    def _record_state(self) -> dict[str, object]:
        # the run's record beyond its windows: the wall time so far (the clock goes on from it)
        # and the evaluations
        return {
            "wall": time.perf_counter() - self.t0,
            "last_eval": self.last_eval,
            "best_eval": self.best_eval,
            "last_success": self.last_success,
            "success_90": self.success_90,
        }

    def _load_record_state(self, state: dict[str, object]) -> None:
        # checkpoints written before these entries existed lack them: their run starts the clock afresh
        self.t0 -= float(state.get("wall", 0.0))
        last = state.get("last_eval")
        self.last_eval = None if last is None else (int(last[0]), float(last[1]))
        self.best_eval = float(state.get("best_eval", -math.inf))
        self.last_success = state.get("last_success")
        s90 = state.get("success_90")
        self.success_90 = None if s90 is None else (int(s90[0]), float(s90[1]))

    def drain(self, tracker: Any, host: dict[str, torch.Tensor]) -> tuple[Any, int]:
        """The epoch's finished episodes from the host copy ``host`` of ``tracker``'s ring (an
        :class:`~gper.training.episodes.EpisodeTracker`), in the form :meth:`end_epoch` takes, and
        how many were lost."""
        return tracker.drain(host)

    def end_evaluation(self, env_step: int, metrics: dict[str, float], now: float) -> None:
        """Report the evaluation after the epoch that ended at ``env_step`` (its ``eval/`` metrics);
        ``now``: when it ended, from which the next epoch's rates count."""
        self._t_epoch = now  # the next epoch's rates leave the evaluation out
        mean = metrics["eval/mean_return"]
        self.last_eval, self.best_eval = (env_step, mean), max(self.best_eval, mean)
        self.runlog.log(env_step, **metrics)
        self.runlog.flush()
        success = metrics.get("eval/success_rate")
        said = ""
        if success is not None:
            self.last_success = success
            if success >= 0.9 and self.success_90 is None:
                self.success_90 = (env_step, now - self.t0)
            said = f"  success {success:.3f}"
        self.log(
            f"eval {env_step:>9d}  greedy return {mean:8.2f} ± {metrics['eval/std_return']:.2f}{said}  "
            f"({metrics['eval/episodes']} episodes, {metrics['eval/seconds']:.2f}s)"
        )

    def end_epoch(
        self,
        host: dict[str, torch.Tensor],
        episodes: list[tuple[float, int, int]],
        lost: int,
        *,
        env_step: int,
        iterations: int,
        train_steps: int,
        charts: dict[str, float],
        phases: dict[str, tuple[float, int]],
        now: float,
    ) -> dict[str, float]:
        """Report the epoch that ends at ``env_step`` after ``iterations`` collection iterations,
        with ``train_steps`` training steps done in all; return its metrics.

        ``host``: the readback of the device sums; ``episodes``, ``lost``: what
        :meth:`~gper.training.episodes.EpisodeTracker.drain` returned; ``charts``: the learner's own
        ``charts/`` metrics (:meth:`~gper.training.algorithm.Learner.charts`); ``phases``: the
        :meth:`~gper.training.timing.PhaseTimer.summary` of the epoch; ``now``: its end."""
        bad = [name for name in charts if not name.startswith("charts/") or name in CORE_CHARTS]
        if bad:
            raise ValueError(f"a learner's charts are its own charts/ names, not the core's: got {bad}")
        wall, self._t_epoch = now - self._t_epoch, now
        self._record_episodes(episodes, lost)
        self._windows(episodes, now)
        if phases:
            self.last_phase = {name: ms for name, (ms, _) in phases.items()}
        trained, self._train_steps = train_steps - self._train_steps, train_steps
        timed, self._rate_train_steps = train_steps - self._rate_train_steps, train_steps
        # trained: the epoch's training steps (its losses' mean); timed: those within its wall time
        metrics = {
            # a population's env steps: all its agents' (the env-step axis counts one agent's)
            "charts/SPS": iterations * self.cfg.num_envs * self.agents / wall,
            "charts/train_steps_per_s": timed / wall,
            **charts,
            **self._return_metrics(),
            **self._sum_metrics(host, trained),
            **{f"timing/{name}_ms": ms for name, (ms, _) in phases.items()},
        }
        self.runlog.log(env_step, **metrics)
        self.runlog.flush()
        busy = busy_fraction(phases, iterations, timed, wall, self.device.type == "cuda", self.learn_phases)
        self.log(format_phase_line(phases, self.device, self.learn_phases))
        self.log(
            f"step {env_step:>9d}  {self._return_said(metrics)}  env steps/s {metrics['charts/SPS']:9.0f}  "
            f"train steps/s {metrics['charts/train_steps_per_s']:8.0f}  "
            f"wall {now - self.t0:7.1f}s" + (f"  busy {busy:.0%}" if busy is not None else "")
        )
        return metrics

    def results(
        self,
        env_steps: int,
        train_steps: int,
        wall: float,
        evaluation: dict[str, float] | None,
        notes: list[str],
        stopped: str | None = None,
    ) -> Results:
        """The :class:`Results` of the run, ``wall`` seconds long (over all its segments);
        ``stopped``: the signal that stopped it early."""
        returns, best, solved, last_eval = self.returns, self.best, self.solved_at, self.last_eval
        return Results(
            run_dir=str(self.runlog.folder),
            device=str(self.device),
            env_steps=env_steps,
            train_steps=train_steps,
            wall_s=wall,
            episodes=len(returns),
            mean_return_last100=mean_last100(returns),
            best_mean_return_last100=best if returns and best > -math.inf else None,
            solved_at_step=solved[0] if solved else None,
            solved_at_s=solved[1] if solved else None,
            phase_ms=self.last_phase,
            evaluation=evaluation,
            notes=notes,
            eval_mean_return=last_eval[1] if last_eval else None,
            eval_at_step=last_eval[0] if last_eval else None,
            best_eval_mean_return=self.best_eval if last_eval else None,
            eval_success_rate=self.last_success,
            first_success_90_step=self.success_90[0] if self.success_90 else None,
            first_success_90_s=self.success_90[1] if self.success_90 else None,
            stopped=stopped,
        )

    def _record_episodes(self, episodes: list[tuple[float, int, int]], lost: int) -> None:
        if lost:
            self.log(f"gper train: {lost} finished episodes were not recorded (more than the ring holds in one epoch)")
        self.returns.extend(ret for ret, _, _ in episodes)
        names = ("charts/episodic_return", "charts/episodic_length")
        self.runlog.log_episodes((step, names[0], ret, names[1], length) for ret, length, step in episodes)

    def _windows(self, episodes: list[tuple[float, int, int]], now: float) -> None:
        """Every 100-episode window that ends in this epoch: the best one, and the first at solve_return."""
        best, solved = scan_windows(self.returns, [step for _, _, step in episodes], self.cfg.solve_return)
        self.best = max(self.best, best)
        if self.solved_at is None and solved is not None:
            self.solved_at = (solved, now - self.t0)

    def _return_metrics(self) -> dict[str, float]:
        """The epoch's return charts."""
        return {"charts/mean_return_last100": mean_last100(self.returns)}

    def _return_said(self, metrics: dict[str, float]) -> str:
        """The epoch line's returns and episodes."""
        return f"return(last100) {metrics['charts/mean_return_last100']:8.2f}  episodes {len(self.returns):6d}"

    def _sum_metrics(self, host: dict[str, torch.Tensor], trained: int) -> dict[str, float]:
        """The epoch's mean per training step of each device sum (none when it did not train)."""
        sums = host["sums"].clone()
        delta, self._sums = sums - self._sums, sums
        if not trained:
            return {}
        return {name: float(delta[slot] / trained) for slot, name in self.sum_metrics.items()}


def learn_phase_names(summary: dict[str, tuple[float, int]], order: tuple[str, ...] = ()) -> list[str]:
    """The learn step's phases among ``summary``'s: those of ``order`` in its order, or, with no
    ``order``, every phase but ``collect`` in the summary's order."""
    if order:
        return [name for name in order if name in summary]
    return [name for name in summary if name != "collect"]


def busy_fraction(
    phases: dict[str, tuple[float, int]],
    collects: int,
    trains: int,
    wall: float,
    cuda: bool,
    learn_phases: tuple[str, ...] = (),
) -> float | None:
    """Mean GPU phase times times step counts over the epoch's wall time: how busy the GPU was."""
    if "collect" not in phases or wall <= 0 or not cuda:
        return None
    learn = sum(phases[name][0] for name in learn_phase_names(phases, learn_phases))
    return (phases["collect"][0] * collects + learn * trains) / 1e3 / wall


def format_phase_line(
    summary: dict[str, tuple[float, int]], device: torch.device, learn_phases: tuple[str, ...] = ()
) -> str:
    """The phase line (see the module docstring): the learn step's mean phase times (in the order
    of ``learn_phases``, see :func:`learn_phase_names`), then the data-collection phase
    (``collect``) on its own."""
    kind = "GPU" if torch.device(device).type == "cuda" else "CPU"
    learn = learn_phase_names(summary, learn_phases)
    parts = []
    if learn:
        n = max(summary[name][1] for name in learn)
        fields = " ".join(f"{name}={summary[name][0]:.2f}ms" for name in learn)
        total = sum(summary[name][0] for name in learn)
        parts.append(f"{kind} phase timing ({n} batches avg): {fields} total={total:.2f}ms")
    elif "collect" in summary:
        parts.append(f"{kind} phase timing: no training steps yet (learning starts later)")
    if "collect" in summary:
        ms, n = summary["collect"]
        parts.append(f"collect={ms:.3f}ms ({n} collections avg)")
    return " | ".join(parts) if parts else f"{kind} phase timing: no steps timed"
