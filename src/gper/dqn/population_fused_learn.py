"""A population's whole learn step (forwards, loss, backward, clipping, Adam, soft target) in two or three kernels.

Why: a small DQN step is a chain of short kernels, each bound by its launch, not its work. The
population's torch learn step of the cartpole network runs some 80 launches (forwards, the loss's
elementwise ops and reductions, the backward's GEMMs and masks, the gradient norms, one Adam
kernel a tensor; ``gper bench train-step --population``), so its cost is the chain's length, not
the agents' arithmetic. Here two launches run all of it, three with gradient clipping:

1. **gradients**, one program per agent and chunk of ``BLOCK_B`` batch rows, activations on chip:
   the target network (and, double-Q, the online network) on ``next_x`` for the TD target
   ``y = r + gamma (1 - done) Q'(s', a')``, the online network on ``x``, the TD error, the
   IS-weighted Huber loss (delta 1; or the squared error) and its gradient, then the backward through
   the three layers; each program writes its rows' TD errors (for the priority update) and its
   chunk's gradient and loss sums to a scratch buffer, and each agent's first program advances its
   Adam step count. A program per chunk rather than per agent keeps the GPU busy when the agents
   are few (a program alone walks its chunks one after the other);
2. **reduce**, with clipping only: each agent's gradient as the sum of its chunks' (in chunk order:
   deterministic) and the squares' partial sums for the norm, which needs the whole gradient before
   any parameter moves;
3. **adam**, one program a block of one parameter tensor: the gradient (the chunks' sum in the same
   order, or the reduce kernel's), ``clip_grad_norm_``'s scale ``min(1, max_norm / (norm + 1e-6))``
   from the global 2-norm, then Adam (:func:`gper.dqn.fused_adam.adam_update`, the single agent's
   and the population's Adam kernels' arithmetic) with the agent's learning rate and step count, and
   the soft target update (tau < 1) in the same pass; each agent's first program adds the running
   sums (loss, mean Q, mean |TD|).

It computes what :func:`gper.dqn.population_loss.population_loss`, ``clip_scales`` and
:class:`gper.dqn.population_adam.PopulationAdam` compute, to rounding: the sums run in another
order, and on the GPU the matmuls run at the precision asked for (TF32 or IEEE FP32), as cuBLAS's
do under PyTorch's TF32 switch. It serves networks of two hidden ReLU layers of at most
:data:`MAX_WIDTH` units (and inputs and actions of at most :data:`MAX_WIDTH`):
:func:`fused_learn_supported` says whether a network qualifies; larger ones take the torch ops.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gper._triton import HAS_TRITON, tl, triton
from gper.dqn.fused_loss import check_loss

#: the widest layer (hidden units, inputs, actions) the kernel holds on chip
MAX_WIDTH = 128
#: batch rows a gradient program holds while its grid is small: a program per 32 rows spreads a few
#: agents' work over more of the GPU
BLOCK_B = 32
#: batch rows a gradient program holds once a grid of them still fills every multiprocessor: half
#: the programs, each loading its agent's weights once for twice the rows, and half the chunks'
#: gradients to sum (357 against 473 µs a call at 256 agents of batch 256 and a 128-128 network on
#: an H200, 178 against 201 at batch 128 and 120-84, no graph:
#: ``benchmarks/results/fused-learn-kernel-nvidia-h200-20261204-213658.md``)
BLOCK_B_WIDE = 64
#: warps a gradient program runs on
NUM_WARPS = 8
#: parameters a reduce or adam program handles
BLOCK_P = 1024


def fused_learn_supported(obs_dim: int, hidden: tuple[int, ...], n_actions: int) -> bool:
    """Whether :func:`population_learn_step` serves this architecture: two hidden layers, every width
    (inputs, hidden units, actions) at most :data:`MAX_WIDTH`."""
    return len(hidden) == 2 and max(obs_dim, n_actions, *hidden) <= MAX_WIDTH


def block_rows(n_agents: int, batch: int, device: torch.device) -> int:
    """The batch rows of a gradient program: :data:`BLOCK_B_WIDE` where ``n_agents`` times the
    batch's chunks of that many rows is at least the GPU's multiprocessors, else :data:`BLOCK_B`."""
    if device.type != "cuda":
        return BLOCK_B
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return BLOCK_B_WIDE if n_agents * triton.cdiv(batch, BLOCK_B_WIDE) >= sms else BLOCK_B


def _padded(n: int) -> int:
    # tl.dot needs every dimension a power of two of at least 16
    return max(16, 1 << (n - 1).bit_length())


if HAS_TRITON:
    from gper.dqn.fused_adam import adam_update

    @triton.jit
    def load_weight_t(w_ptr, agent, n_in, n_out, IN: tl.constexpr, OUT: tl.constexpr):
        """Agent ``agent``'s weight ``[n_out, n_in]`` (of ``[N, n_out, n_in]``) as ``W^T [IN, OUT]``, zero padded."""
        i = tl.arange(0, IN)[:, None]
        o = tl.arange(0, OUT)[None, :]
        return tl.load(w_ptr + agent * n_out * n_in + o * n_in + i, mask=(i < n_in) & (o < n_out), other=0.0)

    @triton.jit
    def load_bias(b_ptr, agent, n_out, OUT: tl.constexpr):
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
    def _store_tile(ptr, g, n_rows, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
        r = tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, COLS)[None, :]
        tl.store(ptr + r * n_cols + c, g, mask=(r < n_rows) & (c < n_cols))

    @triton.jit
    def _grad_kernel(
        x_ptr, nx_ptr, x_agent_stride, x_row_stride,  # [N, B, n_in] observations and next ones (columns contiguous)
        act_ptr, act_agent_stride, act_row_stride,  # [N, B] int64 actions
        rew_ptr, rew_agent_stride, rew_row_stride,  # [N, B] float32 rewards
        done_ptr, done_agent_stride, done_row_stride,  # [N, B] float32 termination flags
        wt_ptr,  # [N, B] float32 IS weights, contiguous
        gamma_ptr,  # [N] float32 discounts (GAMMA_PER_AGENT)
        w1, b1, w2, b2, w3, b3,  # online parameters (stacked, contiguous)
        tw1, tb1, tw2, tb2, tw3, tb3,  # target parameters
        td_ptr,  # [N, B] float32 TD errors, written
        part_ptr,  # [N, C, P] float32: each chunk's gradient, written (P: an agent's parameters, flat)
        psum_ptr,  # [N, C, 3] float32: each chunk's loss, q[a] and |td| sums, written
        steps_ptr,  # [N] float32 Adam step counts, advanced by each agent's first chunk (read by the adam kernel)
        B, n_in, h1, h2, n_act, P,
        gamma,
        IN: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, A: tl.constexpr, BLOCK_B: tl.constexpr,
        DOUBLE_Q: tl.constexpr, GAMMA_PER_AGENT: tl.constexpr, PRECISION: tl.constexpr, MSE: tl.constexpr,
    ):  # fmt: skip
        agent = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        n_chunks = tl.num_programs(1)
        r = chunk * BLOCK_B + tl.arange(0, BLOCK_B)
        live = r < B
        cols_in = tl.arange(0, IN)
        cols_a = tl.arange(0, A)
        real = cols_a[None, :] < n_act
        m_in = live[:, None] & (cols_in[None, :] < n_in)
        at_x = agent * x_agent_stride + r[:, None] * x_row_stride + cols_in[None, :]
        if GAMMA_PER_AGENT:
            g = tl.load(gamma_ptr + agent)
        else:
            g = gamma
        # the TD targets: the target network (and, double-Q, the online one) on next_x
        nx = tl.load(nx_ptr + at_x, mask=m_in, other=0.0)
        _, _, qt = _mlp(
            nx, load_weight_t(tw1, agent, n_in, h1, IN, H1), load_bias(tb1, agent, h1, H1),
            load_weight_t(tw2, agent, h1, h2, H1, H2), load_bias(tb2, agent, h2, H2),
            load_weight_t(tw3, agent, h2, n_act, H2, A), load_bias(tb3, agent, n_act, A), PRECISION,
        )  # fmt: skip
        w1t = load_weight_t(w1, agent, n_in, h1, IN, H1)
        w2t = load_weight_t(w2, agent, h1, h2, H1, H2)
        w3t = load_weight_t(w3, agent, h2, n_act, H2, A)
        c1, c2, c3 = load_bias(b1, agent, h1, H1), load_bias(b2, agent, h2, H2), load_bias(b3, agent, n_act, A)
        if DOUBLE_Q:  # a' = the online network's argmax (the first of equal maxima), valued by the target
            _, _, qo = _mlp(nx, w1t, c1, w2t, c2, w3t, c3, PRECISION)
            best = tl.argmax(tl.where(real, qo, float("-inf")), axis=1)
            next_q = tl.sum(tl.where(cols_a[None, :] == best[:, None], qt, 0.0), axis=1)
        else:
            next_q = tl.max(tl.where(real, qt, float("-inf")), axis=1)
        reward = tl.load(rew_ptr + agent * rew_agent_stride + r * rew_row_stride, mask=live, other=0.0)
        done = tl.load(done_ptr + agent * done_agent_stride + r * done_row_stride, mask=live, other=0.0)
        y = reward + (g * (1.0 - done)) * next_q
        # the online network on x, the loss, and the backward in transposed form (d a^T = W^T d z^T),
        # so every product reads the weights as loaded, W^T [in, out]
        x = tl.load(x_ptr + at_x, mask=m_in, other=0.0)
        a1, a2, q = _mlp(x, w1t, c1, w2t, c2, w3t, c3, PRECISION)
        action = tl.load(act_ptr + agent * act_agent_stride + r * act_row_stride, mask=live, other=0)
        taken = cols_a[None, :] == action.to(tl.int32)[:, None]
        q_a = tl.sum(tl.where(taken, q, 0.0), axis=1)
        weight = tl.load(wt_ptr + agent * B + r, mask=live, other=0.0)
        td = q_a - y
        abs_td = tl.abs(td)
        if MSE:
            row_loss = td * td
        else:
            row_loss = tl.where(abs_td < 1.0, 0.5 * td * td, abs_td - 0.5)
        tl.store(td_ptr + agent * B + r, td, mask=live)
        psum = psum_ptr + (agent * n_chunks + chunk) * 3
        tl.store(psum, tl.sum(tl.where(live, row_loss * weight, 0.0), axis=0))
        tl.store(psum + 1, tl.sum(tl.where(live, q_a, 0.0), axis=0))
        tl.store(psum + 2, tl.sum(tl.where(live, abs_td, 0.0), axis=0))
        # d loss / d q[a] = w clamp(td, -1, 1) / B (the mean of the weighted Huber loss), 2 w td / B
        # for the squared error
        if MSE:
            slope = 2.0 * td
        else:
            slope = tl.minimum(tl.maximum(td, -1.0), 1.0)
        d_qa = tl.where(live, weight * slope / B, 0.0)
        d_qt = tl.trans(tl.where(taken, d_qa[:, None], 0.0))  # [A, BLOCK_B]
        d_a2t = tl.dot(w3t, d_qt, input_precision=PRECISION)  # [H2, BLOCK_B]
        d_a2t = tl.where(tl.trans(a2) > 0.0, d_a2t, 0.0)
        d_a1t = tl.dot(w2t, d_a2t, input_precision=PRECISION)  # [H1, BLOCK_B]
        d_a1t = tl.where(tl.trans(a1) > 0.0, d_a1t, 0.0)
        # this chunk's gradient, flat in the parameters' order: W1, b1, W2, b2, W3, b3
        part = part_ptr + (agent * n_chunks + chunk) * P
        _store_tile(part, tl.dot(d_a1t, x, input_precision=PRECISION), h1, n_in, H1, IN)
        part += h1 * n_in
        o1 = tl.arange(0, H1)
        tl.store(part + o1, tl.sum(d_a1t, axis=1), mask=o1 < h1)
        part += h1
        _store_tile(part, tl.dot(d_a2t, a1, input_precision=PRECISION), h2, h1, H2, H1)
        part += h2 * h1
        o2 = tl.arange(0, H2)
        tl.store(part + o2, tl.sum(d_a2t, axis=1), mask=o2 < h2)
        part += h2
        _store_tile(part, tl.dot(d_qt, a2, input_precision=PRECISION), n_act, h2, A, H2)
        part += n_act * h2
        tl.store(part + cols_a, tl.sum(d_qt, axis=1), mask=cols_a < n_act)
        if chunk == 0:  # no program of this kernel reads the count: the adam kernel, after it, does
            tl.store(steps_ptr + agent, tl.load(steps_ptr + agent) + 1.0)

    @triton.jit
    def _reduce_kernel(
        part_ptr,  # [N, C, P] float32 the chunks' gradients
        grad_ptr,  # [N, P] float32 each agent's gradient, written
        sq_ptr,  # [N, n_blocks] float32 the squares' sum of each block of the gradient, written
        P,
        C,
        BLOCK_P: tl.constexpr,
    ):
        agent = tl.program_id(0).to(tl.int64)
        block = tl.program_id(1)
        offs = block * BLOCK_P + tl.arange(0, BLOCK_P)
        mask = offs < P
        grad = tl.zeros((BLOCK_P,), dtype=tl.float32)
        for c in range(0, C):
            grad += tl.load(part_ptr + (agent * C + c) * P + offs, mask=mask, other=0.0)
        tl.store(grad_ptr + agent * P + offs, grad, mask=mask)
        tl.store(sq_ptr + agent * tl.num_programs(1) + block, tl.sum(grad * grad, axis=0))

    @triton.jit
    def _adam_tensor(
        src_ptr, C, P, start, p_ptr, m_ptr, v_ptr, t_ptr, n, block, agent, scale,
        step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
        BLOCK_P: tl.constexpr, CLIP: tl.constexpr, HAS_TARGET: tl.constexpr,
    ):  # fmt: skip
        """Adam on block ``block`` of one parameter tensor of ``n`` elements an agent, whose gradient
        sits at ``[start, start + n)`` of the agent's flat gradient: the sum of its ``C`` chunks'
        (in chunk order, the reduce kernel's), scaled by the clipping's ``scale`` (CLIP)."""
        local = block * BLOCK_P + tl.arange(0, BLOCK_P)
        mask = local < n
        g = tl.zeros((BLOCK_P,), dtype=tl.float32)
        for c in range(0, C):
            g += tl.load(src_ptr + (agent * C + c) * P + start + local, mask=mask, other=0.0)
        if CLIP:
            g = g * scale
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, agent * n + local, mask, g, step, lr, beta1, beta2, log2_beta1, log2_beta2,
            eps, tau, HAS_TARGET,
        )  # fmt: skip

    @triton.jit
    def _adam_kernel(
        src_ptr, C,  # [N, C, P] the chunks' gradients, summed here (C = 1: the reduce kernel's sums)
        sq_ptr, n_sq,  # [N, n_sq] the squares' sums of the gradient's blocks (CLIP)
        psum_ptr, C_SUM, sums_ptr, B,  # [N, C_SUM, 3] the chunks' loss sums; [N, 3] float64 running sums
        w1, b1, w2, b2, w3, b3,  # online parameters, updated
        tw1, tb1, tw2, tb2, tw3, tb3,  # target parameters (SOFT: moved towards the new ones)
        mw1, mb1, mw2, mb2, mw3, mb3,  # Adam's first moments
        vw1, vb1, vw2, vb2, vw3, vb3,  # Adam's second moments
        steps_ptr, lr_ptr, tau_ptr,  # [N] step counts (already advanced), float64 learning rates, float32 rates
        n_in, h1, h2, n_act, P,
        max_norm, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
        BLOCK_P: tl.constexpr, N_SQ: tl.constexpr, C_BLOCK: tl.constexpr, CLIP: tl.constexpr,
        SOFT: tl.constexpr, TAU_PER_AGENT: tl.constexpr,
    ):  # fmt: skip
        # one program a block of one parameter tensor: plain contiguous loads and stores, none masked
        # off for another tensor's elements
        agent = tl.program_id(0).to(tl.int64)
        pid = tl.program_id(1)
        if pid == 0:  # the running sums, once an agent: the means over the batch of its chunks' sums
            cs = tl.arange(0, C_BLOCK)
            psum = psum_ptr + (agent * C_SUM + cs) * 3
            loss = tl.sum(tl.load(psum, mask=cs < C_SUM, other=0.0), axis=0)
            q = tl.sum(tl.load(psum + 1, mask=cs < C_SUM, other=0.0), axis=0)
            td = tl.sum(tl.load(psum + 2, mask=cs < C_SUM, other=0.0), axis=0)
            sums = sums_ptr + agent * 3
            tl.store(sums, tl.load(sums) + (loss / B).to(tl.float64))
            tl.store(sums + 1, tl.load(sums + 1) + (q / B).to(tl.float64))
            tl.store(sums + 2, tl.load(sums + 2) + (td / B).to(tl.float64))
        scale = 1.0
        if CLIP:  # clip_grad_norm_: every gradient scaled by min(1, max_norm / (global norm + 1e-6))
            blocks = tl.arange(0, N_SQ)
            sq = tl.load(sq_ptr + agent * n_sq + blocks, mask=blocks < n_sq, other=0.0)
            scale = tl.minimum(max_norm / (tl.sqrt(tl.sum(sq, axis=0)) + 1e-6), 1.0)
        step = tl.load(steps_ptr + agent)
        lr = tl.load(lr_ptr + agent).to(tl.float32)
        if TAU_PER_AGENT:
            rate = tl.load(tau_ptr + agent)
        else:
            rate = tau
        n1, n3, n5 = h1 * n_in, h2 * h1, n_act * h2
        e1 = tl.cdiv(n1, BLOCK_P)
        e2 = e1 + tl.cdiv(h1, BLOCK_P)
        e3 = e2 + tl.cdiv(n3, BLOCK_P)
        e4 = e3 + tl.cdiv(h2, BLOCK_P)
        e5 = e4 + tl.cdiv(n5, BLOCK_P)
        if pid < e1:
            _adam_tensor(src_ptr, C, P, 0, w1, mw1, vw1, tw1, n1, pid, agent, scale, step, lr, beta1, beta2,
                         log2_beta1, log2_beta2, eps, rate, BLOCK_P, CLIP, SOFT)  # fmt: skip
        elif pid < e2:
            _adam_tensor(src_ptr, C, P, n1, b1, mb1, vb1, tb1, h1, pid - e1, agent, scale, step, lr, beta1, beta2,
                         log2_beta1, log2_beta2, eps, rate, BLOCK_P, CLIP, SOFT)  # fmt: skip
        elif pid < e3:
            _adam_tensor(src_ptr, C, P, n1 + h1, w2, mw2, vw2, tw2, n3, pid - e2, agent, scale, step, lr, beta1,
                         beta2, log2_beta1, log2_beta2, eps, rate, BLOCK_P, CLIP, SOFT)  # fmt: skip
        elif pid < e4:
            _adam_tensor(src_ptr, C, P, n1 + h1 + n3, b2, mb2, vb2, tb2, h2, pid - e3, agent, scale, step, lr,
                         beta1, beta2, log2_beta1, log2_beta2, eps, rate, BLOCK_P, CLIP, SOFT)  # fmt: skip
        elif pid < e5:
            _adam_tensor(src_ptr, C, P, n1 + h1 + n3 + h2, w3, mw3, vw3, tw3, n5, pid - e4, agent, scale, step, lr,
                         beta1, beta2, log2_beta1, log2_beta2, eps, rate, BLOCK_P, CLIP, SOFT)  # fmt: skip
        else:
            _adam_tensor(src_ptr, C, P, n1 + h1 + n3 + h2 + n5, b3, mb3, vb3, tb3, n_act, pid - e5, agent, scale,
                         step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, rate, BLOCK_P, CLIP, SOFT)  # fmt: skip


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
    loss: str = "huber",
    rows: int | None = None,
    num_warps: int | None = None,
) -> None:
    """One learn step of N agents in two launches (three with clipping): loss, gradients, clipping, Adam
    and soft target update.

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
        loss: ``"huber"`` (delta 1) or ``"mse"`` (:data:`gper.dqn.fused_loss.LOSSES`).
        rows: batch rows a gradient program holds, a power of two of at least 16; None:
            :func:`block_rows`'s choice.
        num_warps: warps a gradient program runs on; None: :data:`NUM_WARPS`.
    """
    if not HAS_TRITON:
        raise RuntimeError("population_learn_step needs Triton (pip install triton)")
    if rows is not None and (rows < 16 or rows & (rows - 1)):
        raise ValueError(f"rows must be a power of two of at least 16, got {rows}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps}")
    check_loss(loss)
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
    total = sum(p[0].numel() for p in params)  # an agent's parameters
    block_b = rows if rows is not None else block_rows(n, b, x.device)
    chunks = triton.cdiv(b, block_b)
    part = torch.empty(n, chunks, total, device=x.device)
    psum = torch.empty(n, chunks, 3, device=x.device)
    unread = torch.empty(1, device=x.device)  # the pointer of an input a kernel's flags leave unread
    _grad_kernel[(n, chunks)](
        x, next_x, x.stride(0), x.stride(1), action, *action.stride(), reward, *reward.stride(),
        done, *done.stride(), weights, gamma_t.reshape(-1) if gamma_t is not None else unread,
        *params, *targets, td, part, psum, steps,
        b, n_in, h1, h2, n_act, total, 0.0 if gamma_t is not None else float(gamma),
        IN=_padded(n_in), H1=_padded(h1), H2=_padded(h2), A=_padded(n_act), BLOCK_B=block_b,
        DOUBLE_Q=double_q, GAMMA_PER_AGENT=gamma_t is not None, PRECISION=precision, MSE=loss == "mse",
        num_warps=NUM_WARPS if num_warps is None else num_warps,
    )  # fmt: skip
    clip = max_grad_norm > 0
    src, src_chunks, n_sq = part, chunks, 1
    sq = unread
    if clip:  # the norm needs each agent's whole gradient first: the chunks summed in a pass of their own
        n_sq = triton.cdiv(total, BLOCK_P)
        src, src_chunks = torch.empty(n, 1, total, device=x.device), 1
        sq = torch.empty(n, n_sq, device=x.device)
        _reduce_kernel[(n, n_sq)](part, src, sq, total, chunks, BLOCK_P=BLOCK_P)
    sizes = (h1 * n_in, h1, h2 * h1, h2, n_act * h2, n_act)
    tensor_blocks = sum(triton.cdiv(k, BLOCK_P) for k in sizes)
    _adam_kernel[(n, tensor_blocks)](
        src, src_chunks, sq, n_sq, psum, chunks, sums, b,
        *params, *targets, *exp_avgs, *exp_avg_sqs, steps, lr, tau_t if tau_t is not None else unread,
        n_in, h1, h2, n_act, total, float(max_grad_norm), beta1, beta2, math.log2(beta1), math.log2(beta2), eps,
        float(soft_tau) if soft_tau is not None and tau_t is None else 0.0,
        BLOCK_P=BLOCK_P, N_SQ=max(2, triton.next_power_of_2(n_sq)), C_BLOCK=max(2, triton.next_power_of_2(chunks)),
        CLIP=clip, SOFT=soft_tau is not None, TAU_PER_AGENT=tau_t is not None,
    )  # fmt: skip


