"""The DQN loss and gradient clipping of a population: each agent's as a single agent computes it.

Agent ``i``'s loss is the single agent's ``mean(huber(q[a] - y) * w)`` over its own batch
(Huber delta 1, or the squared error with ``loss="mse"``; IS weights ``w``;
``y = r + discount * Q'(s', a')``, ``a'`` the online network's argmax for double-Q); the loss to
differentiate is the sum of the agents' losses, whose gradient with respect to each agent's loss
is exactly 1, so each agent's gradient is its single-run one.

The elementwise parts run over all agents at once. The reductions (the means over each batch, the
gradient norms) run per agent on the CPU (``batched=False``, the default there), so each sums in
the order the single agent's does; on CUDA (``batched=True``) they run over a dim for all agents.
"""

from __future__ import annotations

import torch

from gper.dqn.fused_loss import check_loss, elementwise_loss
from gper.dqn.population_net import StackedQNetwork


def population_td_loss(
    q: torch.Tensor,
    q_next_online: torch.Tensor | None,
    q_next_target: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    weights: torch.Tensor,
    *,
    gamma: float | None = None,
    sums: torch.Tensor | None = None,
    batched: bool | None = None,
    loss: str = "huber",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss of N agents from their Q-values, as :func:`gper.dqn.fused_loss.td_loss` (torch
    back end) computes one agent's, each agent along dim 0.

    Args:
        q: [N, B, A] the online networks on the observations; the input differentiated for.
        q_next_online: [N, B, A] the online networks on the next observations (double-Q: ``a'``
            is its argmax, the first of equal maxima); None: ``a'`` maximises ``q_next_target``.
        q_next_target: [N, B, A] the target networks on the next observations.
        action: [N, B] int64 actions taken.
        reward: [N, B] float32 rewards (n-step discounted sums from the trajectory replay).
        discount: [N, B] float32 discounts of the bootstrap; with ``gamma``, the done flags (the
            flat replay: the discount is then ``gamma * (1 - done)``, computed as the single agent does).
        weights: [N, B] float32 IS weights.
        gamma: see ``discount``.
        sums: [N, 3] float64 sums to add each agent's (loss, mean q[a], mean |td|) to, or None.
        batched: the means over each batch for all agents in one reduction (True) or one per
            agent (False: the single agent's summation order); None: batched on CUDA only.
        loss: ``"huber"`` (delta 1) or ``"mse"`` (:data:`gper.dqn.fused_loss.LOSSES`).

    Returns:
        ``(total, losses, td)``: the scalar sum of the agents' losses (what to call ``backward``
        on), the [N] losses and the [N, B] TD errors ``q[a] - y`` (both detached).
    """
    check_loss(loss)
    _check(q, q_next_online, q_next_target, action, reward, discount, weights, sums)
    if batched is None:
        batched = q.is_cuda
    q_a = q.float().gather(2, action.unsqueeze(2)).squeeze(2)
    with torch.no_grad():
        next_target = q_next_target.float()
        if q_next_online is not None:
            next_q = next_target.gather(2, q_next_online.argmax(dim=2, keepdim=True)).squeeze(2)
        else:
            next_q = next_target.max(dim=2).values
        # the single agent's expression, in its order: r + (gamma (1 - done)) Q' or r + discount Q'
        y = reward + (gamma * (1.0 - discount) if gamma is not None else discount) * next_q
    losses = _row_means(elementwise_loss(q_a, y, loss) * weights, batched)
    td = (q_a - y).detach()
    if sums is not None:
        with torch.no_grad():
            sums += torch.stack((losses, _row_means(q_a, batched), _row_means(td.abs(), batched)), dim=1)
    return losses.sum(), losses.detach(), td


def population_loss(
    qnet: StackedQNetwork,
    target: StackedQNetwork,
    x: torch.Tensor,
    next_x: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    weights: torch.Tensor,
    *,
    gamma: float | None = None,
    double_q: bool = True,
    sums: torch.Tensor | None = None,
    batched: bool | None = None,
    loss: str = "huber",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forwards and the loss of the single agent's ``fwd_bwd`` phase for N agents:
    ``qnet(x)`` with autograd, ``target(next_x)`` and (double-Q) ``qnet(next_x)`` without, then
    :func:`population_td_loss` (see it for the arguments and the result). ``x`` and ``next_x``
    are [N, B, obs_dim]; ``batched`` applies to the forwards and the means alike."""
    q = qnet(x, batched)
    with torch.no_grad():
        q_next_target = target(next_x, batched)
        q_next_online = qnet(next_x, batched) if double_q else None
    return population_td_loss(
        q, q_next_online, q_next_target, action, reward, discount, weights,
        gamma=gamma, sums=sums, batched=batched, loss=loss,
    )  # fmt: skip


def clip_scales(grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each agent's clipping scale ``min(1, max_norm / (norm + 1e-6))`` (``clip_grad_norm_``'s) and
    its global 2-norm, [N] each, for stacked gradients [N, ...], one norm per tensor for all agents;
    nothing is scaled (:meth:`~gper.dqn.population_adam.PopulationAdam.step` applies the scale)."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2.0, dim=1) for g in grads], dim=1)
    total = torch.linalg.vector_norm(norms, 2.0, dim=1)
    return torch.clamp(max_norm / (total + 1e-6), max=1.0), total


def clip_grad_norms_(grads: list[torch.Tensor], max_norm: float, batched: bool | None = None) -> torch.Tensor:
    """Each agent's gradients scaled to a global 2-norm of at most ``max_norm``, in place, as
    ``nn.utils.clip_grad_norm_(agent_parameters, max_norm, foreach=True)`` scales a single agent's.

    Args:
        grads: the stacked gradients, each [N, ...] (agent along dim 0).
        max_norm: the largest norm each agent keeps.
        batched: one norm per tensor for all agents (True) or the single agent's calls on each
            agent's slices (False); None: batched on CUDA only.

    Returns:
        [N] each agent's norm before clipping.
    """
    if not grads:
        raise ValueError("clip_grad_norms_ needs at least one gradient")
    n = grads[0].shape[0]
    if any(g.dim() < 1 or g.shape[0] != n for g in grads):
        raise ValueError(
            f"clip_grad_norms_ needs gradients of N={n} agents along dim 0, got {[tuple(g.shape) for g in grads]}"
        )
    if batched is None:
        batched = grads[0].is_cuda
    if batched:
        coef, total = clip_scales(grads, max_norm)
        for g in grads:
            g.mul_(coef.view(n, *([1] * (g.dim() - 1))))
        return total
    totals = []
    for i in range(n):
        own = [g[i] for g in grads]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(own, 2.0)), 2.0)
        torch._foreach_mul_(own, torch.clamp(max_norm / (total + 1e-6), max=1.0))
        totals.append(total)
    return torch.stack(totals)


