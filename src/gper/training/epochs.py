"""The run's schedule and its epochs: which collection iterations train, and the loop over them.

:func:`plan_steps` and its parts say, from the settings alone, how many collection iterations a
run has and after which ones a training step follows (the host knows both without asking the
GPU). :class:`EpochLoop` runs iterations in epochs of ``epoch_steps`` env steps: one
synchronisation with the device at each epoch's end (:func:`sync_epoch`), the epoch's report,
the periodic evaluation, checkpoints, and stop signals.

An epoch's report is host work (a population can finish 10^5 episodes an epoch), and at the
synchronisation the GPU has nothing left to run. So where nothing else is due at an epoch's end
(no evaluation, no checkpoint, no stop, not the run's last epoch, not a data-parallel run), the
loop first launches about :data:`REPORT_LOOKAHEAD` iterations of the next epoch, then writes the
report while the GPU runs them. The lookahead pauses at the end of a block (``graph_iterations``)
or an iteration, at least one block short of the next epoch's end, so the epoch goes on in the
blocks it runs without a pause. Everything the report reads was read back before it
(:class:`ClosedEpoch`), so the record is the same. A stop signal during the lookahead is seen
after the report: a checkpoint of that point, then the report of the next epoch so far. On the
CPU the host runs those iterations itself, so the lookahead gains nothing there (the same code runs,
and an epoch's line appears after them).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gper.training import evaluation, run_checkpoint
from gper.training.algorithm import AlgorithmSpec, Learner
from gper.training.evaluation import Evaluator
from gper.training.iteration_graphs import IterationGraphs
from gper.training.parallel import Launch
from gper.training.readback import AsyncReadback
from gper.training.report import RunReport
from gper.training.settings import RunSettings
from gper.training.signals import StopSignals
from gper.training.timing import PhaseTimer

#: collection iterations of the next epoch launched before an epoch's report (see the module
#: docstring): about 0.24 s of GPU work at 256 agents of PureJaxRL's settings, what a report of 10^5
#: episodes takes on a GPU machine's host. Where the launch queue fills first, the host waits
#: there for room and reports once the rest is queued
REPORT_LOOKAHEAD = 1024


def trains_at(cfg: RunSettings, iteration: int) -> bool:
    """Whether collection iteration ``iteration`` (0-based) is followed by a training step."""
    start = math.ceil(cfg.learning_starts / cfg.num_envs)
    return iteration >= start and (iteration - start) % cfg.train_every == 0


def collect_iterations(cfg: RunSettings) -> int:
    """Collection iterations of a run (each steps every environment once)."""
    return math.ceil(cfg.total_steps / cfg.num_envs)


def train_steps_before(cfg: RunSettings, iteration: int) -> int:
    """Training steps done before collection iteration ``iteration`` (0-based)."""
    return sum(trains_at(cfg, it) for it in range(iteration))


def plan_steps(cfg: RunSettings) -> tuple[int, int]:
    """(collection iterations, training steps) of a run: the host knows both without asking the GPU."""
    iterations = collect_iterations(cfg)
    return iterations, train_steps_before(cfg, iterations)


def step_iteration(cfg: RunSettings, learner: Learner, it: int, timer: PhaseTimer | None, train_steps: int) -> bool:
    """Collection iteration ``it``, and the training step after it when one is due (with what
    follows it, such as a target update); every ``time_every``-th iteration phase by phase into
    ``timer``. Returns whether it trained."""
    timed = timer if timer is not None and cfg.time_every > 0 and it % cfg.time_every == 0 else None
    learner.collect_step(timed)
    if not trains_at(cfg, it):
        return False
    learner.learn_step(train_steps + 1, timed)
    return True


def sync_epoch(learner: Learner, readback: AsyncReadback) -> tuple[dict[str, torch.Tensor], float]:
    """The epoch's end, its only synchronisation with the device: the host copy of the sums, the
    learner's device values and the episode ring, and the time it arrived; then the learner's
    host upkeep (:meth:`~gper.training.algorithm.Learner.after_sync`)."""
    readback.start()
    host = readback.wait()
    now = time.perf_counter()
    learner.after_sync()
    return host, now


class ClosedEpoch(NamedTuple):
    """What an epoch's report needs, read at its end before the next iterations run."""

    first: int
    """its first collection iteration"""
    end: int
    """the iteration it ended before"""
    train_steps: int
    """training steps done at its end"""
    host: dict[str, torch.Tensor]
    """the readback (sums, the learner's device values, the episode ring): the readback's own pinned
    buffers, not copies, so they hold until its next ``start()``: report before that"""
    now: float
    """when the readback arrived"""
    episodes: Any
    """the episodes drained from the ring, in the form the report takes"""
    lost: int
    """episodes the ring lost"""
    charts: dict[str, float]
    """the learner's charts"""
    phases: dict[str, tuple[float, int]]
    """the phase timer's summary of the epoch"""


class Reached(NamedTuple):
    """Where :meth:`EpochLoop.run` stopped."""

    iteration: int
    """collection iterations done"""
    train_steps: int
    wall: float
    """wall seconds of the run so far (all its segments)"""
    checkpoint: Path | None
    """the checkpoint a stop signal made it write, if any"""


