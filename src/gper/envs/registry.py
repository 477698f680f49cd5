"""The environments :func:`make_env` knows, one :class:`EnvSpec` each, in the order they were registered.

A registration says everything the rest of gper needs of an environment: its name (``cartpole``)
or name pattern (``bitflip:<N>``: a family and a placeholder for the argument after the colon), the
factory that makes it, the trainer's presets per device type, the line ``gper train --help`` shows
for it, and what a trainer passes the factory (its settings, its autoreset modes, whether it is a
goal task). ``make_env``, the list of names, the trainer's presets (:data:`PRESETS`,
``gper.dqn.PRESETS``), ``gper train --help`` and the error messages read the registry, so a new
environment is one module plus one :func:`register` call (``CONTRIBUTING.md``, *How to add an
environment*).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gper.envs.base import AUTORESET_MODES, Autoreset, VecEnv, check_num_envs

#: the trainer's settings that ``None`` stands for, per preset family, then per device type (``"cuda"``:
#: the values; ``"cpu"``: what a CPU run changes of them); kept up to date by :func:`register`
PRESETS: dict[str, Mapping[str, Mapping[str, Any]]] = {}

_SPECS: dict[str, EnvSpec] = {}  # by family, in the order registered


@dataclass(frozen=True)
class EnvSpec:
    """One environment's registration (see the module docstring)."""

    name: str
    """``cartpole``, or a pattern ``bitflip:<N>`` that names every ``bitflip:...``."""
    factory: Callable[..., VecEnv]
    """``factory(num_envs, device, seed=seed, **kwargs)``; for a pattern
    ``factory(arg, num_envs, device, seed=seed, **kwargs)``, ``arg`` the text after the colon."""
    presets: Mapping[str, Mapping[str, Any]]
    """The trainer's settings that ``None`` stands for: ``{"cuda": {...}, "cpu": {...}}``, the CPU's
    entries replacing CUDA's (plain values: this layer knows no trainer)."""
    help: str = ""
    """What ``--env``'s help says of it, in parentheses after the name; empty: the name alone."""
    goal: bool = False
    """A goal task (:class:`~gper.envs.goals.GoalEnv`): hindsight relabelling applies, on the trajectory replay."""
    autoreset: tuple[Autoreset, ...] = ("same-step",)
    """Its autoreset modes, the default first; with more than one the factory takes ``autoreset``."""
    graph_safe_rng: bool = True
    """The factory takes ``graph_safe_rng`` (draw from torch's default generator, see :mod:`gper.envs._rng`)."""
    data: bool = False
    """The factory reads a data file, the trainer's ``data`` setting."""
    settings: Callable[[Any, str], dict[str, Any]] | None = None
    """The factory's keyword arguments from a run's settings (an object with the trainer's setting
    names as attributes) and its data split (``"train"`` or ``"test"``)."""
    own_defaults: Mapping[str, str] = field(default_factory=dict)
    """Trainer settings whose default the environment gives itself, each with what it is."""
    walk_forward_presets: Mapping[str, Mapping[str, Any]] | None = None
    """Presets for walk-forward training (folds of a few thousand bars), family ``<family>-walk``."""
    eval_split: str = "train"
    """The data split a trainer's periodic evaluations play (market: ``"test"``, the held-out prices)."""
    final_test: Callable[[Callable[[torch.Tensor], torch.Tensor], VecEnv], dict[str, float]] | None = None
    """A test a trainer runs at a run's end: ``final_test(policy, env)`` on one copy of the ``"test"``
    split -> its scores (market: one walk over the held-out prices); None: none."""
    describe_final_test: Callable[[dict[str, float], Any], str] | None = None
    """The log line of :attr:`final_test`'s scores, from them and the run's settings."""
    published: Callable[[str], Sequence[tuple[str, float, float]]] | None = None
    """Published scores to draw beside a run's curve, from the environment's name (``atari:Pong``):
    ``(label, low, high)`` each, a line where ``low == high``, else a band; None: none."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*(:<[A-Za-z]+>)?", self.name):
            raise ValueError(f"an environment's name is lowercase, or a pattern such as bitflip:<N>; got {self.name!r}")
        if not self.autoreset or self.autoreset[0] != "same-step" or not set(self.autoreset) <= set(AUTORESET_MODES):
            raise ValueError(f"autoreset modes start with same-step, then next-step if any; got {self.autoreset!r}")

    @property
    def family(self) -> str:
        """The name, or the pattern's part before the colon: the key of its presets."""
        return self.name.partition(":")[0]

    @property
    def pattern(self) -> bool:
        """Whether :attr:`name` is a pattern (``bitflip:<N>``)."""
        return ":" in self.name

    def run_kwargs(self, run: Any, split: str, own_rng: bool) -> dict[str, Any]:
        """The factory's keyword arguments for a training run's settings ``run``: :attr:`settings`'
        for ``split``, ``graph_safe_rng`` where it takes it and the environment draws from no
        generator of its own (``own_rng``), and ``run.gym_autoreset`` where it has two autoreset modes."""
        kwargs = dict(self.settings(run, split)) if self.settings is not None else {}
        if self.graph_safe_rng and not own_rng:
            kwargs["graph_safe_rng"] = True
        if len(self.autoreset) > 1:
            kwargs["autoreset"] = run.gym_autoreset
        return kwargs


