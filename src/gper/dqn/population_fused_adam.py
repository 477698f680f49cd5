"""A population's Adam step in one kernel per stacked tensor: the gradient clipping's scale, both
moments, the bias-corrected update and the soft target update in one pass over memory.

Why: the torch ops of :class:`~gper.dqn.population_adam.PopulationAdam` read and write each
stacked tensor about ten times (the moments' foreach ops, the square root, the denominator, the
update; the clipping's scale and the target's lerp before and after) in some 60 launches for a
three-layer network. At 256 agents of the cartpole network (17.6M parameters) that was 533 µs of
the iteration's 2,355 (``benchmarks/results/train-step-population-nvidia-h200-20261204-184341.md``),
where one pass (parameter, moments and target read and written, the gradient read: 36 bytes an
element) takes about 130 µs at the H200's 4.8 TB/s. The arithmetic is the single agent's fused
kernel's (:func:`gper.dqn.fused_adam.adam_update`, which both call) with each agent's learning
rate, step count, clipping scale and target rate read by agent: ``agent = element // elements_per_agent``.
"""

from __future__ import annotations

import math

import torch

from gper._triton import HAS_TRITON, tl, triton

#: elements a program updates
BLOCK = 1024


if HAS_TRITON:
    from gper.dqn.fused_adam import adam_update

    @triton.jit
    def _population_adam_kernel(
        p_ptr,  # [N * per_agent] float32 parameters, updated
        g_ptr,  # gradients (read only: the clipping scale is applied here, not written back)
        m_ptr,  # first moments, updated
        v_ptr,  # second moments, updated
        t_ptr,  # target parameters, lerped towards the new p (HAS_TARGET)
        steps_ptr,  # [N] float32 step counts, already advanced
        lr_ptr,  # [N] float64 learning rates
        scale_ptr,  # [N] float32 gradient scales (HAS_SCALE)
        tau_ptr,  # [N] float32 target rates (TAU_PER_AGENT)
        n,
        per_agent,
        beta1,
        beta2,
        log2_beta1,
        log2_beta2,
        eps,
        tau,
        HAS_SCALE: tl.constexpr,
        HAS_TARGET: tl.constexpr,
        TAU_PER_AGENT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        agent = offs // per_agent
        step = tl.load(steps_ptr + agent, mask=mask, other=1.0)
        lr = tl.load(lr_ptr + agent, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask)
        if HAS_SCALE:
            g = g * tl.load(scale_ptr + agent, mask=mask, other=1.0)
        if TAU_PER_AGENT:
            rate = tl.load(tau_ptr + agent, mask=mask, other=0.0)
        else:
            rate = tau
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, offs, mask, g, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, rate,
            HAS_TARGET,
        )  # fmt: skip


def population_adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: torch.Tensor,
    lr: torch.Tensor,
    *,
    beta1: float,
    beta2: float,
    eps: float,
    grad_scale: torch.Tensor | None = None,
    targets: list[torch.Tensor] | None = None,
    tau: float | torch.Tensor = 1.0,
) -> None:
    """One Adam step of every agent of stacked tensors (each ``[N, ...]``, contiguous float32), in
    place; ``steps`` [N] float32 on their device is advanced by 1 first (as ``torch.optim.Adam``).

    Args:
        lr: [N] float64 learning rates on the parameters' device.
        grad_scale: [N] float32, each agent's gradients multiplied by it first (a clipping's
            ``min(1, max_norm / norm)``); the gradients themselves are not written.
        targets: target parameters, same shapes, moved towards the updated parameters by ``tau``
            (one float, or [N] float32 on the device); None: no target update.
    """
    if not HAS_TRITON:
        raise RuntimeError("population_adam_step needs Triton (pip install triton)")
    groups = [grads, exp_avgs, exp_avg_sqs] + ([targets] if targets is not None else [])
    if any(len(g) != len(params) for g in groups):
        lengths = [len(params)] + [len(g) for g in groups]
        raise ValueError(f"population_adam_step needs lists of one length, got {lengths}")
    n_agents = steps.shape[0]
    for i, p in enumerate(params):
        same = [g[i] for g in groups]
        if p.dtype != torch.float32 or not p.is_contiguous() or p.dim() < 1 or p.shape[0] != n_agents:
            raise ValueError(f"tensor {i}: needs a contiguous float32 [{n_agents}, ...] tensor, got {tuple(p.shape)}")
        if any(t.shape != p.shape or t.dtype != p.dtype or not t.is_contiguous() for t in same):
            raise ValueError(f"tensor {i}: gradient, moments and target must be contiguous {tuple(p.shape)} float32")
    per_tensor = isinstance(tau, torch.Tensor)
    steps.add_(1.0)
    log2_b1, log2_b2 = math.log2(beta1), math.log2(beta2)
    for i, p in enumerate(params):
        n = p.numel()
        _population_adam_kernel[(triton.cdiv(n, BLOCK),)](
            p, grads[i], exp_avgs[i], exp_avg_sqs[i], targets[i] if targets is not None else p,
            steps, lr, grad_scale if grad_scale is not None else steps, tau if per_tensor else steps,
            n, n // n_agents, beta1, beta2, log2_b1, log2_b2, eps, 0.0 if per_tensor else float(tau),
            HAS_SCALE=grad_scale is not None, HAS_TARGET=targets is not None, TAU_PER_AGENT=per_tensor, BLOCK=BLOCK,
        )  # fmt: skip
