"""The settings the trainer core reads, whatever the algorithm: :class:`RunSettings` names them,
:class:`RunConfig` is a dataclass of them to extend with an algorithm's own.

An algorithm's settings are a dataclass with at least these attributes (``gper.dqn.Config`` has them
among its own; a small algorithm subclasses :class:`RunConfig`). Resolved settings hold no ``None``
where the core reads a number. What a resumed run may change of them: :data:`RUN_HONOURED` and
:data:`RUN_FREE`, plus the algorithm's own (:class:`~gper.training.algorithm.AlgorithmSpec`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol


class RunSettings(Protocol):
    """The settings the trainer core reads, by concern; :class:`RunConfig` says what each is."""

    env: str
    num_envs: int
    seed: int
    device: str
    distributed: str
    total_steps: int
    learning_starts: int
    train_every: int
    epoch_steps: int
    eval_every: int
    eval_episodes: int
    solve_return: float | None
    run_dir: str
    run_name: str | None
    resume: str | None
    save: bool
    checkpoint_every: int
    keep_checkpoints: int
    progress: bool
    tensorboard: bool
    time_every: int
    graph_iterations: int


@dataclasses.dataclass
class RunConfig:
    """:class:`RunSettings` as a dataclass with defaults, for an algorithm's settings to extend:

    @dataclasses.dataclass
    class MyConfig(RunConfig):
        learning_rate: float = 0.1
    """

    # what it trains on, and where
    env: str = "cartpole"
    """the environment's registered name (:func:`gper.envs.make_env`)"""
    num_envs: int = 8
    """environments stepped together: one collection iteration steps each once"""
    seed: int = 1
    """seeds torch's generators and the environments (an algorithm's setup does)"""
    device: str = "cpu"
    """where the algorithm's setup builds the learner"""
    distributed: str = "off"
    """``auto``, ``off``, ``exact`` or ``local`` (:mod:`gper.training.parallel`)"""
    # the schedule
    total_steps: int = 10_000
    """env steps of the whole run"""
    learning_starts: int = 1_000
    """env steps before the first training step"""
    train_every: int = 1
    """collection iterations between training steps"""
    epoch_steps: int = 2_000
    """env steps an epoch: the one device synchronisation, the report, the checkpoint point"""
    # the evaluations
    eval_every: int = 0
    """epochs between evaluations of the greedy policy, and after the last (0: none)"""
    eval_episodes: int = 10
    """episodes an evaluation plays"""
    solve_return: float | None = None
    """the 100-episode mean return that counts as solved (reported when reached), or None"""
    # the record and the checkpoints
    run_dir: str = "runs"
    """the folder of run folders"""
    run_name: str | None = None
    """the run folder's name; default ``<env>__s<seed>__<time>``, a resumed run's its checkpoint's"""
    resume: str | None = None
    """a run folder or checkpoint directory to continue from"""
    save: bool = True
    """write checkpoints"""
    checkpoint_every: int = 1
    """epochs between checkpoints (0: only at the end and on a stop signal)"""
    keep_checkpoints: int = 2
    """the newest this many checkpoints are kept"""
    progress: bool = False
    """a progress bar (tqdm)"""
    tensorboard: bool = False
    """TensorBoard event files beside ``metrics.jsonl``"""
    time_every: int = 0
    """every this many collection iterations runs phase by phase with timing (0: never)"""
    graph_iterations: int = 1
    """collection iterations (with their training steps) replayed as one CUDA graph
    (:mod:`gper.training.iteration_graphs`); 1: each iteration its own replays"""


#: settings a resumed run takes from its own configuration: it trains on up to ``total_steps``
RUN_HONOURED = ("total_steps",)
#: where the run computes and what it writes and shows: free to change on resume
RUN_FREE = (
    "device",
    "time_every",
    "graph_iterations",
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


def check_run_settings(cfg: Any) -> None:
    """Refuse run settings the core cannot run with (``cfg`` resolved), before anything is built.

    Raises:
        ValueError: one line naming the setting and what it must be.
    """
    positive = ("total_steps", "num_envs", "train_every", "epoch_steps", "eval_episodes", "keep_checkpoints")
    for name in (*positive, "graph_iterations"):
        value = getattr(cfg, name)
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for name in ("learning_starts", "time_every", "checkpoint_every", "eval_every"):
        value = getattr(cfg, name)
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    k, timed = cfg.graph_iterations, cfg.time_every
    if _is_int(k) and k > 1 and _is_int(timed) and 0 < timed <= k:
        # every window of k iterations would hold a timed one, which runs alone: no block would run
        raise ValueError(f"graph_iterations {k} needs time_every 0 or above {k}, got time_every {timed}")
    if not is_seed(cfg.seed):
        raise ValueError(f"seed must be an integer from 0 to 2**63 - 1, got {cfg.seed!r}")
    if cfg.solve_return is not None and not math.isfinite(cfg.solve_return):
        raise ValueError(f"solve_return must be a finite number, got {cfg.solve_return}")


def missing_run_settings(settings: type) -> list[str]:
    """The :class:`RunSettings` names that the dataclass ``settings`` has no field for."""
    names = {f.name for f in dataclasses.fields(settings)}
    return [name for name in RunSettings.__annotations__ if name not in names]


def is_seed(value: object) -> bool:
    """Whether ``value`` is a seed torch takes: an integer from 0 to 2^63 - 1."""
    return _is_int(value) and 0 <= value < 2**63


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