def _row_means(t: torch.Tensor, batched: bool) -> torch.Tensor:
    """[N, B] -> [N]: the mean of each agent's row."""
    if batched:
        return t.mean(dim=1)
    return torch.stack([row.mean() for row in t])


def _check(q, q_next_online, q_next_target, action, reward, discount, weights, sums) -> None:
    """One-line errors for inputs of the wrong shapes or dtypes."""
    if q.dim() != 3 or q_next_target.shape != q.shape:
        raise ValueError(
            f"q and q_next_target must be [N, B, A] of one shape, got {tuple(q.shape)} and {tuple(q_next_target.shape)}"
        )
    if q_next_online is not None and q_next_online.shape != q.shape:
        raise ValueError(f"q_next_online must be {tuple(q.shape)}, got {tuple(q_next_online.shape)}")
    n, b = q.shape[:2]
    for name, t, dtype in (
        ("action", action, torch.int64),
        ("reward", reward, torch.float32),
        ("discount", discount, torch.float32),
        ("weights", weights, torch.float32),
    ):
        if t.shape != (n, b) or t.dtype != dtype:
            raise ValueError(f"{name} must be [N={n}, B={b}] {dtype}, got {tuple(t.shape)} {t.dtype}")
    if sums is not None and (sums.shape != (n, 3) or sums.dtype != torch.float64):
        raise ValueError(f"sums must be [N={n}, 3] float64, got {tuple(sums.shape)} {sums.dtype}")
