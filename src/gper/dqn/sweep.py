"""A population as a grid of settings: ``--sweep NAME=V1,V2,...`` and each agent's settings.

A population of ``population`` seeds over a sweep of settings has one agent per (grid point,
seed): the grid is the product of the sweeps' values, in the order the sweeps are given (the first
varies slowest), and each grid point gets ``population`` agents. Agent ``i`` (counting grid point
by grid point) has the seed ``seed + i`` and its grid point's settings, so it trains as the single
run ``gper train --seed <seed + i> --<name> <value> ...`` does.

:class:`PerAgent` holds the settings the agents may hold apart as the steps read them, and
:func:`check_shared` refuses agents that differ in anything else.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import torch

from gper.dqn.config import Config

#: the settings a sweep may vary: each agent runs with its own value, in the same launches
SWEEPABLE = {
    "learning_rate": float,
    "gamma": float,
    "alpha": float,
    "beta": float,
    "tau": float,
    "eps_start": float,
    "eps_end": float,
    "exploration_fraction": float,
}


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One setting's values: ``name`` (one of :data:`SWEEPABLE`) and its ``values``."""

    name: str
    values: tuple[float, ...]

    @staticmethod
    def parse(text: str) -> Sweep:
        """``NAME=V1,V2,...`` (e.g. ``learning_rate=1e-3,3e-4``), or a ValueError saying what is wrong."""
        name, sep, values = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ValueError(f"--sweep takes NAME=V1,V2,... (e.g. learning_rate=1e-3,3e-4), got {text!r}")
        if name not in SWEEPABLE:
            raise ValueError(
                f"--sweep: {name!r} cannot be swept; the settings a sweep may vary: {', '.join(SWEEPABLE)}"
            )
        try:
            parsed = tuple(SWEEPABLE[name](v) for v in values.split(","))
        except ValueError:
            raise ValueError(f"--sweep {name}: the values must be numbers, got {values!r}") from None
        if len(set(parsed)) != len(parsed):
            raise ValueError(f"--sweep {name}: a value is given twice in {values!r}")
        return Sweep(name, parsed)


def parse_sweeps(texts: Sequence[str]) -> list[Sweep]:
    """Every ``--sweep``; a setting swept twice is refused."""
    sweeps = [Sweep.parse(t) for t in texts]
    names = [s.name for s in sweeps]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--sweep: {', '.join(twice)} swept more than once (give all its values in one --sweep)")
    return sweeps


def agent_configs(cfg: Config, population: int, sweeps: Sequence[Sweep] = ()) -> list[Config]:
    """Each agent's settings: the grid of ``sweeps`` times ``population`` seeds, agent ``i`` with
    seed ``cfg.seed + i`` (see the module docstring). Each is checked as its single run's would be."""
    if isinstance(population, bool) or not isinstance(population, int) or population < 1:
        raise ValueError(f"population must be an int >= 1, got {population!r}")
    grid = list(itertools.product(*(s.values for s in sweeps))) or [()]
    out = []
    for point in grid:
        changes = {s.name: v for s, v in zip(sweeps, point, strict=True)}
        for _ in range(population):
            out.append(dataclasses.replace(cfg, seed=cfg.seed + len(out), **changes))
    return out


def label(cfg: Config, sweeps: Sequence[Sweep]) -> str:
    """An agent's grid point as text (``learning_rate=0.001 gamma=0.99``), or "" without sweeps."""
    return " ".join(f"{s.name}={getattr(cfg, s.name):g}" for s in sweeps)


@dataclasses.dataclass(frozen=True)
class PerAgent:
    """The settings the agents may hold apart, as the steps use them: each a float where every
    agent has the same value (the single agent's arithmetic exactly), else one per agent."""

    gamma: float | torch.Tensor
    """the discount: a float, or [N, 1] float32"""
    tau: float | list[float]
    """the soft target update's rate"""
    eps_start: torch.Tensor
    """[N] float64 exploration rate at the start"""
    eps_span: torch.Tensor
    """[N] float64 eps_end - eps_start"""
    decay: torch.Tensor
    """[N] float64 env steps of the decay: exploration_fraction * total_steps"""

    @staticmethod
    def of(cfgs: Sequence[Config], device: torch.device) -> PerAgent:
        def f64(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float64, device=device)

        gammas = [c.gamma for c in cfgs]
        taus = [c.tau for c in cfgs]
        return PerAgent(
            gamma=gammas[0] if len(set(gammas)) == 1 else torch.tensor(gammas, device=device).view(-1, 1),
            tau=taus[0] if len(set(taus)) == 1 else taus,
            eps_start=f64([c.eps_start for c in cfgs]),
            eps_span=f64([c.eps_end - c.eps_start for c in cfgs]),
            decay=f64([c.exploration_fraction * c.total_steps for c in cfgs]),
        )


def check_shared(cfgs: Sequence[Config]) -> None:
    """Agents' settings that may differ are the sweepable ones and the seed; any other difference
    is refused (the agents share one architecture, one replay layout and one schedule)."""
    first = dataclasses.asdict(cfgs[0])
    for cfg in cfgs[1:]:
        theirs = dataclasses.asdict(cfg)
        differ = sorted(k for k in first if k not in SWEEPABLE and k != "seed" and first[k] != theirs[k])
        if differ:
            raise ValueError(f"the agents of a population may differ in {', '.join(SWEEPABLE)} only, not in {differ}")
    if len({cfg.tau >= 1.0 for cfg in cfgs}) > 1:
        # one schedule of target updates for all: hard copies every target_every steps, or soft ones
        raise ValueError(
            "a population's tau values must all be 1 (hard target updates) or all below 1 (soft ones), got "
            f"{sorted({cfg.tau for cfg in cfgs})}"
        )
