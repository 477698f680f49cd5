"""The settings the trainer core reads, whatever the algorithm: :class:`RunSettings` names them,
:class:`RunConfig` is a dataclass of them to extend with an algorithm's own.

An algorithm's settings are a dataclass with at least these attributes (``gper.dqn.Config`` has them
among its own; a small algorithm subclasses :class:`RunConfig`). Resolved settings hold no ``None``
where the core reads a number. What a resumed run may change of them: :data:`RUN_HONOURED` and
:data:`RUN_FREE`, plus the algorithm's own (:class:`~gper.training.algorithm.AlgorithmSpec`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


class RunSettings(Protocol):
    """The settings the trainer core reads (see the module docstring), by concern."""

    # what it trains on, and where
    env: str
    """the environment's registered name (:func:`gper.envs.make_env`)"""
    num_envs: int
    """environments stepped together: one collection iteration steps each once"""
    seed: int
    device: str
    distributed: str
    """``auto``, ``off``, ``exact`` or ``local`` (:mod:`gper.training.parallel`)"""
    # the schedule
    total_steps: int
    """env steps of the whole run"""
    learning_starts: int
    """env steps before the first training step"""
    train_every: int
    """collection iterations between training steps"""
    epoch_steps: int
    """env steps an epoch: the one device synchronisation, report and checkpoint point"""
    # the evaluations
    eval_every: int
    """epochs between evaluations of the greedy policy (0: none)"""
    eval_episodes: int
    solve_return: float | None
    # the record and the checkpoints
    run_dir: str
    run_name: str | None
    resume: str | None
    save: bool
    checkpoint_every: int
    """epochs between checkpoints (0: only at the end and on a stop signal)"""
    keep_checkpoints: int
    progress: bool
    tensorboard: bool
    time_every: int
    """every this many collection iterations runs phase by phase with timing (0: never)"""


@dataclasses.dataclass
class RunConfig:
    """:class:`RunSettings` as a dataclass with defaults, for an algorithm's settings to extend:

        @dataclasses.dataclass
        class MyConfig(RunConfig):
            learning_rate: float = 0.1
    """

    env: str = "cartpole"
    num_envs: int = 8
    seed: int = 1
    device: str = "cpu"
    distributed: str = "off"
    total_steps: int = 10_000
    learning_starts: int = 1_000
    train_every: int = 1
    epoch_steps: int = 2_000
    eval_every: int = 0
    eval_episodes: int = 10
    solve_return: float | None = None
    run_dir: str = "runs"
    run_name: str | None = None
    resume: str | None = None
    save: bool = True
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    progress: bool = False
    tensorboard: bool = False
    time_every: int = 0


#: settings a resumed run takes from its own configuration: it trains on up to ``total_steps``
RUN_HONOURED = ("total_steps",)
#: where the run computes and what it writes and shows: free to change on resume
RUN_FREE = (
    "device",
    "threads",
    "time_every",
    "epoch_steps",
    "run_dir",
    "run_name",
    "save",
    "checkpoint_every",
    "keep_checkpoints",
    "resume",
    "progress",
    "solve_return",
    "eval_every",
    "eval_episodes",
    "tensorboard",
)
