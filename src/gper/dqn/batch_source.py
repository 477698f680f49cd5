"""Where the learn step's batch comes from: a :class:`BatchSource` returns a :class:`Batch`.

The agent's default source draws from its replay (:meth:`gper.dqn.Agent.sample_replay`); a
benchmark or a test can hand it a :class:`FixedBatch` instead (``batch_source=lambda: batch``); an
agent that only learns (:meth:`gper.dqn.Agent.for_learning`) stands on :class:`LearningOnly`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

import torch

from gper.envs import Step, VecEnv


class Batch(Protocol):
    """What the learn step reads of a batch: the fields of :func:`gper.dqn.replay_spec` by name, and the IS
    ``weights`` [B]. A :class:`gper.SampledBatch` is one, a :class:`FixedBatch` another."""

    weights: torch.Tensor

    def __getitem__(self, name: str, /) -> torch.Tensor: ...


#: a function of no arguments returning the next learn step's batch
BatchSource = Callable[[], Batch]


class FixedBatch(Mapping[str, torch.Tensor]):
    """Given tensors read as a :class:`gper.SampledBatch` is read: fields by name, and ``weights``
    (all 1 unless given). ``Agent(..., batch_source=lambda: batch)`` learns from it every step."""

    def __init__(self, fields: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> None:
        self._fields = dict(fields)
        first = next(iter(self._fields.values()))
        self.weights = torch.ones(first.shape[0], device=first.device) if weights is None else weights

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


class LearningOnly(VecEnv):
    """The environment of an agent that only learns (:meth:`gper.dqn.Agent.for_learning`): the network's
    sizes and one zero observation; stepping it is an error."""

    name = "none"

    def __init__(self, obs_dim: int, n_actions: int, device: torch.device) -> None:
        self.obs_dim, self.n_actions, self.num_envs, self.device = obs_dim, n_actions, 1, device

    def reset(self, seed: int | None = None) -> torch.Tensor:
        return torch.zeros(1, self.obs_dim, device=self.device)

    def step(self, actions: torch.Tensor) -> Step:
        raise RuntimeError("this agent only learns (Agent.for_learning): it has no environment to collect from")
