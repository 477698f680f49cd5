"""The Q-network and the replay rows it learns from (flat: transitions; trajectory: steps)."""

from __future__ import annotations

import torch
from torch import nn


class QNetwork(nn.Module):
    """An MLP from observations to one Q-value per action, ReLU between layers."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]  # in place: one pass less over memory
            width = h
        layers.append(nn.Linear(width, n_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def padded_width(obs_dim: int) -> int:
    """Observation width the agent stores and learns from: ``obs_dim`` rounded up to 4 floats.

    The extra inputs are always 0, so the network computes the same function class, but every row
    of the replay then starts ``obs`` and ``next_obs`` 16-byte aligned: a sampled batch feeds the
    first layer as a strided view, without a copy, and cuBLAS takes its aligned kernels (the
    measurement is in docs/performance.md)."""
    return -(-obs_dim // 4) * 4


def replay_spec(obs_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The fields of one transition in the flat replay buffer (``obs_dim``: the padded width)."""
    return {
        "obs": ((obs_dim,), torch.float32),
        "next_obs": ((obs_dim,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),
        "done": ((), torch.float32),
    }


def trajectory_spec(obs_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The fields of one step in the trajectory replay buffer (``obs_dim``: the padded width): each
    observation is stored once; ``next_obs``, the episode flags and the n-step discount are
    assembled when a batch is drawn."""
    return {
        "obs": ((obs_dim,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),
    }
