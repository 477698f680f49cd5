"""The Q-network and the replay rows it learns from (flat: transitions; trajectory: steps)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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

    def fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The same function as :meth:`forward`, each hidden layer one ``torch._addmm_activation``
        (on CUDA, cuBLASLt's bias + ReLU epilogue: the [B, hidden] activations are written once,
        not written, read and written again by a separate ReLU). Differentiable (see
        :class:`LinearReLU`); not for autocast, whose lists do not hold ``_addmm_activation``."""
        layers = list(self.net)
        for layer, following in zip(layers, layers[1:] + [None], strict=True):
            if not isinstance(layer, nn.Linear):
                continue
            if isinstance(following, nn.ReLU):
                x = linear_relu(x, layer.weight, layer.bias)
            else:
                x = F.linear(x, layer.weight, layer.bias)
        return x


class LinearReLU(torch.autograd.Function):
    """``relu(x @ weight.T + bias)`` in one GEMM (``torch._addmm_activation``, which autograd does
    not differentiate), with the backward autograd gives ``relu(linear(...))``: the ReLU's
    mask from the saved output, then the two GEMMs and the bias sum."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = torch._addmm_activation(bias, x, weight.t())
        ctx.save_for_backward(x, weight, h)
        return h

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, h = ctx.saved_tensors
        dz = torch.ops.aten.threshold_backward(grad, h, 0)
        dx = dz @ weight if ctx.needs_input_grad[0] else None
        dw = dz.t() @ x if ctx.needs_input_grad[1] else None
        db = dz.sum(0) if ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``relu(F.linear(x, weight, bias))`` for [B, in] ``x`` as one GEMM with a ReLU epilogue;
    through :class:`LinearReLU` only where autograd needs the graph."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad):
        return LinearReLU.apply(x, weight, bias)
    return torch._addmm_activation(bias, x, weight.t())


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


#: the trajectory replay's observation fields for a goal task (each stored once, relabelled by hindsight replay)
GOAL_OBS_KEYS = ("obs", "achieved_goal", "desired_goal")


def goal_trajectory_spec(obs_dim: int, goal_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The fields of one step of a goal task in the trajectory replay: ``obs`` the observation
    without its desired goal (``obs_dim - goal_dim`` floats), the achieved and desired goals
    (``goal_dim`` floats each), the action and the reward. The network reads ``obs`` and
    ``desired_goal`` side by side, as the environment's observation holds them."""
    return {
        "obs": ((obs_dim - goal_dim,), torch.float32),
        "achieved_goal": ((goal_dim,), torch.float32),
        "desired_goal": ((goal_dim,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),
    }
