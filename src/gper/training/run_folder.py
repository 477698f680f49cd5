"""The run folder a training run writes: which folder, what a resume continues there, and the
record's files (``config.json``, ``metrics.jsonl``, TensorBoard event files) it starts with.

Checkpoints, ``summary.json`` and ``plot.png`` are written into it later (:mod:`gper.training.trainer`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch

import gper
from gper.training.checkpoints import list_checkpoints, remove_temporaries, step_of
from gper.training.extras import install
from gper.training.run_checkpoint import CHECKPOINTS, Checkpoint
from gper.training.runlog import METRICS, RunLog
from gper.training.settings import RunSettings


def open_run_folder(
    cfg: RunSettings, device: torch.device, resume: Checkpoint | None, log: Any, settings: dict[str, Any]
) -> RunLog:
    """The run's folder: ``<run_dir>/<run_name>`` (default ``<env>__s<seed>__<time>``), or, for a
    resumed run without ``run_name``, its checkpoint's.

    Continued in place, ``metrics.jsonl`` is cut back to what it held at the checkpoint and the
    directories of checkpoint writes that never finished are deleted; any other run's folder must
    hold no checkpoints. A run resumed in another folder starts its ``metrics.jsonl`` with what its
    checkpoint's run folder held at the checkpoint, so each folder holds a whole run's record. With
    ``tensorboard``, the record goes to TensorBoard event files too (one line instead when the
    package is missing). ``config.json`` gets ``settings`` (those in force on ``device``:
    :attr:`~gper.training.algorithm.AlgorithmSpec.record`), the device and gper's version.

    Raises:
        ValueError: a new run's folder holds the checkpoints of another run.
    """
    if resume is not None and resume.run_folder is not None and cfg.run_name is None:
        folder = resume.run_folder
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_name = cfg.run_name or f"{cfg.env.replace(':', '_').replace('/', '_')}__s{cfg.seed}__{stamp}"
        folder = Path(cfg.run_dir) / run_name
    continues = resume is not None and resume.run_folder is not None and _same(folder, resume.run_folder)
    if continues:
        for path in remove_temporaries(folder / CHECKPOINTS):
            log(f"gper train: removed {path}, a checkpoint whose writing never finished")
        # later checkpoints go before metrics.jsonl is cut back to this one: a crash in between
        # must not leave a newest checkpoint whose metrics were cut away
        for path in list_checkpoints(folder / CHECKPOINTS):
            if step_of(path) > step_of(resume.path) and not _same(path, resume.path):
                shutil.rmtree(path)
                log(f"gper train: removed {path}, a checkpoint past the one this run resumes from")
    elif list_checkpoints(folder / CHECKPOINTS):
        raise ValueError(f"{folder} holds the checkpoints of another run: resume it, or give another run_name")
    history = None if resume is None or resume.run_folder is None else resume.run_folder / METRICS
    if continues:
        runlog = RunLog(folder, metrics_bytes=resume.state["metrics_bytes"])
    elif history is not None and history.is_file():
        runlog = RunLog(folder, metrics_bytes=resume.state["metrics_bytes"], history=history)
    else:
        runlog = RunLog(folder)
    if resume is not None:
        log(f"gper train: resumed from {resume.path} at env step {resume.iteration * cfg.num_envs}")
    settings = {**settings, "device": str(device), "gper": gper.__version__}
    runlog.write_json("config.json", settings)
    if cfg.tensorboard:
        # CleanRL's table of the settings, under TensorBoard's Text tab
        table = "|setting|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in settings.items())
        try:
            runlog.open_events({"hyperparameters": table})
        except ImportError:
            hint = f"{install('tensorboard')}, or --tensorboard False"
            log(f"gper train: no TensorBoard event files: they need tensorboard: {hint}")
    return runlog


def _same(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.samefile(b)
