"""A population's whole learn step (forwards, loss, backward, clipping, Adam, soft target) in one kernel.

Why: a small DQN step is a chain of short kernels, each bound by its launch, not its work. The
population's torch learn step of the cartpole network runs some 80 launches (forwards, the loss's
elementwise ops and reductions, the backward's GEMMs and masks, the gradient norms, one Adam
kernel a tensor; ``gper bench train-step --population``), so its cost is the chain's length, not
the agents' arithmetic. Here one program per agent holds its batch, activations and gradients on
chip and runs all of it:

1. over the batch in chunks of ``BLOCK_B`` rows: the online network on ``x`` (activations kept),
   the target network (and, double-Q, the online network) on ``next_x``, the TD target
   ``y = r + gamma (1 - done) Q'(s', a')``, the TD error, the IS-weighted Huber loss (delta 1) and
   its gradient, then the backward through the three layers, each layer's gradient added up over
   the chunks; the TD errors are written for the priority update, the loss, mean Q and mean |TD|
   added to the agent's running sums;
2. the gradients' global 2-norm and ``clip_grad_norm_``'s scale ``min(1, max_norm / (norm + 1e-6))``;
3. Adam (:func:`gper.dqn.fused_adam.adam_update`, the single agent's and the population's Adam
   kernels' arithmetic) on each tensor with the agent's learning rate and advanced step count,
   and the soft target update (tau < 1) in the same pass.

It computes what :func:`gper.dqn.population_loss.population_loss`, ``clip_scales`` and
:class:`gper.dqn.population_adam.PopulationAdam` compute, to rounding: the sums run in another
order, and on the GPU the matmuls run at the precision asked for (TF32 or IEEE FP32), as cuBLAS's
do under PyTorch's TF32 switch. It serves networks of two hidden ReLU layers of at most
:data:`MAX_WIDTH` units (and inputs and actions of at most :data:`MAX_WIDTH`):
:func:`fused_learn_supported` says whether a network qualifies; larger ones take the torch ops.
"""

from __future__ import annotations

import math

import torch

from gper._triton import HAS_TRITON, tl, triton

#: the widest layer (hidden units, inputs, actions) the kernel holds on chip
MAX_WIDTH = 128
#: batch rows a chunk of the kernel's loop holds
BLOCK_B = 32
#: warps a program runs on
NUM_WARPS = 8
#: one stage: the loop's loads are not multi-buffered (pipelined, the weight tiles would need
#: several times the shared memory an SM has)
NUM_STAGES = 1


def fused_learn_supported(obs_dim: int, hidden: tuple[int, ...], n_actions: int) -> bool:
    """Whether :func:`population_learn_step` serves this architecture: two hidden layers, every width
    (inputs, hidden units, actions) at most :data:`MAX_WIDTH`."""
    return len(hidden) == 2 and max(obs_dim, n_actions, *hidden) <= MAX_WIDTH


def _padded(n: int) -> int:
    # tl.dot needs every dimension a power of two of at least 16
    return max(16, 1 << (n - 1).bit_length())


