"""What every environment of :mod:`gper.envs` provides: a batch of ``num_envs`` copies stepped together.

Observations, actions, rewards and flags are tensors on the environment's device. An environment
whose :attr:`VecEnv.graph_safe` is true does only device work of fixed shapes in :meth:`VecEnv.step`
(no host synchronisation, no Python branching on tensor values) and updates its state tensors in
place, so a step can be captured once in a CUDA graph and replayed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal, NamedTuple

import torch

#: how an environment resets a copy whose episode ended (Gymnasium's two autoreset modes)
Autoreset = Literal["same-step", "next-step"]
AUTORESET_MODES: tuple[str, ...] = ("same-step", "next-step")


def canonical_device(device: torch.device | str) -> torch.device:
    """``device`` with the index filled in (``cuda`` -> ``cuda:<current>``), so it compares equal to
    the device of the tensors made on it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_num_envs(num_envs: object) -> int:
    """``num_envs``, or a ValueError unless it is an int >= 1 (a bool is not)."""
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    return num_envs


class Step(NamedTuple):
    """The result of :meth:`VecEnv.step`, every tensor ``[num_envs, ...]`` on the env's device."""

    next_obs: torch.Tensor
    """float32 ``[N, obs_dim]``: the observation the action led to (where an episode ended, its last one)."""
    reward: torch.Tensor
    """float32 ``[N]``."""
    terminated: torch.Tensor
    """bool ``[N]``: the episode reached a terminal state (no bootstrapping from ``next_obs``)."""
    truncated: torch.Tensor
    """bool ``[N]``: the episode was cut by a time limit (``next_obs`` may be bootstrapped from)."""
    obs: torch.Tensor
    """float32 ``[N, obs_dim]``: what the agent acts on next. Equal to ``next_obs`` except where an
    episode ended in a ``same-step`` environment, where it has reset and this is the new episode's
    first observation. A ``next-step`` environment returns the final observation here too, and
    resets on the step after (see :attr:`VecEnv.autoreset`)."""


class VecEnv(ABC):
    """``num_envs`` environments stepped together, resetting each one automatically when it ends."""

    name: str
    num_envs: int
    obs_dim: int
    n_actions: int
    device: torch.device
    graph_safe: bool = False
    """True when :meth:`step` can be captured in a CUDA graph (see the module docstring)."""
    reward_threshold: float | None = None
    """The return at which the task counts as solved, where it has one (Gymnasium's ``reward_threshold``)."""
    autoreset: Autoreset = "same-step"
    """How a copy whose episode ended is reset. ``same-step``: in the step that ended it (``obs`` is
    the new episode's first observation, ``next_obs`` the final one). ``next-step`` (Gymnasium's
    default): the step after is a *reset step* that belongs to no episode: its action is ignored,
    its reward is 0, its flags are false, its ``obs`` before it is the final observation and its
    ``next_obs`` the new episode's first. A replay that stores transitions as they come must not
    learn from reset steps (:class:`gper.TrajectoryReplayBuffer` recognises them by itself)."""

    @abstractmethod
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every episode afresh; return the first observations, float32 ``[N, obs_dim]``."""

    @abstractmethod
    def step(self, actions: torch.Tensor) -> Step:
        """Apply ``actions`` (int64 ``[N]`` in ``[0, n_actions)``, on the env's device) to every copy."""

    def check_actions(self, actions: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``actions`` is int64 ``[num_envs]`` on the env's device (on the
        host: the values are not read, that would sync)."""
        if actions.shape != (self.num_envs,) or actions.dtype != torch.int64 or actions.device != self.device:
            raise ValueError(
                f"actions must be int64 [{self.num_envs}] on {self.device}, "
                f"got {actions.dtype} {list(actions.shape)} on {actions.device}"
            )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue the episodes in flight (empty: start afresh on resume)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional: nothing to restore)
        """Restore :meth:`state_dict` in place."""

    def close(self) -> None:  # noqa: B027 (optional: most envs hold nothing)
        """Release what the environment holds (worker processes, files)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, num_envs={self.num_envs}, device={self.device})"