def adam_learn_step(
    params: list[torch.Tensor],
    targets: list[torch.Tensor],
    optimizer: torch.optim.Adam,
    lr: torch.Tensor,
    x: torch.Tensor,
    next_x: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    weights: torch.Tensor,
    sums: torch.Tensor,
    td: torch.Tensor,
    **settings: Any,
) -> None:
    """:func:`population_learn_step` for one network (its parameters ``[out, in]`` and ``[out]``, a
    batch ``[B, ...]``, ``sums`` ``[3]``, ``td`` ``[B]``) on ``optimizer``'s own state: a population
    of one, every tensor a view. ``lr``: [1] float64 on the device; the optimizer's step counts must
    be one tensor (:func:`gper.dqn.fused_adam.share_step_counts`), which the kernels advance once.
    ``settings``: :func:`population_learn_step`'s keywords but Adam's, which come from ``optimizer``."""
    from gper.dqn.fused_adam import adam_state

    _, exp_avgs, exp_avg_sqs, steps = adam_state(optimizer)
    group = optimizer.param_groups[0]
    beta1, beta2 = group["betas"]
    x, next_x = x.unsqueeze(0), next_x.unsqueeze(0)
    if next_x.stride() != x.stride() or x.stride(2) != 1:
        x, next_x = x.contiguous(), next_x.contiguous()
    one = lambda ts: [t.detach().unsqueeze(0) for t in ts]  # noqa: E731
    population_learn_step(
        one(params), one(targets), one(exp_avgs), one(exp_avg_sqs), steps[0].view(1), lr, x, next_x,
        action.unsqueeze(0), reward.unsqueeze(0), done.unsqueeze(0), weights.unsqueeze(0).contiguous(),
        sums.view(1, -1), td.view(1, -1), beta1=beta1, beta2=beta2, eps=group["eps"], **settings,
    )  # fmt: skip
