"""The DQN loss in one kernel: double-Q (or max-Q) targets, Huber (or squared) loss times IS weights, TD errors.

:func:`td_loss` is what the trainer's ``fwd_bwd`` phase computes from its three Q-value tensors,
``mean(huber(q[a] - y) * w)`` with ``y = r + discount * Q'(s', argmax Q(s'))`` (Huber delta 1,
van Hasselt et al. 2016 for the double-Q target), or with ``loss="mse"`` ``mean((q[a] - y)^2 * w)``,
as one autograd node: a forward kernel (one
program a block of rows: the argmax, the gather, the target, the TD error, per-block sums) and
a one-program kernel that reduces the block sums into the loss and the trainer's device sums;
its backward is one kernel writing the [B, A] gradient (zero except at the action). The
unfused torch expression launches about twenty kernels for the same.

Its torch back end (``backend="torch"``) is the same in plain torch ops: the semantics, the CPU
path, and what the tests hold the kernels to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gper._triton import HAS_TRITON, tl, triton

#: rows a program of the forward and backward kernels handles
BLOCK_B = 64

#: the TD losses: ``huber`` (delta 1: DQN's, SB3's and CleanRL's) and ``mse``, the squared error
#: (no 1/2: PureJaxRL's ``mean((q[a] - y) ** 2)``)
LOSSES = ("huber", "mse")


def check_loss(loss: str) -> None:
    """A one-line error for a loss name not in :data:`LOSSES`."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")


def elementwise_loss(q_a: torch.Tensor, y: torch.Tensor, loss: str = "huber") -> torch.Tensor:
    """Each row's TD loss of ``q_a`` against the target ``y`` (torch ops, no reduction): Huber
    with delta 1, or the squared error."""
    if loss == "huber":
        return F.huber_loss(q_a, y, reduction="none", delta=1.0)
    check_loss(loss)
    return F.mse_loss(q_a, y, reduction="none")


