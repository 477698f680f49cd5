"""Adam and the soft target update in one kernel per parameter tensor.

Why: PyTorch's fused and foreach optimizers go through ``multi_tensor_apply``, which gives each
chunk of 65,536 elements one block of threads. The reference Q-network's 313k parameters in six
tensors make nine such blocks on a GPU of 132 SMs: each block walks up to 1.8 MB (parameter,
gradient, both moments, read and written) alone, so the step runs at a few percent of the memory
bandwidth (the adam phase of the market step measured 60 us on an H200, the soft target update's
``_foreach_lerp_`` 13 us of it, where the bytes would take about 3 us; the block count is our
reading of ``MultiTensorApply.cuh``, not a profile). Here every tensor gets one program per 1,024
elements, and the target update rides in the same pass: six launches, each spread over the
whole GPU, plus one for the step counts.

The update is ``torch.optim.Adam``'s (Kingma and Ba 2015, bias-corrected; no weight decay, no
amsgrad), on the optimizer's own state tensors, so checkpoints of the optimizer read the same
either way; its torch back end (``backend="torch"``) is the same in torch ops, one tensor at a
time, as ``torch.optim.Adam``'s single-tensor path computes it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gper._triton import HAS_TRITON, tl, triton

#: elements a program updates
BLOCK = 1024


if HAS_TRITON:

    @triton.jit
    def _adam_kernel(
        p_ptr,  # [n] float32 parameter, updated
        g_ptr,  # [n] float32 gradient
        m_ptr,  # [n] float32 first moment, updated
        v_ptr,  # [n] float32 second moment, updated
        t_ptr,  # [n] float32 target parameter, lerped towards the new p (HAS_TARGET)
        step_ptr,  # [] float32 step count, already advanced
        n,
        lr,
        beta1,
        beta2,
        log2_beta1,
        log2_beta2,
        eps,
        tau,
        HAS_TARGET: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        step = tl.load(step_ptr).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask)
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, offs, mask, g, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
            HAS_TARGET,
        )  # fmt: skip

    @triton.jit
    def adam_update(
        p_ptr, m_ptr, v_ptr, t_ptr, offs, mask, g, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
        HAS_TARGET: tl.constexpr,
    ):  # fmt: skip
        """One Adam step of the elements ``offs`` (gradient ``g``, advanced step count ``step``,
        learning rate ``lr`` and target rate ``tau``: scalars or per element), parameter and
        moments stored back, then the target moved towards the new parameter (HAS_TARGET). The
        single agent's kernel and the population's (:mod:`gper.dqn.population_fused_adam`) share it."""
        # beta^step as exp2(step log2 beta): the step count lives on the device (captured steps)
        bc1 = 1.0 - tl.exp2(step * log2_beta1)
        bc2 = 1.0 - tl.exp2(step * log2_beta2)
        p = tl.load(p_ptr + offs, mask=mask)
        m = beta1 * tl.load(m_ptr + offs, mask=mask) + (1.0 - beta1) * g
        v = beta2 * tl.load(v_ptr + offs, mask=mask) + (1.0 - beta2) * g * g
        p = p - (lr / bc1) * m / (tl.sqrt(v) / tl.sqrt(bc2) + eps)
        tl.store(p_ptr + offs, p, mask=mask)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        if HAS_TARGET:
            t = tl.load(t_ptr + offs, mask=mask)
            tl.store(t_ptr + offs, t + tau * (p - t), mask=mask)


def adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    targets: list[torch.Tensor] | None = None,
    tau: float = 1.0,
    backend: str = "auto",
) -> None:
    """One Adam step of every tensor in place, then (with ``targets``) ``target.lerp_(param, tau)``.

    Args:
        params: parameters (float32, contiguous); updated in place.
        grads: their gradients, same shapes.
        exp_avgs, exp_avg_sqs: Adam's moments, same shapes; updated in place.
        steps: one 0-d float32 step count per tensor (may repeat one tensor); advanced by 1 first,
            and the bias corrections use the advanced count, as ``torch.optim.Adam``.
        lr, beta1, beta2, eps: Adam's settings.
        targets: target-network parameters, same shapes, moved towards the updated parameters
            by ``tau``; None: no target update.
        tau: the soft update's rate.
        backend: "triton", "torch" or "auto" (triton on CUDA). The torch path is
            ``torch.optim.Adam``'s single-tensor one (bit for bit on the CPU): bias corrections
            from the step count as a Python float where the count is on the CPU, as device
            tensors (capturable) where it is not.
    """
    tensors = [params, grads, exp_avgs, exp_avg_sqs, steps] + ([targets] if targets is not None else [])
    if len({len(t) for t in tensors}) != 1:
        raise ValueError(f"adam_step needs lists of one length, got {[len(t) for t in tensors]}")
    if backend == "auto":
        backend = "triton" if HAS_TRITON and params and params[0].is_cuda else "torch"
    if backend == "torch":  # the reference
        for s in dict.fromkeys(steps):  # a step count shared by several tensors advances once
            s.add_(1)
        with torch.no_grad():
            for i, (p, g, m, v, s) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True)):
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                if s.device.type == "cpu":
                    step = s.item()
                    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
                    p.addcdiv_(m, (v.sqrt() / math.sqrt(bc2)).add_(eps), value=-(lr / bc1))
                else:  # no host read: what a captured step may do
                    step_size_neg = -(lr / (1 - torch.pow(beta1, s)))
                    bc2_sqrt = (1 - torch.pow(beta2, s)).sqrt()
                    p.addcdiv_(m, (v.sqrt() / (bc2_sqrt * step_size_neg)).add_(eps / step_size_neg))
                if targets is not None:
                    targets[i].lerp_(p, tau)
        return
    if backend != "triton":
        raise ValueError(f"backend must be auto, triton or torch, got {backend!r}")
    for i, p in enumerate(params):
        group = [grads[i], exp_avgs[i], exp_avg_sqs[i]] + ([targets[i]] if targets is not None else [])
        if (
            p.dtype != torch.float32
            or not p.is_contiguous()
            or any(t.shape != p.shape or t.dtype != p.dtype or not t.is_contiguous() for t in group)
        ):
            raise ValueError(f"tensor {i}: adam_step needs contiguous float32 tensors of one shape {tuple(p.shape)}")
        if steps[i].device != p.device:
            raise ValueError(f"tensor {i}: its step count is on {steps[i].device}, the tensor on {p.device}")
    unique = list(dict.fromkeys(steps))
    if len(unique) > 1:
        torch._foreach_add_(unique, 1.0)
    else:
        unique[0].add_(1.0)
    log2_b1, log2_b2 = math.log2(beta1), math.log2(beta2)
    for i, p in enumerate(params):
        n = p.numel()
        target = targets[i] if targets is not None else p
        _adam_kernel[(triton.cdiv(n, BLOCK),)](
            p, grads[i], exp_avgs[i], exp_avg_sqs[i], target, steps[i], n,
            lr, beta1, beta2, log2_b1, log2_b2, eps, tau, HAS_TARGET=targets is not None, BLOCK=BLOCK,
        )  # fmt: skip


def adam_state(optimizer: torch.optim.Adam) -> tuple[list[torch.Tensor], ...]:
    """``(params, exp_avgs, exp_avg_sqs, steps)`` of a one-group ``torch.optim.Adam``, its state
    created the way its first ``step()`` would (zero moments, step count 0, on the parameters'
    device where the optimizer is capturable or fused), so :func:`adam_step` can stand in for
    ``optimizer.step()`` and the optimizer's ``state_dict`` stays the checkpoint.

    Raises:
        ValueError: for settings :func:`adam_step` does not implement (several parameter groups,
            weight decay, amsgrad, maximize, a tensor learning rate).
    """
    if len(optimizer.param_groups) != 1:
        raise ValueError(f"adam_step takes one parameter group, the optimizer has {len(optimizer.param_groups)}")
    group = optimizer.param_groups[0]
    unsupported = [k for k in ("weight_decay", "amsgrad", "maximize") if group.get(k)]
    if unsupported or isinstance(group["lr"], torch.Tensor):
        raise ValueError(f"adam_step implements plain Adam with a float lr; the optimizer sets {unsupported or 'lr'}")
    on_device = group.get("capturable") or group.get("fused")
    params, exp_avgs, exp_avg_sqs, steps = [], [], [], []
    for p in group["params"]:
        state = optimizer.state[p]
        if not state:
            device = p.device if on_device else torch.device("cpu")
            state["step"] = torch.zeros((), dtype=torch.float32, device=device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        params.append(p)
        exp_avgs.append(state["exp_avg"])
        exp_avg_sqs.append(state["exp_avg_sq"])
        steps.append(state["step"])
    return params, exp_avgs, exp_avg_sqs, steps


#: Adam's settings that follow the device rather than the checkpoint (see :func:`load_adam_state`)
DEVICE_FLAGS = ("capturable", "fused", "foreach")


def load_adam_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping what belongs to this optimizer and its device.

    Adam's implementation flags (:data:`DEVICE_FLAGS`: capturable and fused on CUDA) stay the
    optimizer's when the state comes from another device, and a capturable or fused Adam keeps its
    step counts on the parameters' device. The values land in the optimizer's own tensors where it
    has them (else in copies): torch keeps a loaded tensor of the right dtype and device as it is,
    so a state taken from another live optimizer would be shared with it, and a step graph captured
    before the load reads the tensors it was captured with.
    """
    own = [{k: g[k] for k in DEVICE_FLAGS if k in g} for g in optimizer.param_groups]
    before = {p: dict(s) for p, s in optimizer.state.items()}
    optimizer.load_state_dict(state)
    for group, flags in zip(optimizer.param_groups, own, strict=True):
        group.update(flags)
        on_device = group.get("capturable") or group.get("fused")
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor):
                device = param.device if on_device else torch.device("cpu")
                optimizer.state[param]["step"] = step.to(device, torch.float32)
    for param, param_state in optimizer.state.items():
        kept = before.get(param, {})
        for key, value in param_state.items():
            if not isinstance(value, torch.Tensor):
                continue
            mine = kept.get(key)
            fits = isinstance(mine, torch.Tensor) and (mine.shape, mine.dtype, mine.device) == (
                value.shape, value.dtype, value.device
            )  # fmt: skip
            if fits and mine is not value:
                mine.copy_(value)
            param_state[key] = mine if fits else value.clone()


def share_step_counts(optimizer: torch.optim.Adam) -> None:
    """Adam's step counts as one tensor for all the parameters (the one-kernel learn step advances
    one count an agent): Adam advances every count together, so they are always equal; separate
    ones (a loaded state's) are joined. Creates the state where it does not exist yet."""
    params, _, _, steps = adam_state(optimizer)
    for p in params[1:]:
        optimizer.state[p]["step"] = steps[0]