if HAS_TRITON:
    from gper.dqn.fused_adam import adam_update

    @triton.jit
    def _weight_t(w_ptr, agent, n_in, n_out, IN: tl.constexpr, OUT: tl.constexpr):
        """Agent ``agent``'s weight ``[n_out, n_in]`` (of ``[N, n_out, n_in]``) as ``W^T [IN, OUT]``, zero padded."""
        i = tl.arange(0, IN)[:, None]
        o = tl.arange(0, OUT)[None, :]
        return tl.load(w_ptr + agent * n_out * n_in + o * n_in + i, mask=(i < n_in) & (o < n_out), other=0.0)

    @triton.jit
    def _bias(b_ptr, agent, n_out, OUT: tl.constexpr):
        o = tl.arange(0, OUT)
        return tl.load(b_ptr + agent * n_out + o, mask=o < n_out, other=0.0)

    @triton.jit
    def _mlp(x, w1t, b1, w2t, b2, w3t, b3, PRECISION: tl.constexpr):
        """A network (its weights transposed, ``W^T [in, out]``, biases ``[out]``) on ``x [rows, in]``:
        both hidden activations and the Q-values (padded columns 0)."""
        a1 = tl.maximum(tl.dot(x, w1t, input_precision=PRECISION) + b1[None, :], 0.0)
        a2 = tl.maximum(tl.dot(a1, w2t, input_precision=PRECISION) + b2[None, :], 0.0)
        return a1, a2, tl.dot(a2, w3t, input_precision=PRECISION) + b3[None, :]

    @triton.jit
    def _adam_tile(
        p_ptr, m_ptr, v_ptr, t_ptr, g, agent, n_rows, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr,
        step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau, HAS_TARGET: tl.constexpr,
    ):  # fmt: skip
        """Adam on agent ``agent``'s ``[n_rows, n_cols]`` slice of a stacked tensor, gradient ``g [ROWS, COLS]``."""
        r = tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, COLS)[None, :]
        offs = agent * n_rows * n_cols + r * n_cols + c
        mask = (r < n_rows) & (c < n_cols)
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, offs, mask, g, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
            HAS_TARGET,
        )  # fmt: skip

    @triton.jit
    def _adam_vector(
        p_ptr, m_ptr, v_ptr, t_ptr, g, agent, n, N: tl.constexpr,
        step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau, HAS_TARGET: tl.constexpr,
    ):  # fmt: skip
        """Adam on agent ``agent``'s ``[n]`` slice of a stacked bias, gradient ``g [N]``."""
        o = tl.arange(0, N)
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, agent * n + o, o < n, g, step, lr, beta1, beta2, log2_beta1, log2_beta2,
            eps, tau, HAS_TARGET,
        )  # fmt: skip

    @triton.jit
    def _learn_kernel(
        x_ptr, nx_ptr, x_agent_stride, x_row_stride,  # [N, B, n_in] observations and next ones (columns contiguous)
        act_ptr, act_agent_stride, act_row_stride,  # [N, B] int64 actions
        rew_ptr, rew_agent_stride, rew_row_stride,  # [N, B] float32 rewards
        done_ptr, done_agent_stride, done_row_stride,  # [N, B] float32 termination flags
        wt_ptr,  # [N, B] float32 IS weights, contiguous
        gamma_ptr,  # [N] float32 discounts (GAMMA_PER_AGENT)
        w1, b1, w2, b2, w3, b3,  # online parameters (stacked, contiguous)
        tw1, tb1, tw2, tb2, tw3, tb3,  # target parameters
        mw1, mb1, mw2, mb2, mw3, mb3,  # Adam's first moments
        vw1, vb1, vw2, vb2, vw3, vb3,  # Adam's second moments
        steps_ptr,  # [N] float32 Adam step counts, advanced here
        lr_ptr,  # [N] float64 learning rates
        tau_ptr,  # [N] float32 target rates (TAU_PER_AGENT)
        td_ptr,  # [N, B] float32 TD errors, written
        sums_ptr,  # [N, 3] float64 running sums (loss, mean q, mean |td|), added to
        B, n_in, h1, h2, n_act,
        gamma, max_norm, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
        IN: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, A: tl.constexpr, BLOCK_B: tl.constexpr,
        DOUBLE_Q: tl.constexpr, GAMMA_PER_AGENT: tl.constexpr, CLIP: tl.constexpr, SOFT: tl.constexpr,
        TAU_PER_AGENT: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        agent = tl.program_id(0).to(tl.int64)
        rows = tl.arange(0, BLOCK_B)
        cols_in = tl.arange(0, IN)
        cols_a = tl.arange(0, A)
        real = cols_a[None, :] < n_act
        if GAMMA_PER_AGENT:
            g = tl.load(gamma_ptr + agent)
        else:
            g = gamma
        # Pass 1, the TD targets: y = r + gamma (1 - done) Q'(s', a') for every row, from the target
        # network (and, double-Q, the online one) on next_x, kept in the TD errors' row until pass 2.
        # Each pass loads its networks once: the chunks then run on chip.
        t1 = _weight_t(tw1, agent, n_in, h1, IN, H1)
        t2 = _weight_t(tw2, agent, h1, h2, H1, H2)
        t3 = _weight_t(tw3, agent, h2, n_act, H2, A)
        tc1, tc2, tc3 = _bias(tb1, agent, h1, H1), _bias(tb2, agent, h2, H2), _bias(tb3, agent, n_act, A)
        if DOUBLE_Q:
            o1 = _weight_t(w1, agent, n_in, h1, IN, H1)
            o2 = _weight_t(w2, agent, h1, h2, H1, H2)
            o3 = _weight_t(w3, agent, h2, n_act, H2, A)
            oc1, oc2, oc3 = _bias(b1, agent, h1, H1), _bias(b2, agent, h2, H2), _bias(b3, agent, n_act, A)
        for start in range(0, B, BLOCK_B):
            r = start + rows
            live = r < B
            m_in = live[:, None] & (cols_in[None, :] < n_in)
            nx = tl.load(nx_ptr + agent * x_agent_stride + r[:, None] * x_row_stride + cols_in[None, :], mask=m_in,
                         other=0.0)  # fmt: skip
            _, _, qt = _mlp(nx, t1, tc1, t2, tc2, t3, tc3, PRECISION)
            if DOUBLE_Q:  # a' = the online network's argmax (the first of equal maxima), valued by the target
                _, _, qo = _mlp(nx, o1, oc1, o2, oc2, o3, oc3, PRECISION)
                best = tl.argmax(tl.where(real, qo, float("-inf")), axis=1)
                next_q = tl.sum(tl.where(cols_a[None, :] == best[:, None], qt, 0.0), axis=1)
            else:
                next_q = tl.max(tl.where(real, qt, float("-inf")), axis=1)
            reward = tl.load(rew_ptr + agent * rew_agent_stride + r * rew_row_stride, mask=live, other=0.0)
            done = tl.load(done_ptr + agent * done_agent_stride + r * done_row_stride, mask=live, other=0.0)
            tl.store(td_ptr + agent * B + r, reward + (g * (1.0 - done)) * next_q, mask=live)
        tl.debug_barrier()  # pass 2's threads read the targets other threads of this program wrote
        # Pass 2: the online network on x, the loss, and the backward in transposed form
        # (d a^T = W^T d z^T), so every product reads the weights as loaded, W^T [in, out].
        w1t = _weight_t(w1, agent, n_in, h1, IN, H1)
        w2t = _weight_t(w2, agent, h1, h2, H1, H2)
        w3t = _weight_t(w3, agent, h2, n_act, H2, A)
        c1, c2, c3 = _bias(b1, agent, h1, H1), _bias(b2, agent, h2, H2), _bias(b3, agent, n_act, A)
        gw1 = tl.zeros((H1, IN), dtype=tl.float32)
        gb1 = tl.zeros((H1,), dtype=tl.float32)
        gw2 = tl.zeros((H2, H1), dtype=tl.float32)
        gb2 = tl.zeros((H2,), dtype=tl.float32)
        gw3 = tl.zeros((A, H2), dtype=tl.float32)
        gb3 = tl.zeros((A,), dtype=tl.float32)
        loss_sum = tl.zeros((BLOCK_B,), dtype=tl.float32)
        q_sum = tl.zeros((BLOCK_B,), dtype=tl.float32)
        td_sum = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for start in range(0, B, BLOCK_B):
            r = start + rows
            live = r < B
            m_in = live[:, None] & (cols_in[None, :] < n_in)
            x = tl.load(x_ptr + agent * x_agent_stride + r[:, None] * x_row_stride + cols_in[None, :], mask=m_in,
                        other=0.0)  # fmt: skip
            a1, a2, q = _mlp(x, w1t, c1, w2t, c2, w3t, c3, PRECISION)
            action = tl.load(act_ptr + agent * act_agent_stride + r * act_row_stride, mask=live, other=0)
            taken = cols_a[None, :] == action.to(tl.int32)[:, None]
            q_a = tl.sum(tl.where(taken, q, 0.0), axis=1)
            y = tl.load(td_ptr + agent * B + r, mask=live, other=0.0)
            weight = tl.load(wt_ptr + agent * B + r, mask=live, other=0.0)
            td = q_a - y
            abs_td = tl.abs(td)
            huber = tl.where(abs_td < 1.0, 0.5 * td * td, abs_td - 0.5)
            tl.store(td_ptr + agent * B + r, td, mask=live)
            loss_sum += tl.where(live, huber * weight, 0.0)
            q_sum += tl.where(live, q_a, 0.0)
            td_sum += tl.where(live, abs_td, 0.0)
            # d loss / d q[a] = w clamp(td, -1, 1) / B (the mean of the weighted Huber loss)
            d_qa = tl.where(live, weight * tl.minimum(tl.maximum(td, -1.0), 1.0) / B, 0.0)
            d_qt = tl.trans(tl.where(taken, d_qa[:, None], 0.0))  # [A, BLOCK_B]
            gb3 += tl.sum(d_qt, axis=1)
            gw3 = tl.dot(d_qt, a2, gw3, input_precision=PRECISION)
            d_a2t = tl.dot(w3t, d_qt, input_precision=PRECISION)  # [H2, BLOCK_B]
            d_a2t = tl.where(tl.trans(a2) > 0.0, d_a2t, 0.0)
            gb2 += tl.sum(d_a2t, axis=1)
            gw2 = tl.dot(d_a2t, a1, gw2, input_precision=PRECISION)
            d_a1t = tl.dot(w2t, d_a2t, input_precision=PRECISION)  # [H1, BLOCK_B]
            d_a1t = tl.where(tl.trans(a1) > 0.0, d_a1t, 0.0)
            gb1 += tl.sum(d_a1t, axis=1)
            gw1 = tl.dot(d_a1t, x, gw1, input_precision=PRECISION)
        sums = sums_ptr + agent * 3
        tl.store(sums, tl.load(sums) + (tl.sum(loss_sum, axis=0) / B).to(tl.float64))
        tl.store(sums + 1, tl.load(sums + 1) + (tl.sum(q_sum, axis=0) / B).to(tl.float64))
        tl.store(sums + 2, tl.load(sums + 2) + (tl.sum(td_sum, axis=0) / B).to(tl.float64))
        if CLIP:  # clip_grad_norm_: every gradient scaled by min(1, max_norm / (global norm + 1e-6))
            sq = tl.sum(tl.sum(gw1 * gw1, axis=1), axis=0) + tl.sum(gb1 * gb1, axis=0)
            sq += tl.sum(tl.sum(gw2 * gw2, axis=1), axis=0) + tl.sum(gb2 * gb2, axis=0)
            sq += tl.sum(tl.sum(gw3 * gw3, axis=1), axis=0) + tl.sum(gb3 * gb3, axis=0)
            scale = tl.minimum(max_norm / (tl.sqrt(sq) + 1e-6), 1.0)
            gw1 *= scale
            gb1 *= scale
            gw2 *= scale
            gb2 *= scale
            gw3 *= scale
            gb3 *= scale
        step = tl.load(steps_ptr + agent) + 1.0
        tl.store(steps_ptr + agent, step)
        lr = tl.load(lr_ptr + agent).to(tl.float32)
        if TAU_PER_AGENT:
            rate = tl.load(tau_ptr + agent)
        else:
            rate = tau
        _adam_tile(w1, mw1, vw1, tw1, gw1, agent, h1, n_in, H1, IN, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                   eps, rate, SOFT)  # fmt: skip
        _adam_vector(b1, mb1, vb1, tb1, gb1, agent, h1, H1, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps,
                     rate, SOFT)  # fmt: skip
        _adam_tile(w2, mw2, vw2, tw2, gw2, agent, h2, h1, H2, H1, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                   eps, rate, SOFT)  # fmt: skip
        _adam_vector(b2, mb2, vb2, tb2, gb2, agent, h2, H2, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps,
                     rate, SOFT)  # fmt: skip
        _adam_tile(w3, mw3, vw3, tw3, gw3, agent, n_act, h2, A, H2, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                   eps, rate, SOFT)  # fmt: skip
        _adam_vector(b3, mb3, vb3, tb3, gb3, agent, n_act, A, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps,
                     rate, SOFT)  # fmt: skip


def population_learn_step(
    params: list[torch.Tensor],
    targets: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: torch.Tensor,
    lr: torch.Tensor,
    x: torch.Tensor,
    next_x: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    weights: torch.Tensor,
    sums: torch.Tensor,
    td: torch.Tensor,
    *,
    gamma: float | torch.Tensor,
    double_q: bool,
    max_grad_norm: float,
    soft_tau: float | torch.Tensor | None,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    precision: str = "ieee",
) -> None:
    """One learn step of N agents in one launch: loss, gradients, clipping, Adam and soft target update.

    Args:
        params: the online networks' stacked parameters in :class:`~gper.dqn.population_net.StackedQNetwork`'s
            order (weight ``[N, out, in]``, bias ``[N, out]``, three layers), contiguous float32; updated.
        targets: the target networks' parameters, same shapes: read for the TD target, and moved
            towards the updated parameters by ``soft_tau`` when it is given.
        exp_avgs, exp_avg_sqs: Adam's moments, same shapes; updated.
        steps: [N] float32 Adam step counts on the device, advanced by 1 (as ``torch.optim.Adam``).
        lr: [N] float64 learning rates on the device.
        x, next_x: [N, B, obs_dim] float32 observations (rows may be strided, columns contiguous,
            both with the same strides).
        action: [N, B] int64; reward, done, weights: [N, B] float32 (rewards, termination flags,
            IS weights); any strides (the sampled rows' fields), except ``weights``: contiguous.
        sums: [N, 3] float64, each agent's (loss, mean q[a], mean |td|) added to it.
        td: [N, B] float32, the TD errors ``q[a] - y`` written to it.
        gamma: the discount, one float or [N] float32 on the device.
        double_q: ``a'`` is the online network's argmax on ``next_x`` (else the target's max).
        max_grad_norm: clip each agent's gradients to this global 2-norm (0: no clipping).
        soft_tau: the soft target update's rate (one float, or [N] float32 on the device); None:
            no target update (a hard one runs elsewhere).
        beta1, beta2, eps: Adam's settings.
        precision: the matmuls' input precision on the GPU, ``"tf32"`` or ``"ieee"`` (FP32).
    """
    if not HAS_TRITON:
        raise RuntimeError("population_learn_step needs Triton (pip install triton)")
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision must be tf32 or ieee, got {precision!r}")
    groups = {"params": params, "targets": targets, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    if any(len(g) != 6 for g in groups.values()):
        raise ValueError(f"population_learn_step needs 6 tensors each, got { {k: len(v) for k, v in groups.items()} }")
    n, b, n_in = x.shape
    h1, h2, n_act = params[0].shape[1], params[2].shape[1], params[4].shape[1]
    expected = [(n, h1, n_in), (n, h1), (n, h2, h1), (n, h2), (n, n_act, h2), (n, n_act)]
    for name, group in groups.items():
        for t, shape in zip(group, expected, strict=True):
            if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"{name}: needs contiguous float32 tensors of shapes {expected}, got {tuple(t.shape)}")
    if not fused_learn_supported(n_in, (h1, h2), n_act):
        raise ValueError(f"population_learn_step serves widths up to {MAX_WIDTH}, got {(n_in, h1, h2, n_act)}")
    if next_x.shape != x.shape or next_x.stride() != x.stride() or x.stride(2) != 1:
        raise ValueError("x and next_x must have one shape and one stride, with contiguous columns")
    for name, t in (("action", action), ("reward", reward), ("done", done), ("weights", weights), ("td", td)):
        if tuple(t.shape) != (n, b) or (name in ("weights", "td") and not t.is_contiguous()):
            raise ValueError(f"{name} must be a [{n}, {b}] tensor (weights and td contiguous), got {tuple(t.shape)}")
    if action.dtype != torch.int64 or td.dtype != torch.float32:
        raise ValueError(f"action must be int64 and td float32, got {action.dtype} and {td.dtype}")
    if tuple(sums.shape) != (n, 3) or sums.dtype != torch.float64 or not sums.is_contiguous():
        raise ValueError(f"sums must be a contiguous [{n}, 3] float64 tensor, got {tuple(sums.shape)} {sums.dtype}")
    gamma_t = gamma if isinstance(gamma, torch.Tensor) else None
    tau_t = soft_tau if isinstance(soft_tau, torch.Tensor) else None
    _learn_kernel[(n,)](
        x, next_x, x.stride(0), x.stride(1), action, *action.stride(), reward, *reward.stride(),
        done, *done.stride(), weights,
        gamma_t.reshape(-1) if gamma_t is not None else steps,
        *params, *targets, *exp_avgs, *exp_avg_sqs,
        steps, lr, tau_t if tau_t is not None else steps, td, sums,
        b, n_in, h1, h2, n_act,
        0.0 if gamma_t is not None else float(gamma), float(max_grad_norm), beta1, beta2,
        math.log2(beta1), math.log2(beta2), eps, float(soft_tau) if soft_tau is not None and tau_t is None else 0.0,
        IN=_padded(n_in), H1=_padded(h1), H2=_padded(h2), A=_padded(n_act), BLOCK_B=BLOCK_B,
        DOUBLE_Q=double_q, GAMMA_PER_AGENT=gamma_t is not None, CLIP=max_grad_norm > 0, SOFT=soft_tau is not None,
        TAU_PER_AGENT=tau_t is not None, PRECISION=precision, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )  # fmt: skip
