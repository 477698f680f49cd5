"""The trainer core: everything a reinforcement-learning trainer needs but its algorithm.

:func:`train` runs an algorithm (an :class:`AlgorithmSpec`, which builds a :class:`Learner`;
:mod:`~gper.training.algorithm` says what each holds) from settings with the attributes of
:class:`RunSettings` (:class:`RunConfig` to extend). DQN (``gper.dqn.DQN``) is one algorithm on it.

What the core holds, in reading order: the run's lifecycle (:mod:`~gper.training.trainer`), the
schedule and its epochs (:mod:`~gper.training.epochs`), checkpoints and resume
(:mod:`~gper.training.run_checkpoint`, on the crash-safe directories of
:mod:`~gper.training.checkpoints`), the run folder (:mod:`~gper.training.run_folder`) and its
record (:mod:`~gper.training.runlog`, :mod:`~gper.training.tensorboard`,
:mod:`~gper.training.plot`), the report (:mod:`~gper.training.report`), the environments
(:mod:`~gper.training.environment`) and evaluations (:mod:`~gper.training.evaluation`),
data-parallel plumbing (:mod:`~gper.training.parallel`), and the pieces a learner is built from:
a step of named phases run eagerly or as CUDA graphs (:mod:`~gper.training.phases`) with
per-phase timing (:mod:`~gper.training.timing`), finished episodes recorded on the device
(:mod:`~gper.training.episodes`), asynchronous copies to the host (:mod:`~gper.training.readback`)
and SIGINT/SIGTERM as requests to stop (:mod:`~gper.training.signals`).
"""

from gper.training.algorithm import AlgorithmSpec, Learner
from gper.training.report import Results
from gper.training.settings import RunConfig, RunSettings
from gper.training.trainer import train

__all__ = ["AlgorithmSpec", "Learner", "Results", "RunConfig", "RunSettings", "train"]