if HAS_TRITON:

    @triton.jit
    def _row_block(n_rows, n_actions, BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr):
        """This program's block of rows of a [B, A] tensor: the rows, their mask, the columns and
        the [BLOCK_B, BLOCK_A] mask (inlined into each kernel)."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
        rmask = rows < n_rows
        cols = tl.arange(0, BLOCK_A)
        return rows, rmask, cols, rmask[:, None] & (cols < n_actions)[None, :]

    @triton.jit
    def _td_loss_fwd(
        q_ptr,  # [B, A] Q(s) of the online network, any float dtype
        qn_ptr,  # [B, A] Q(s') of the online network (double-Q argmax); unused without DOUBLE_Q
        qt_ptr,  # [B, A] Q'(s') of the target network
        act_ptr,  # [B] int64
        rew_ptr,  # [B] float32
        disc_ptr,  # [B] float32: the discount, or with FROM_DONE the done flags
        w_ptr,  # [B] float32 IS weights
        td_ptr,  # [B] float32 out: q[a] - y
        part_ptr,  # [programs, 3] float32 out: per-block sums of loss * w, q[a], |td|
        n_rows,
        n_actions,
        stride_q,
        stride_qn,
        stride_qt,
        stride_act,
        stride_rew,
        stride_disc,
        stride_w,
        gamma,
        FROM_DONE: tl.constexpr,
        DOUBLE_Q: tl.constexpr,
        MSE: tl.constexpr,
        BLOCK_B: tl.constexpr,
        BLOCK_A: tl.constexpr,
    ):
        rows, rmask, cols, m2 = _row_block(n_rows, n_actions, BLOCK_B, BLOCK_A)
        if DOUBLE_Q:
            qn = tl.load(qn_ptr + rows[:, None] * stride_qn + cols[None, :], mask=m2, other=-float("inf"))
            # the first of equal maxima, as torch.argmax
            best = tl.argmax(qn.to(tl.float32), axis=1, tie_break_left=True)
            qt = tl.load(qt_ptr + rows * stride_qt + best, mask=rmask, other=0.0).to(tl.float32)
            next_q = qt
        else:
            qt = tl.load(qt_ptr + rows[:, None] * stride_qt + cols[None, :], mask=m2, other=-float("inf"))
            next_q = tl.where(rmask, tl.max(qt.to(tl.float32), axis=1), 0.0)
        action = tl.load(act_ptr + rows * stride_act, mask=rmask, other=0)
        q_a = tl.load(q_ptr + rows * stride_q + action, mask=rmask, other=0.0).to(tl.float32)
        reward = tl.load(rew_ptr + rows * stride_rew, mask=rmask, other=0.0)
        disc = tl.load(disc_ptr + rows * stride_disc, mask=rmask, other=0.0)
        if FROM_DONE:
            disc = gamma * (1.0 - disc)
        td = q_a - (reward + disc * next_q)
        tl.store(td_ptr + rows, td, mask=rmask)
        w = tl.load(w_ptr + rows * stride_w, mask=rmask, other=0.0)
        z = tl.abs(td)
        if MSE:
            row_loss = td * td
        else:
            row_loss = tl.where(z < 1.0, 0.5 * td * td, z - 0.5)
        part = part_ptr + tl.program_id(0).to(tl.int64) * 3  # this block's three sums
        tl.store(part + 0, tl.sum(tl.where(rmask, row_loss * w, 0.0), axis=0))
        tl.store(part + 1, tl.sum(q_a, axis=0))
        tl.store(part + 2, tl.sum(tl.where(rmask, z, 0.0), axis=0))

    @triton.jit
    def _td_loss_finish(
        part_ptr,  # [n_parts, 3] float32 block sums
        loss_ptr,  # [] float32 out: the mean loss
        sums_ptr,  # [3] float64, added to (HAS_SUMS): mean loss, mean q[a], mean |td|
        n_parts,
        inv_rows,
        HAS_SUMS: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):
        # one program: a fixed summation order, so the loss does not vary between replays
        acc0 = tl.zeros((BLOCK_P,), tl.float64)
        acc1 = tl.zeros((BLOCK_P,), tl.float64)
        acc2 = tl.zeros((BLOCK_P,), tl.float64)
        for start in range(0, n_parts, BLOCK_P):
            i = start + tl.arange(0, BLOCK_P)
            m = i < n_parts
            acc0 += tl.load(part_ptr + i * 3 + 0, mask=m, other=0.0).to(tl.float64)
            acc1 += tl.load(part_ptr + i * 3 + 1, mask=m, other=0.0).to(tl.float64)
            acc2 += tl.load(part_ptr + i * 3 + 2, mask=m, other=0.0).to(tl.float64)
        loss = tl.sum(acc0, axis=0) * inv_rows
        tl.store(loss_ptr, loss.to(tl.float32))
        if HAS_SUMS:
            # the float32 mean loss, as the unfused step adds it
            tl.store(sums_ptr + 0, tl.load(sums_ptr + 0) + loss.to(tl.float32).to(tl.float64))
            tl.store(sums_ptr + 1, tl.load(sums_ptr + 1) + tl.sum(acc1, axis=0) * inv_rows)
            tl.store(sums_ptr + 2, tl.load(sums_ptr + 2) + tl.sum(acc2, axis=0) * inv_rows)

    @triton.jit
    def _td_loss_bwd(
        td_ptr,  # [B] float32
        w_ptr,  # [B] float32
        act_ptr,  # [B] int64
        gout_ptr,  # [] float32: d(out)/d(loss)
        dq_ptr,  # [B, A] out, q's dtype: clamp(td, -1, 1) * w / B * gout at the action, else 0
        n_rows,
        n_actions,
        stride_w,
        stride_act,
        stride_dq,
        inv_rows,
        MSE: tl.constexpr,
        BLOCK_B: tl.constexpr,
        BLOCK_A: tl.constexpr,
    ):
        rows, rmask, cols, m2 = _row_block(n_rows, n_actions, BLOCK_B, BLOCK_A)
        td = tl.load(td_ptr + rows, mask=rmask, other=0.0)
        w = tl.load(w_ptr + rows * stride_w, mask=rmask, other=0.0)
        action = tl.load(act_ptr + rows * stride_act, mask=rmask, other=-1)
        g = tl.load(gout_ptr).to(tl.float32)
        if MSE:  # the squared error's derivative, 2 td
            slope = 2.0 * td
        else:  # Huber's with delta 1: td clamped to [-1, 1] (td itself at |td| = 1, as torch)
            slope = tl.minimum(tl.maximum(td, -1.0), 1.0)
        val = slope * (w * (g * inv_rows))
        out = tl.where(cols[None, :] == action[:, None], val[:, None], 0.0)
        tl.store(dq_ptr + rows[:, None] * stride_dq + cols[None, :], out.to(dq_ptr.dtype.element_ty), mask=m2)


def _check(q, q_next_online, q_next_target, action, reward, discount, weights) -> None:
    """One-line errors for inputs the kernels cannot take (before anything is written)."""
    if q.dim() != 2 or q_next_target.shape != q.shape:
        raise ValueError(
            f"q and q_next_target must be [B, A] of the same shape, got {tuple(q.shape)} and "
            f"{tuple(q_next_target.shape)}"
        )
    if q_next_online is not None and q_next_online.shape != q.shape:
        raise ValueError(f"q_next_online must be {tuple(q.shape)}, got {tuple(q_next_online.shape)}")
    b = q.shape[0]
    for name, t, dtype in (
        ("action", action, torch.int64),
        ("reward", reward, torch.float32),
        ("discount", discount, torch.float32),
        ("weights", weights, torch.float32),
    ):
        if t.shape != (b,) or t.dtype != dtype:
            raise ValueError(f"{name} must be [{b}] {dtype}, got {tuple(t.shape)} {t.dtype}")
    for name, t in (("q", q), ("q_next_online", q_next_online), ("q_next_target", q_next_target)):
        if t is not None and t.stride(1) != 1:
            raise ValueError(f"{name} must have contiguous rows (stride 1 along actions), got strides {t.stride()}")


class _TDLoss(torch.autograd.Function):
    """The Triton kernels as one autograd node: gradient for ``q`` only."""

    @staticmethod
    def forward(ctx, q, q_next_online, q_next_target, action, reward, discount, weights, gamma, sums, mse):
        b, n_actions = q.shape
        td = torch.empty(b, dtype=torch.float32, device=q.device)
        programs = triton.cdiv(b, BLOCK_B)
        parts = torch.empty(programs, 3, dtype=torch.float32, device=q.device)
        block_a = triton.next_power_of_2(n_actions)
        double_q = q_next_online is not None
        qn = q_next_online if double_q else q_next_target
        _td_loss_fwd[(programs,)](
            q, qn, q_next_target, action, reward, discount, weights, td, parts,
            b, n_actions, q.stride(0), qn.stride(0), q_next_target.stride(0),
            # the 1-D inputs may be strided views of the sampled rows: read in place
            action.stride(0), reward.stride(0), discount.stride(0), weights.stride(0),
            1.0 if gamma is None else float(gamma),
            FROM_DONE=gamma is not None, DOUBLE_Q=double_q, MSE=mse, BLOCK_B=BLOCK_B, BLOCK_A=block_a,
        )  # fmt: skip
        loss = torch.empty((), dtype=torch.float32, device=q.device)
        has_sums = sums is not None
        _td_loss_finish[(1,)](
            parts, loss, sums if has_sums else loss, programs, 1.0 / b, HAS_SUMS=has_sums, BLOCK_P=1024
        )
        ctx.save_for_backward(td, weights, action)
        ctx.q_meta = (q.shape, q.dtype, mse)
        ctx.mark_non_differentiable(td)
        return loss, td

    @staticmethod
    def backward(ctx, grad_loss, grad_td):
        if grad_loss is None:
            return (None,) * 10
        td, weights, action = ctx.saved_tensors
        shape, dtype, mse = ctx.q_meta
        b, n_actions = shape
        dq = torch.empty(shape, dtype=dtype, device=td.device)
        _td_loss_bwd[(triton.cdiv(b, BLOCK_B),)](
            td, weights, action, grad_loss.contiguous(), dq, b, n_actions,
            weights.stride(0), action.stride(0), dq.stride(0), 1.0 / b,
            MSE=mse, BLOCK_B=BLOCK_B, BLOCK_A=triton.next_power_of_2(n_actions),
        )  # fmt: skip
        return dq, None, None, None, None, None, None, None, None, None


def td_loss(
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
    backend: str = "auto",
    loss: str = "huber",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The DQN loss ``mean(huber(q[a] - y) * w)`` (or ``mean((q[a] - y)^2 * w)``) and the TD
    errors ``q[a] - y``, with ``y = reward + discount * Q'(s', a')``.

    Args:
        q: [B, A] Q-values of the online network on the observations (float32 or bf16); the
            only input the loss is differentiated for.
        q_next_online: [B, A] the online network on the next observations: ``a'`` is its argmax
            (double-Q; the first of equal maxima); None: ``a'`` maximises ``q_next_target``.
        q_next_target: [B, A] the target network on the next observations.
        action: [B] int64 actions taken.
        reward: [B] float32 rewards (n-step discounted sums from the trajectory replay).
        discount: [B] float32 discounts of the bootstrap (gamma^m, 0 where the episode
            terminated); with ``gamma`` given, the done flags instead (discount gamma (1 - done)).
        weights: [B] float32 IS weights.
        gamma: see ``discount``.
        sums: [3] float64 device sums to add (mean loss, mean q[a], mean |td|) to, or None.
        backend: "triton" (kernels; on CPU tensors only under ``TRITON_INTERPRET=1``), "torch"
            (plain torch ops: the reference the kernels are held to), or "auto": triton on CUDA,
            torch elsewhere.
        loss: ``"huber"`` (delta 1) or ``"mse"`` (the squared error, no 1/2), see :data:`LOSSES`.

    Returns:
        ``(loss, td)``: the float32 scalar loss (differentiable for ``q``; its gradient is
        ``clamp(td, -1, 1) * w / B`` at the action, ``2 td w / B`` for the squared error, zero
        elsewhere) and the [B] float32 TD errors ``q[a] - y``, detached (what the priorities are
        made from).
    """
    check_loss(loss)
    _check(q, q_next_online, q_next_target, action, reward, discount, weights)
    if backend == "auto":
        backend = "triton" if q.is_cuda and HAS_TRITON else "torch"
    if backend == "torch":  # the reference: the trainer's expression in torch ops
        q_a = q.float().gather(1, action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_target = q_next_target.float()
            if q_next_online is not None:
                next_q = next_target.gather(1, q_next_online.argmax(dim=1, keepdim=True)).squeeze(1)
            else:
                next_q = next_target.max(dim=1).values
            # with gamma, ``discount`` holds the done flags (the flat replay): gamma (1 - done)
            y = reward + (gamma * (1.0 - discount) if gamma is not None else discount) * next_q
        mean = (elementwise_loss(q_a, y, loss) * weights).mean()
        td = (q_a - y).detach()
        if sums is not None:
            sums += torch.stack((mean.detach(), q_a.detach().mean(), td.abs().mean()))
        return mean, td
    if backend != "triton":
        raise ValueError(f"backend must be auto, triton or torch, got {backend!r}")
    if not HAS_TRITON:
        raise RuntimeError("backend='triton' needs triton: pip install \".[triton]\"")
    if sums is not None and (sums.shape != (3,) or sums.dtype != torch.float64):
        raise ValueError(f"sums must be [3] float64, got {tuple(sums.shape)} {sums.dtype}")
    return _TDLoss.apply(q, q_next_online, q_next_target, action, reward, discount, weights, gamma, sums, loss == "mse")
