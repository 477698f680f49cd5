"""What the learning phases pass each other: :class:`LearnState`. A population
(:mod:`gper.dqn.population_agent`) keeps the same one, each tensor with the agents along dim 0
(``[N, B, ...]``; ``discount`` unused: flat replay only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gper.dqn.batch_source import Batch


@dataclass
class LearnState:
    """What the learning phases pass each other; each field says which phase writes it.

    A phase-by-phase CUDA graph capture keeps these tensors alive (see
    :class:`~gper.training.phases.PhasedStep`): the later phases' graphs read their addresses."""

    batch: Batch | None = None
    """per_sample: the batch of this step"""
    x: torch.Tensor | None = None
    """upload: observations [B, obs_width]"""
    next_x: torch.Tensor | None = None
    """upload: next observations [B, obs_width]"""
    action: torch.Tensor | None = None
    """upload: int64 actions [B]"""
    reward: torch.Tensor | None = None
    """upload: rewards [B] (from the trajectory replay, n-step discounted sums)"""
    done: torch.Tensor | None = None
    """upload, flat replay: 1.0 where the episode terminated [B]"""
    discount: torch.Tensor | None = None
    """upload, trajectory replay: float32 [B], gamma^m for the m steps summed, 0 where the episode terminated"""
    weights: torch.Tensor | None = None
    """upload: IS weights [B]"""
    td: torch.Tensor | None = None
    """fwd_bwd: TD errors q - y, detached [B]; per_update turns them into priorities"""
    grads: list[torch.Tensor | None] = field(default_factory=list)
    """fwd_bwd: the online network's gradients, which adam reads"""
