"""What an algorithm gives the trainer core: a :class:`Learner` (the object that collects and
learns) and an :class:`AlgorithmSpec` (how to build one, and what its settings and reports are).

The core (:func:`gper.training.train`) owns everything else: the run's lifecycle, the schedule
and its epochs (:mod:`~gper.training.epochs`), checkpoints and resume
(:mod:`~gper.training.run_checkpoint`), the run folder (:mod:`~gper.training.run_folder`), the
report (:mod:`~gper.training.report`), the evaluations (:mod:`~gper.training.evaluation`) and the
data-parallel plumbing (:mod:`~gper.training.parallel`). DQN (``gper.dqn.DQN``) is one algorithm
on it; ``tests/training/test_second_algorithm.py`` trains another, a linear Q-learner, through it.
``CONTRIBUTING.md``, *How to add an algorithm*, says how to write one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gper.training.episodes import EpisodeTracker
from gper.training.settings import missing_run_settings
from gper.training.timing import PhaseTimer


class Learner(Protocol):
    """The built algorithm the trainer core drives: environments, replay, networks and its steps.

    Everything it computes stays on its device between epochs: the core reads :attr:`sums` and
    :meth:`device_values` once an epoch, together with the episodes (one synchronisation).
    """

    device: torch.device
    rb: Any
    """its replay buffer: ``save(path)``, ``load(path)`` and ``stats()`` (the checkpoint's
    ``replay.safetensors``; a sharded one's ``save`` returns the group's part, its ``load`` takes it)"""
    episodes: EpisodeTracker
    """the training episodes' returns and lengths, recorded on the device (a population's, with an
    int attribute ``agents`` = N > 1: ``EpisodeTracker(num_envs * N, device, agents=N)``, see
    :mod:`~gper.training.population_report`)"""
    sums: torch.Tensor
    """running sums over training steps (float64), reported per training step under the names of
    :attr:`AlgorithmSpec.sum_metrics` (a population's: ``[N, n_sums]``, a row per agent)"""

    def collect_step(self, timer: PhaseTimer | None) -> None:
        """One collection iteration: every environment stepped once, into the replay (timed
        phase by phase into ``timer`` when given)."""

    def learn_step(self, train_step: int, timer: PhaseTimer | None) -> None:
        """Training step ``train_step`` (counted from 1) and whatever follows it (a target update)."""

    def device_values(self) -> dict[str, torch.Tensor]:
        """Device values read back once an epoch besides :attr:`sums` and the episodes (may be empty)."""

    def after_sync(self) -> None:
        """Host upkeep at the epoch's synchronisation (for example re-sorting ranks); may do nothing."""

    def charts(self, host: dict[str, torch.Tensor], env_step: int) -> dict[str, float]:
        """The epoch's ``charts/`` metrics of its own (exploration rate, beta, ...) from the host
        copy ``host`` of :meth:`device_values`, at ``env_step``."""

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions of the policy being learned, without exploration (evaluation)."""

    def state_dict(self, *, replay: bool) -> dict[str, Any]:
        """Everything but the replay (``replay=False``: the checkpoint writes the replay apart)."""

    def load_state_dict(self, state: dict[str, Any], *, replay: bool) -> None:
        """Restore :meth:`state_dict` in place."""

    def honour_settings(self) -> None:
        """After a checkpoint was loaded: apply this run's :attr:`AlgorithmSpec.honoured` settings
        (a new learning rate)."""


def missing_members(learner: object) -> list[str]:
    """The attributes and methods of :class:`Learner` that ``learner`` lacks (a method: not callable)."""
    methods = [n for n, v in vars(Learner).items() if callable(v) and not n.startswith("_")]
    missing = [name for name in Learner.__annotations__ if not hasattr(learner, name)]
    return missing + [name for name in methods if not callable(getattr(learner, name, None))]


def _no_upgrade(settings: dict[str, Any]) -> dict[str, Any]:
    return settings


def _record(cfg: Any, device: torch.device, threads: int | None) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


@dataclass(frozen=True)
class AlgorithmSpec:
    """How the trainer core builds and runs an algorithm (see the module docstring)."""

    name: str
    """recorded in its checkpoints: a checkpoint resumes only with the algorithm that wrote it"""
    settings: type
    """the dataclass of its settings, with the attributes of :class:`~gper.training.settings.RunSettings`"""
    setup: Callable[[Any, Callable[[str], object], Any], tuple[Any, Learner, list[str]]]
    """``setup(settings, log, launch)`` -> (resolved settings, learner, notes it logged);
    ``launch``: the data-parallel run's :class:`~gper.training.parallel.Launch`, or None"""
    sum_metrics: Mapping[int, str] = dataclasses.field(default_factory=dict)
    """the metric each slot of :attr:`Learner.sums` is reported as (its mean per training step)"""
    learn_phases: tuple[str, ...] = ()
    """the learn step's phases in the order the phase line prints them"""
    honoured: tuple[str, ...] = ()
    """its settings a resumed run takes from its own configuration (beside ``total_steps``)"""
    free: tuple[str, ...] = ()
    """its settings free to change on resume (where it computes), beside the core's"""
    cpu_threads: Callable[[Any, Learner], int] | None = None
    """torch threads for a CPU run of these settings and this learner; None: torch's default"""
    record: Callable[[Any, torch.device, int | None], dict[str, Any]] = _record
    """``config.json``'s settings: as they take effect on the device, with ``threads`` torch threads"""
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] = _no_upgrade
    """a checkpoint's stored settings in today's form (settings added since, sections moved)"""
    from_settings: Callable[[dict[str, Any]], Any] | None = None
    """the settings object of a dict of them; None: ``settings(**d)``"""
    data_parallel: bool = False
    """whether its setup builds one rank of a data-parallel run under torchrun (its replay sharded,
    its gradients averaged over the group); False: the core refuses ``distributed`` exact or local"""

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.settings):
            raise TypeError(f"{self.name}: settings must be a dataclass, got {self.settings!r}")
        missing = missing_run_settings(self.settings)
        if missing:
            raise TypeError(
                f"{self.name}: its settings {self.settings.__name__} lack the run settings {', '.join(missing)} "
                "(subclass gper.training.RunConfig)"
            )

    def settings_of(self, values: dict[str, Any]) -> Any:
        """The settings object of ``values``."""
        return self.settings(**values) if self.from_settings is None else self.from_settings(values)
