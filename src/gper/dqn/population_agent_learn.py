"""A population's whole learn step in one kernel, one program an agent: the forwards, the TD loss and
its backward over the agent's batch chunk by chunk, the gradient added up on chip, then the clipping's
norm, Adam and the soft target update on it.

Why: where the agents alone fill the GPU (256 agents on 132 multiprocessors), a program a chunk of
rows (:func:`gper.dqn.population_fused_learn.population_learn_step`'s other layout) gains no
parallelism, and its chunks' gradients make a round trip through memory (written by the gradient
programs, read back by the Adam kernel's) and a second launch. One program an agent loads its
weights, walks its chunks and updates its parameters where the gradient already is. Its arithmetic
is the chunked layout's: the same chunks (:func:`gper.dqn.mlp_tiles.td_gradients`), added in chunk
order, and the same Adam (:func:`gper.dqn.fused_adam.adam_update`).
"""

from __future__ import annotations

from gper._triton import HAS_TRITON, tl, triton

if HAS_TRITON:
    from gper.dqn.fused_adam import adam_update
    from gper.dqn.mlp_tiles import td_gradients

    @triton.jit
    def _add_tile(ptr, g, chunk, n_rows, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
        """``[n_rows, n_cols]`` at ``ptr`` (row-major) set to the tile ``g`` on chunk 0, else ``g`` added
        to it: the running sum in chunk order. Each thread rereads what it stored (one layout)."""
        r = tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, COLS)[None, :]
        at, mask = ptr + r * n_cols + c, (r < n_rows) & (c < n_cols)
        if chunk > 0:
            g = tl.load(at, mask=mask, other=0.0) + g
        tl.store(at, g, mask=mask)

    @triton.jit
    def _load_tile(ptr, n_rows, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
        r = tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, COLS)[None, :]
        return tl.load(ptr + r * n_cols + c, mask=(r < n_rows) & (c < n_cols), other=0.0)

    @triton.jit
    def _adam_tile(
        g, p_ptr, m_ptr, v_ptr, t_ptr, agent, n_rows, n_cols, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2,
        eps, tau, ROWS: tl.constexpr, COLS: tl.constexpr, CLIP: tl.constexpr, HAS_TARGET: tl.constexpr,
    ):  # fmt: skip
        """Adam on agent ``agent``'s weight ``[n_rows, n_cols]`` (of ``[N, n_rows, n_cols]``) from its
        gradient tile ``g [ROWS, COLS]``, scaled by the clipping's ``scale`` (CLIP)."""
        r = tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, COLS)[None, :]
        if CLIP:
            g = g * scale
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, agent * n_rows * n_cols + r * n_cols + c, (r < n_rows) & (c < n_cols), g,
            step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau, HAS_TARGET,
        )  # fmt: skip

    @triton.jit
    def _adam_vector(
        g, p_ptr, m_ptr, v_ptr, t_ptr, agent, n, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
        SIZE: tl.constexpr, CLIP: tl.constexpr, HAS_TARGET: tl.constexpr,
    ):  # fmt: skip
        """Adam on agent ``agent``'s bias ``[n]`` (of ``[N, n]``) from its gradient ``g [SIZE]``."""
        o = tl.arange(0, SIZE)
        if CLIP:
            g = g * scale
        adam_update(
            p_ptr, m_ptr, v_ptr, t_ptr, agent * n + o, o < n, g, step, lr, beta1, beta2, log2_beta1, log2_beta2,
            eps, tau, HAS_TARGET,
        )  # fmt: skip

    @triton.jit
    def agent_learn_kernel(
        x_ptr, nx_ptr, x_agent_stride, x_row_stride, act_ptr, act_agent_stride, act_row_stride,
        rew_ptr, rew_agent_stride, rew_row_stride, done_ptr, done_agent_stride, done_row_stride,
        wt_ptr, gamma_ptr,  # as _grad_kernel's
        w1, b1, w2, b2, w3, b3,  # online parameters, updated
        tw1, tb1, tw2, tb2, tw3, tb3,  # target parameters (SOFT: moved towards the new ones)
        mw1, mb1, mw2, mb2, mw3, mb3,  # Adam's first moments
        vw1, vb1, vw2, vb2, vw3, vb3,  # Adam's second moments
        td_ptr, sums_ptr,  # [N, B] float32 TD errors, written; [N, 3] float64 running sums
        scratch_ptr,  # [N, P] float32 each agent's gradient as it is summed (SCRATCH)
        steps_ptr, lr_ptr, tau_ptr,  # [N] step counts (advanced here), float64 learning rates, float32 rates
        B, n_in, h1, h2, n_act,
        gamma, max_norm, beta1, beta2, log2_beta1, log2_beta2, eps, tau,
        IN: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, A: tl.constexpr, BLOCK_B: tl.constexpr,
        DOUBLE_Q: tl.constexpr, GAMMA_PER_AGENT: tl.constexpr, PRECISION: tl.constexpr, MSE: tl.constexpr,
        CLIP: tl.constexpr, SOFT: tl.constexpr, TAU_PER_AGENT: tl.constexpr, SCRATCH: tl.constexpr,
    ):  # fmt: skip
        # one program an agent: its chunks one after the other, their gradients added on chip in chunk
        # order (the adam kernel's order), then the norm, Adam and the target update on them
        agent = tl.program_id(0).to(tl.int64)
        if GAMMA_PER_AGENT:
            g = tl.load(gamma_ptr + agent)
        else:
            g = gamma
        gw1 = tl.zeros((H1, IN), dtype=tl.float32)
        gb1 = tl.zeros((H1,), dtype=tl.float32)
        gw2 = tl.zeros((H2, H1), dtype=tl.float32)
        gb2 = tl.zeros((H2,), dtype=tl.float32)
        gw3 = tl.zeros((A, H2), dtype=tl.float32)
        gb3 = tl.zeros((A,), dtype=tl.float32)
        loss = 0.0
        q = 0.0
        abs_td = 0.0
        # the gradient's offsets in an agent's flat scratch row (SCRATCH): W1, b1, W2, b2, W3, b3
        o1, o2 = h1 * n_in, h1 * n_in + h1
        o3, o4 = o2 + h2 * h1, o2 + h2 * h1 + h2
        o5 = o4 + n_act * h2
        scratch = scratch_ptr + agent * (o5 + n_act)
        # no software pipelining: its copies of the chunk's loads would not fit in shared memory
        for chunk in tl.range(0, tl.cdiv(B, BLOCK_B), num_stages=1):
            cw1, cb1, cw2, cb2, cw3, cb3, c_loss, c_q, c_td = td_gradients(
                x_ptr, nx_ptr, x_agent_stride, x_row_stride, act_ptr, act_agent_stride, act_row_stride,
                rew_ptr, rew_agent_stride, rew_row_stride, done_ptr, done_agent_stride, done_row_stride, wt_ptr, g,
                w1, b1, w2, b2, w3, b3, tw1, tb1, tw2, tb2, tw3, tb3, td_ptr, agent, chunk, B, n_in, h1, h2, n_act,
                IN, H1, H2, A, BLOCK_B, DOUBLE_Q, PRECISION, MSE,
            )  # fmt: skip
            if SCRATCH:  # the running sum in the agent's scratch row (cached), not in registers
                _add_tile(scratch, cw1, chunk, h1, n_in, H1, IN)
                _add_tile(scratch + o1, cb1[:, None], chunk, h1, 1, H1, 1)
                _add_tile(scratch + o2, cw2, chunk, h2, h1, H2, H1)
                _add_tile(scratch + o3, cb2[:, None], chunk, h2, 1, H2, 1)
                _add_tile(scratch + o4, cw3, chunk, n_act, h2, A, H2)
                _add_tile(scratch + o5, cb3[:, None], chunk, n_act, 1, A, 1)
            else:
                gw1 += cw1
                gb1 += cb1
                gw2 += cw2
                gb2 += cb2
                gw3 += cw3
                gb3 += cb3
            loss += c_loss
            q += c_q
            abs_td += c_td
        if SCRATCH:
            tl.debug_barrier()  # every thread's sums stored before any thread reads them back
            gw1 = _load_tile(scratch, h1, n_in, H1, IN)
            gb1 = tl.reshape(_load_tile(scratch + o1, h1, 1, H1, 1), (H1,))
            gw2 = _load_tile(scratch + o2, h2, h1, H2, H1)
            gb2 = tl.reshape(_load_tile(scratch + o3, h2, 1, H2, 1), (H2,))
            gw3 = _load_tile(scratch + o4, n_act, h2, A, H2)
            gb3 = tl.reshape(_load_tile(scratch + o5, n_act, 1, A, 1), (A,))
        sums = sums_ptr + agent * 3
        tl.store(sums, tl.load(sums) + (loss / B).to(tl.float64))
        tl.store(sums + 1, tl.load(sums + 1) + (q / B).to(tl.float64))
        tl.store(sums + 2, tl.load(sums + 2) + (abs_td / B).to(tl.float64))
        scale = 1.0
        if CLIP:  # clip_grad_norm_: every gradient scaled by min(1, max_norm / (global norm + 1e-6))
            sq = tl.sum(tl.sum(gw1 * gw1, axis=1), axis=0) + tl.sum(gb1 * gb1, axis=0)
            sq += tl.sum(tl.sum(gw2 * gw2, axis=1), axis=0) + tl.sum(gb2 * gb2, axis=0)
            sq += tl.sum(tl.sum(gw3 * gw3, axis=1), axis=0) + tl.sum(gb3 * gb3, axis=0)
            scale = tl.minimum(max_norm / (tl.sqrt(sq) + 1e-6), 1.0)
        # every thread's reads of the parameters (the chunks' forwards) before any thread writes them
        tl.debug_barrier()
        step = tl.load(steps_ptr + agent) + 1.0
        tl.store(steps_ptr + agent, step)
        lr = tl.load(lr_ptr + agent).to(tl.float32)
        if TAU_PER_AGENT:
            rate = tl.load(tau_ptr + agent)
        else:
            rate = tau
        _adam_tile(gw1, w1, mw1, vw1, tw1, agent, h1, n_in, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                   eps, rate, H1, IN, CLIP, SOFT)  # fmt: skip
        _adam_vector(gb1, b1, mb1, vb1, tb1, agent, h1, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                     eps, rate, H1, CLIP, SOFT)  # fmt: skip
        _adam_tile(gw2, w2, mw2, vw2, tw2, agent, h2, h1, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                   eps, rate, H2, H1, CLIP, SOFT)  # fmt: skip
        _adam_vector(gb2, b2, mb2, vb2, tb2, agent, h2, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                     eps, rate, H2, CLIP, SOFT)  # fmt: skip
        _adam_tile(gw3, w3, mw3, vw3, tw3, agent, n_act, h2, scale, step, lr, beta1, beta2, log2_beta1,
                   log2_beta2, eps, rate, A, H2, CLIP, SOFT)  # fmt: skip
        _adam_vector(gb3, b3, mb3, vb3, tb3, agent, n_act, scale, step, lr, beta1, beta2, log2_beta1, log2_beta2,
                     eps, rate, A, CLIP, SOFT)  # fmt: skip
