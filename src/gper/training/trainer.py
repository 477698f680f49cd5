"""The run's lifecycle, for any algorithm (:class:`~gper.training.algorithm.AlgorithmSpec`):
:func:`train` resumes or starts, opens the run folder, runs the epochs, checkpoints, evaluates,
writes the record, and stops cleanly on a signal."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from gper.envs import registry
from gper.training import iteration_graphs, parallel, run_checkpoint
from gper.training.algorithm import AlgorithmSpec, Learner, missing_members
from gper.training.epochs import EpochLoop, collect_iterations
from gper.training.evaluation import Evaluator, final_test
from gper.training.extras import INSTALL, require
from gper.training.parallel import Launch
from gper.training.plot import plot_run
from gper.training.population_report import PopulationReport, population_of
from gper.training.precision import matmul_precision
from gper.training.report import Results, RunReport
from gper.training.run_checkpoint import Checkpoint
from gper.training.run_folder import open_run_folder
from gper.training.runlog import RunLog
from gper.training.settings import check_run_settings, is_seed
from gper.training.signals import StopSignals


def train(spec: AlgorithmSpec, config: Any, log: Any = print) -> Results:
    """Train the algorithm ``spec`` as ``config`` (its settings) says; write the run folder; return
    the :class:`Results`.

    ``log`` receives the human-readable lines (the progress bar's ``write`` in the command).

    With ``save``, checkpoints go to the run folder's ``checkpoints/`` (:mod:`~gper.training.run_checkpoint`)
    every ``checkpoint_every`` epochs and at the end. While it trains, SIGINT or SIGTERM makes it
    finish the collection iteration in progress, write a checkpoint (with ``save``), then
    ``summary.json`` (``stopped``: the signal) and ``plot.png`` of the run so far, and raise
    ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM). With ``resume``, it continues
    from a checkpoint, and continues its record (``metrics.jsonl``, TensorBoard, the report).

    Under torchrun (``distributed`` exact or local, :mod:`~gper.training.parallel`) it is one rank of
    a data-parallel run: it joins the process group, trains its part, and leaves the group at the end
    (on an error too); rank 0 writes the run folder, logs and evaluates, the other ranks are quiet.

    Raises:
        ValueError: bad settings, settings a resume may not change, or a damaged checkpoint
            (:class:`~gper.training.checkpoints.CheckpointError`); each a one-line message.
    """
    # an algorithm that does not train data-parallel: exact or local asked for, or auto under torchrun
    resolvable = config.distributed in ("auto", "off") or spec.data_parallel
    mode = parallel.resolve_mode(config.distributed) if resolvable else None
    if mode != "off" and not spec.data_parallel:
        raise ValueError(f"{spec.name} does not train data-parallel: run one process (distributed off)")
    config = dataclasses.replace(config, distributed=mode)
    launch = parallel.start(mode, config.device)
    finished = False
    try:
        if launch is not None and not launch.main:  # quiet: rank 0 speaks for the group
            config = dataclasses.replace(config, progress=False)
            log = _quiet
        with matmul_precision(getattr(config, "precision", None)):
            results = _train_process(spec, config, log, launch)
        finished = True
        return results
    finally:
        parallel.stop(launch, finished)


def _quiet(line: str) -> None:
    pass


def _train_process(spec: AlgorithmSpec, config: Any, log: Any, launch: Launch | None) -> Results:
    # the bar's package is checked first, before anything is built
    tqdm = require("tqdm.auto", "the progress bar", "or progress=False").tqdm if config.progress else None
    resume = None
    if config.resume and launch is None:
        resume = run_checkpoint.read(config.resume, 0, 1)
    elif config.resume:
        resume = launch.agree(
            lambda: run_checkpoint.read(config.resume, launch.rank, launch.world_size), "reading the checkpoint"
        )
    if is_seed(config.seed):  # a bad one: the algorithm's setup (or check_run_settings) says so in one line
        torch.manual_seed(config.seed + (0 if launch is None else launch.rank))  # an algorithm may seed again
    cfg, learner, notes = (
        spec.setup(config, log, launch)
        if launch is None
        else launch.agree(lambda: spec.setup(config, log, launch), "setting up the run")
    )
    check_run_settings(cfg)
    missing = missing_members(learner)
    if missing:
        raise TypeError(f"{spec.name}: its learner {type(learner).__name__} lacks {', '.join(missing)}")
    population_of(learner, cfg.num_envs)  # a population that breaks the contract: refused before the folder is made
    if cfg.graph_iterations > 1 and (reason := iteration_graphs.unsupported(learner)) is not None:
        raise ValueError(f"graph_iterations {cfg.graph_iterations}: {reason}")
    before = torch.get_num_threads()
    threads = None
    if learner.device.type == "cpu" and spec.cpu_threads is not None:  # put back when the run ends
        threads = spec.cpu_threads(cfg, learner)
        torch.set_num_threads(threads)
    try:
        return _Run(spec, cfg, learner, notes, log, launch).train(resume, tqdm, threads)
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass
class _Run:
    """One process's run, set up: what its stages share."""

    spec: AlgorithmSpec
    cfg: Any
    learner: Learner
    notes: list[str]
    log: Any
    launch: Launch | None

    @property
    def main(self) -> bool:
        return self.launch is None or self.launch.main

    def train(self, resume: Checkpoint | None, tqdm: Any, threads: int | None) -> Results:
        cfg, learner, launch = self.cfg, self.learner, self.launch
        if resume is not None:
            run_checkpoint.check_settings(self.spec, cfg, resume)  # the same settings and checkpoint on every rank
            run_checkpoint.restore(learner, resume, launch)
        runlog = self._open_folder(resume, threads)
        evaluator = None
        try:
            if cfg.eval_every > 0 and self.main:
                evaluator = Evaluator(cfg, learner.device, getattr(learner, "agents", 1))
            returns = [] if resume is None else [float(r) for r in resume.state["returns"]]
            spec = self.spec
            args = (cfg, learner.device, runlog, returns, self.log, spec.sum_metrics, spec.learn_phases)
            agents = population_of(learner, cfg.num_envs)  # N agents: each reported, and all in aggregate
            report = RunReport(*args) if agents == 1 else PopulationReport(*args, agents=agents)
            return self._epochs(report, resume, evaluator, tqdm)
        finally:
            if evaluator is not None:
                evaluator.close()
            runlog.close()

    def _open_folder(self, resume: Checkpoint | None, threads: int | None) -> RunLog:
        cfg, device, launch = self.cfg, self.learner.device, self.launch
        settings = self.spec.record(cfg, device, threads)
        if launch is None:
            return open_run_folder(cfg, device, resume, self.log, settings)
        # rank 0 names the folder (a time stamp) and writes it; the others checkpoint into it
        made = launch.agree(
            lambda: open_run_folder(cfg, device, resume, self.log, settings) if self.main else None,
            "opening the run folder",
        )
        folder = launch.broadcast(str(made.folder) if self.main else None)
        return made if self.main else parallel.QuietRunLog(folder)

    def _epochs(self, report: RunReport, resume: Checkpoint | None, evaluator: Evaluator | None, tqdm: Any) -> Results:
        cfg, learner, launch, runlog = self.cfg, self.learner, self.launch, report.runlog
        start_it = 0 if resume is None else resume.iteration
        iterations = collect_iterations(cfg)
        report_state = None if resume is None else resume.state["report"]
        with StopSignals() as signals:
            stop = signals if launch is None else parallel.GroupStop(signals, launch)
            loop = EpochLoop(self.spec, cfg, learner, report, stop, evaluator, launch, tqdm)
            run = loop.run(start_it, iterations, report_state)
            # the end of the run: checkpoint, the environment's final test (a signal stops it too), summary, plot
            path = run.checkpoint
            if cfg.save and run.iteration == iterations:
                path = run_checkpoint.save(self.spec, learner, iterations, report, launch)
            tested = not stop.requested and self.main
            evaluation = final_test(cfg, learner.greedy, learner.device, self.log, stop) if tested else None
            if stop.requested:  # the record of the run so far, then the signal's exception
                env_steps = run.iteration * cfg.num_envs
                results = report.results(env_steps, run.train_steps, run.wall, None, self.notes, stop.name)
                if self.main:
                    self._write_record(results, runlog, stopped=True)
                self._say_stopped(stop, path, env_steps, runlog)
                raise stop.exception()
        results = report.results(iterations * cfg.num_envs, run.train_steps, run.wall, evaluation, self.notes)
        if self.main:
            self._write_record(results, runlog)
        return results

    def _say_stopped(self, stop: StopSignals, path: Path | None, env_steps: int, runlog: RunLog) -> None:
        """The line a stopped run ends with: where its checkpoint is and how to go on."""
        if path is None:
            self.log(f"gper train: {stop.name}: stopped at env step {env_steps} (save is off: no checkpoint)")
        else:
            self.log(f"gper train: {stop.name}: stopped after writing {path}; continue with --resume {runlog.folder}")

    def _write_record(self, results: Results, runlog: RunLog, stopped: bool = False) -> None:
        """``summary.json`` and ``plot.png`` (one line instead when matplotlib is missing)."""
        cfg = self.cfg
        summary = dataclasses.asdict(results)
        if summary["population"] is None:  # one agent's summary.json as it has always been
            del summary["population"]
        runlog.write_json("summary.json", summary)
        runlog.flush()
        title = cfg.env + (f" (stopped at env step {results.env_steps:,})" if stopped else "")
        plot = plot_run(
            runlog.metrics_path, runlog.folder / "plot.png", title, cfg.solve_return, registry.published(cfg.env)
        )
        if plot is None:
            self.log(f"gper train: no plot.png: the plot needs matplotlib: {INSTALL}")