@dataclass
class EpochLoop:
    """Collection iterations in epochs of ``cfg.epoch_steps`` env steps, with a progress bar when
    ``tqdm`` (the class) is given, and evaluations of the greedy policy after the epochs
    :func:`gper.training.evaluation.due` names.

    Epochs end at multiples of ``epoch_steps`` counted from the run's start, so a run resumed from
    any iteration ends its epochs (and re-sorts ranks, and evaluates) where the uninterrupted run
    does. With ``save``, checkpoints are written every ``checkpoint_every`` epochs (after the
    epoch's evaluation). A stop signal ends the loop after the iteration in progress: inside an
    epoch, with a checkpoint of that point (with ``save``) and then a report of the epoch so far
    (which a resumed run cuts away from ``metrics.jsonl``, to report the whole epoch); at an
    epoch's end, after its evaluation, with a checkpoint. In a data-parallel run (``launch``) the
    ranks agree on a stop at each epoch's end (:class:`~gper.training.parallel.GroupStop`), so a signal
    stops it there, never inside an epoch.

    Where nothing else is due at an epoch's end, the next epoch's first iterations are launched
    before its report (see the module docstring); a stop signal among them is seen after the
    report, as one inside the next epoch.
    """

    spec: AlgorithmSpec
    """the algorithm (its checkpoints record its name)"""
    cfg: RunSettings
    """the run's resolved settings"""
    learner: Learner
    """what collects and learns (the algorithm's, built by its setup)"""
    report: RunReport
    """the run's report, and through it the run folder (``report.runlog``)"""
    stop: StopSignals
    """the stop signals (a data-parallel run's :class:`~gper.training.parallel.GroupStop`)"""
    evaluator: Evaluator | None = None
    """the periodic evaluation, or None"""
    launch: Launch | None = None
    """this rank's place in a data-parallel run, or None"""
    tqdm: Any = None
    """the progress bar's class, or None for no bar"""
    # the run's own, set by run()
    timer: PhaseTimer = field(init=False)
    """the phase timer of the timed iterations"""
    readback: AsyncReadback = field(init=False)
    """the epoch's one copy to the host: the sums, the learner's device values, the episode ring"""
    bar: Any = field(init=False, default=None)
    """the progress bar, when there is one"""
    train_steps: int = field(init=False, default=0)
    """training steps done (from the run's start)"""
    path: Path | None = field(init=False, default=None)
    """the last checkpoint this loop wrote"""
    blocks: IterationGraphs | None = field(init=False, default=None)
    """blocks of ``graph_iterations`` iterations as one graph, or None (one iteration at a time)"""

    def run(self, start_it: int, iterations: int, report_state: dict[str, Any] | None) -> Reached:
        """Iterations ``start_it`` to ``iterations``; ``report_state``: the report of a resumed run."""
        cfg, learner, report = self.cfg, self.learner, self.report
        epoch_its = max(1, cfg.epoch_steps // cfg.num_envs)
        self.timer = PhaseTimer(learner.device)
        own, ring = learner.device_values(), learner.episodes.snapshot()
        if "sums" in own or own.keys() & ring.keys():
            raise ValueError(f"a learner's device values may not be named sums or {', '.join(ring)}: got {list(own)}")
        self.blocks = IterationGraphs(learner, cfg.graph_iterations) if cfg.graph_iterations > 1 else None
        values = {"sums": learner.sums, **own, **ring}
        self.readback = AsyncReadback(values)
        self.bar = None
        if self.tqdm is not None:
            n = cfg.num_envs
            desc = f"gper train {cfg.env}"
            self.bar = self.tqdm(total=iterations * n, initial=start_it * n, unit="step", dynamic_ncols=True, desc=desc)
        t0 = time.perf_counter()
        self.train_steps = train_steps_before(cfg, start_it)
        # a copy: on the CPU .cpu() would return the live tensor, and the first epoch would read 0 losses
        report.start(t0, learner.sums.to("cpu", copy=True), self.train_steps)
        if report_state is not None:
            report.load_state_dict(report_state)
        it, self.path = start_it, None
        try:
            first = it
            while it < iterations:
                end, inside = self._iterations(it, min((it // epoch_its + 1) * epoch_its, iterations))
                if inside:  # a consistent point: the episodes not reported yet are in the checkpoint's ring
                    self.path = self._save(end)
                epoch = -(-end // epoch_its)  # epochs from 1
                closed = self._close_epoch(first, end)
                # the next epoch's first iterations run on the GPU while the host reports this one
                ahead, cut = (end, False) if inside else self._look_ahead(end, epoch, iterations, epoch_its)
                self._report_epoch(closed)
                first, it = end, ahead
                if cut:  # a stop signal in the lookahead: as one inside the next epoch, after this report
                    self.path = self._save(ahead)
                    self._report_epoch(self._close_epoch(end, ahead))
                    break
                if inside or (ahead == end and self._after_epoch(end, epoch, iterations)):
                    break
        finally:
            if self.bar is not None:
                self.bar.close()
        return Reached(it, self.train_steps, time.perf_counter() - report.t0, self.path)

    def _iterations(self, it: int, end: int, pause: int | None = None) -> tuple[int, bool]:
        """Iterations ``it`` to ``end``, in blocks of ``graph_iterations`` where they fit (see
        :mod:`~gper.training.iteration_graphs`); (where they stopped, whether a stop signal cut them
        short: the caller checkpoints that point). With ``pause``, they stop at the first block's or
        iteration's end at or past it: the rest, run later to ``end``, falls into the same blocks."""
        cfg, n, i = self.cfg, self.cfg.num_envs, it
        while i < end:
            done = self._block(i, end)
            if not done:
                if step_iteration(cfg, self.learner, i, self.timer, self.train_steps):
                    self.train_steps += 1
                done = 1
            i += done
            if self.bar is not None and i * n - self.bar.n >= 64 * n:
                self.bar.update(i * n - self.bar.n)
            if self.stop.requested and i < end:
                return i, True
            if pause is not None and i >= pause:
                return i, False
        return end, False

    def _block(self, i: int, end: int) -> int:
        """Iterations ``i`` onwards as one block when one may run there: its size, else 0."""
        blocks, cfg = self.blocks, self.cfg
        if blocks is None or i + blocks.k > end or not blocks.ready():
            return 0
        if cfg.time_every > 0 and any((i + j) % cfg.time_every == 0 for j in range(blocks.k)):
            return 0  # a timed iteration runs alone, phase by phase
        trains = [trains_at(cfg, i + j) for j in range(blocks.k)]
        if not blocks.run(trains, self.train_steps):
            return 0
        self.train_steps += sum(trains)
        return blocks.k

    def _close_epoch(self, first: int, end: int) -> ClosedEpoch:
        """The end of the epoch from ``first`` to ``end``: the readback, the drained episodes, the
        learner's charts and the phase times, all read before any later iteration is launched."""
        learner, n = self.learner, self.cfg.num_envs
        host, now = sync_epoch(learner, self.readback)
        if self.launch is not None:
            self.stop.agree()  # every rank stops after the same epoch
        episodes, lost = self.report.drain(learner.episodes, host)  # a population's: per agent
        charts, phases = learner.charts(host, end * n), self.timer.summary()
        return ClosedEpoch(first, end, self.train_steps, host, now, episodes, lost, charts, phases)

    def _look_ahead(self, end: int, epoch: int, iterations: int, epoch_its: int) -> tuple[int, bool]:
        """Launch the next epoch's first iterations when nothing else is due after epoch ``epoch``
        (it ended before iteration ``end``): about :data:`REPORT_LOOKAHEAD`, and at least one left to
        the epoch. Returns where they stopped (``end``: none ran) and whether a stop signal cut them short."""
        cfg = self.cfg
        due_eval = self.evaluator is not None and evaluation.due(cfg, epoch, last=False)
        due_checkpoint = cfg.checkpoint_every > 0 and epoch % cfg.checkpoint_every == 0
        if end >= iterations or self.launch is not None or self.stop.requested or due_eval or due_checkpoint:
            return end, False
        # paused short of the epoch's end by a block, so at least one iteration is left to it (which
        # sees a stop signal), in the blocks the epoch would have run without the pause
        epoch_end = min((end // epoch_its + 1) * epoch_its, iterations)
        pause = min(end + REPORT_LOOKAHEAD, epoch_end - (self.blocks.k if self.blocks is not None else 1))
        return self._iterations(end, epoch_end, pause) if pause > end else (end, False)

    def _report_epoch(self, closed: ClosedEpoch) -> None:
        """The epoch ``closed``: reported, shown on the bar."""
        n = self.cfg.num_envs
        metrics = self.report.end_epoch(
            closed.host,
            closed.episodes,
            closed.lost,
            env_step=closed.end * n,
            iterations=closed.end - closed.first,
            train_steps=closed.train_steps,
            charts=closed.charts,
            phases=closed.phases,
            now=closed.now,
        )
        if self.bar is not None:
            self.bar.update(max(0, closed.end * n - self.bar.n))  # the lookahead may have moved it on
            self.bar.set_postfix(ret=f"{metrics['charts/mean_return_last100']:.1f}", sps=f"{metrics['charts/SPS']:.0f}")

    def _after_epoch(self, it: int, epoch: int, iterations: int) -> bool:
        """Epoch ``epoch``'s evaluation and checkpoint; whether a stop signal ends the run here."""
        cfg = self.cfg
        if self.evaluator is not None and evaluation.due(cfg, epoch, last=it == iterations):
            self.report.end_evaluation(it * cfg.num_envs, self.evaluator.run(self.learner.greedy), time.perf_counter())
        due = cfg.checkpoint_every > 0 and epoch % cfg.checkpoint_every == 0
        if it < iterations and (due or self.stop.requested):
            self.path = self._save(it)
            return self.stop.requested
        return False

    def _save(self, iteration: int) -> Path | None:
        """A checkpoint after ``iteration`` with ``save``, else None."""
        if not self.cfg.save:
            return None
        return run_checkpoint.save(self.spec, self.learner, iteration, self.report, self.launch)