class UnknownEnvironment(ValueError):
    """A name no registration matches (a pattern's factory raises it for an argument it rejects as a name)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown environment {name!r}: expected one of {', '.join(env_names())}")


def register(spec: EnvSpec) -> EnvSpec:
    """Make ``spec``'s environment known to :func:`make_env`, the trainer and its help; returns ``spec``.

    Raises:
        ValueError: an environment of the same family is registered already.
    """
    if spec.family in _SPECS or spec.family in PRESETS:
        raise ValueError(f"an environment {spec.family!r} is registered already")
    _SPECS[spec.family] = spec
    PRESETS[spec.family] = spec.presets
    if spec.walk_forward_presets is not None:
        PRESETS[f"{spec.family}-walk"] = spec.walk_forward_presets
    return spec


def unregister(name: str) -> None:
    """Forget the environment registered as ``name`` (a plain name or a pattern) and its presets.

    Raises:
        KeyError: none is registered as ``name``.
    """
    spec = _SPECS.pop(name.partition(":")[0])
    PRESETS.pop(spec.family)
    PRESETS.pop(f"{spec.family}-walk", None)


def specs() -> tuple[EnvSpec, ...]:
    """Every registration, in the order registered."""
    return tuple(_SPECS.values())


def env_names() -> tuple[str, ...]:
    """The registered names and patterns; built in: ``("cartpole", "market", "bitflip:<N>", "gym:<ID>",
    "atari:<Game>")``."""
    return tuple(spec.name for spec in _SPECS.values())


def lookup(name: str) -> EnvSpec | None:
    """The registration ``name`` belongs to: a plain name's own, or the pattern whose family comes
    before its colon; None for none."""
    family, colon, _ = name.partition(":")
    spec = _SPECS.get(family)
    return spec if spec is not None and spec.pattern == bool(colon) else None


def published(name: str) -> tuple[tuple[str, float, float], ...]:
    """The published scores of the environment ``name`` (:attr:`EnvSpec.published`); () for none or
    an unknown name."""
    spec = lookup(name)
    return tuple(spec.published(name)) if spec is not None and spec.published is not None else ()


def preset(family: str, device_type: str) -> dict[str, Any] | None:
    """The preset values of ``family`` (:data:`PRESETS`) on a device of ``device_type``; None for no such family."""
    if family not in PRESETS:
        return None
    values = dict(PRESETS[family]["cuda"])
    if device_type != "cuda":
        values.update(PRESETS[family]["cpu"])
    return values


def make_env(
    name: str,
    num_envs: int,
    device: torch.device | str,
    seed: int = 0,
    autoreset: Autoreset | None = None,
    **kwargs: Any,
) -> VecEnv:
    """Make ``num_envs`` copies of the registered environment ``name`` on ``device``.

    ``autoreset`` (:attr:`VecEnv.autoreset`): ``None`` for the environment's own, ``"same-step"``
    or ``"next-step"`` (where its registration lists it). ``kwargs`` go to the environment's factory.

    Raises:
        ValueError: a bad ``num_envs`` or ``autoreset``; :class:`UnknownEnvironment` for a name no
            registration matches.
    """
    check_num_envs(num_envs)
    if autoreset is not None and autoreset not in AUTORESET_MODES:
        raise ValueError(f"autoreset must be one of {', '.join(AUTORESET_MODES)}, got {autoreset!r}")
    spec = lookup(name)
    if autoreset is not None and autoreset not in (spec.autoreset if spec is not None else ("same-step",)):
        both = ", ".join(s.name for s in _SPECS.values() if len(s.autoreset) > 1)
        raise ValueError(f"{name} resets in the same step only: next-step autoreset is for {both} environments")
    device = torch.device(device)
    if spec is None:
        raise UnknownEnvironment(name)
    if len(spec.autoreset) > 1:
        kwargs["autoreset"] = autoreset or spec.autoreset[0]
    if spec.pattern:
        return spec.factory(name.partition(":")[2], num_envs, device, seed=seed, **kwargs)
    return spec.factory(num_envs, device, seed=seed, **kwargs)
