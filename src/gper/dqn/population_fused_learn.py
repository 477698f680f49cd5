"""A population's whole learn step (forwards, loss, backward, clipping, Adam, soft target) in one to three kernels.

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

Where the agents alone fill the GPU (:func:`agent_programs`), one launch runs it all instead, one
program an agent (:mod:`gper.dqn.population_agent_learn`): the same chunks, their gradients added on
chip in the same order, then the norm and Adam where the gradient already is.

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
#: agents a multiprocessor from which the learn step runs one program an agent (:func:`agent_programs`)
AGENT_PROGRAMS_PER_SM = 1
#: one program an agent sums its gradient in a scratch row rather than in registers
AGENT_SCRATCH = True
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


def agent_programs(n_agents: int, device: torch.device) -> bool:
    """Whether the learn step runs one program an agent (one launch, no gradient round trip through
    memory): where the agents alone fill the GPU, at least :data:`AGENT_PROGRAMS_PER_SM` programs a
    multiprocessor. Below that a program a chunk spreads each agent's batch over more of the GPU."""
    if device.type != "cuda":
        return False
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return n_agents >= AGENT_PROGRAMS_PER_SM * sms


def _padded(n: int) -> int:
    # tl.dot needs every dimension a power of two of at least 16
    return max(16, 1 << (n - 1).bit_length())


if HAS_TRITON:
    from gper.dqn.fused_adam import adam_update
    from gper.dqn.mlp_tiles import store_tile, td_gradients
    from gper.dqn.population_agent_learn import agent_learn_kernel

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
        if GAMMA_PER_AGENT:
            g = tl.load(gamma_ptr + agent)
        else:
            g = gamma
        gw1, gb1, gw2, gb2, gw3, gb3, loss_sum, q_sum, td_sum = td_gradients(
            x_ptr, nx_ptr, x_agent_stride, x_row_stride, act_ptr, act_agent_stride, act_row_stride,
            rew_ptr, rew_agent_stride, rew_row_stride, done_ptr, done_agent_stride, done_row_stride, wt_ptr, g,
            w1, b1, w2, b2, w3, b3, tw1, tb1, tw2, tb2, tw3, tb3, td_ptr, agent, chunk, B, n_in, h1, h2, n_act,
            IN, H1, H2, A, BLOCK_B, DOUBLE_Q, PRECISION, MSE,
        )  # fmt: skip
        psum = psum_ptr + (agent * n_chunks + chunk) * 3
        tl.store(psum, loss_sum)
        tl.store(psum + 1, q_sum)
        tl.store(psum + 2, td_sum)
        # this chunk's gradient, flat in the parameters' order: W1, b1, W2, b2, W3, b3
        part = part_ptr + (agent * n_chunks + chunk) * P
        store_tile(part, gw1, h1, n_in, H1, IN)
        part += h1 * n_in
        o1 = tl.arange(0, H1)
        tl.store(part + o1, gb1, mask=o1 < h1)
        part += h1
        store_tile(part, gw2, h2, h1, H2, H1)
        part += h2 * h1
        o2 = tl.arange(0, H2)
        tl.store(part + o2, gb2, mask=o2 < h2)
        part += h2
        store_tile(part, gw3, n_act, h2, A, H2)
        part += n_act * h2
        cols_a = tl.arange(0, A)
        tl.store(part + cols_a, gb3, mask=cols_a < n_act)
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
    per_agent: bool | None = None,
    scratch: bool = AGENT_SCRATCH,
) -> None:
    """One learn step of N agents in one launch (one program an agent) or two (a program a chunk of
    rows, then Adam; three with clipping): loss, gradients, clipping, Adam and soft target update.

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
        per_agent: one program an agent, walking its chunks of ``rows`` (default :data:`BLOCK_B_WIDE`)
            and running Adam on the sum it holds; False: a program a chunk; None:
            :func:`agent_programs`'s choice.
        scratch: one program an agent adds its chunks' gradients up in a scratch row in memory
            (cached) rather than in registers; the same sums either way.
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
    unread = torch.empty(1, device=x.device)  # the pointer of an input a kernel's flags leave unread
    if per_agent is None:
        per_agent = agent_programs(n, x.device)
    if per_agent:  # the whole step in one launch, one program an agent
        agent_learn_kernel[(n,)](
            x, next_x, x.stride(0), x.stride(1), action, *action.stride(), reward, *reward.stride(),
            done, *done.stride(), weights, gamma_t.reshape(-1) if gamma_t is not None else unread,
            *params, *targets, *exp_avgs, *exp_avg_sqs, td, sums,
            torch.empty(n, sum(p[0].numel() for p in params), device=x.device) if scratch else unread,
            steps, lr, tau_t if tau_t is not None else unread,
            b, n_in, h1, h2, n_act, 0.0 if gamma_t is not None else float(gamma), float(max_grad_norm),
            beta1, beta2, math.log2(beta1), math.log2(beta2), eps,
            float(soft_tau) if soft_tau is not None and tau_t is None else 0.0,
            IN=_padded(n_in), H1=_padded(h1), H2=_padded(h2), A=_padded(n_act),
            BLOCK_B=rows if rows is not None else BLOCK_B_WIDE, DOUBLE_Q=double_q,
            GAMMA_PER_AGENT=gamma_t is not None, PRECISION=precision, MSE=loss == "mse", CLIP=max_grad_norm > 0,
            SOFT=soft_tau is not None, TAU_PER_AGENT=tau_t is not None, SCRATCH=scratch,
            num_warps=NUM_WARPS if num_warps is None else num_warps,
        )  # fmt: skip
        return
    total = sum(p[0].numel() for p in params)  # an agent's parameters
    block_b = rows if rows is not None else block_rows(n, b, x.device)
    chunks = triton.cdiv(b, block_b)
    part = torch.empty(n, chunks, total, device=x.device)
    psum = torch.empty(n, chunks, 3, device=x.device)
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
