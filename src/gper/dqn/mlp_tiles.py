"""A two-hidden-layer ReLU Q-network on a tile of rows, in Triton: the device functions the fused act
and learn kernels share.

An agent's weights ``[N, out, in]`` are loaded transposed (``W^T [in, out]``, zero padded to powers
of two), so every product reads them as loaded; :func:`td_gradients` runs one chunk of an agent's
batch through the forwards, the TD loss and the backward with the activations on chip, and returns
the chunk's gradient tiles for the caller to store (one program a chunk) or to add up (one program
an agent, which then runs Adam on them without a round trip through memory).
"""

from __future__ import annotations

from gper._triton import HAS_TRITON, tl, triton

if HAS_TRITON:

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
    def mlp(x, w1t, b1, w2t, b2, w3t, b3, PRECISION: tl.constexpr):
        """A network (its weights transposed, ``W^T [in, out]``, biases ``[out]``) on ``x [rows, in]``:
        both hidden activations and the Q-values (padded columns 0)."""
        a1 = tl.maximum(tl.dot(x, w1t, input_precision=PRECISION) + b1[None, :], 0.0)
        a2 = tl.maximum(tl.dot(a1, w2t, input_precision=PRECISION) + b2[None, :], 0.0)
        return a1, a2, tl.dot(a2, w3t, input_precision=PRECISION) + b3[None, :]

    @triton.jit
    def store_tile(ptr, g, n_rows, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
        r = tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, COLS)[None, :]
        tl.store(ptr + r * n_cols + c, g, mask=(r < n_rows) & (c < n_cols))

    @triton.jit
    def td_gradients(
        x_ptr, nx_ptr, x_agent_stride, x_row_stride,  # [N, B, n_in] observations and next ones (columns contiguous)
        act_ptr, act_agent_stride, act_row_stride,  # [N, B] int64 actions
        rew_ptr, rew_agent_stride, rew_row_stride,  # [N, B] float32 rewards
        done_ptr, done_agent_stride, done_row_stride,  # [N, B] float32 termination flags
        wt_ptr,  # [N, B] float32 IS weights, contiguous
        g,  # the agent's discount
        w1, b1, w2, b2, w3, b3,  # online parameters (stacked, contiguous)
        tw1, tb1, tw2, tb2, tw3, tb3,  # target parameters
        td_ptr,  # [N, B] float32 TD errors, written for the chunk's rows
        agent, chunk, B, n_in, h1, h2, n_act,
        IN: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, A: tl.constexpr, BLOCK_B: tl.constexpr,
        DOUBLE_Q: tl.constexpr, PRECISION: tl.constexpr, MSE: tl.constexpr,
    ):  # fmt: skip
        """Rows ``[chunk BLOCK_B, (chunk + 1) BLOCK_B)`` of agent ``agent``'s batch: the TD target
        ``y = r + g (1 - done) Q'(s', a')`` from the target network (and, double-Q, the online one) on
        ``next_x``, the online network on ``x``, the IS-weighted Huber loss (delta 1; or the squared
        error) of ``q[a] - y`` as a mean over the whole batch of ``B`` rows, and its backward.

        Writes the rows' TD errors; returns the chunk's gradient ``(dW1 [H1, IN], db1 [H1], dW2 [H2, H1],
        db2 [H2], dW3 [A, H2], db3 [A])`` (padded entries 0) and its sums of the weighted loss,
        ``q[a]`` and ``|td|``."""
        r = chunk * BLOCK_B + tl.arange(0, BLOCK_B)
        live = r < B
        cols_in = tl.arange(0, IN)
        cols_a = tl.arange(0, A)
        real = cols_a[None, :] < n_act
        m_in = live[:, None] & (cols_in[None, :] < n_in)
        at_x = agent * x_agent_stride + r[:, None] * x_row_stride + cols_in[None, :]
        nx = tl.load(nx_ptr + at_x, mask=m_in, other=0.0)
        _, _, qt = mlp(
            nx, load_weight_t(tw1, agent, n_in, h1, IN, H1), load_bias(tb1, agent, h1, H1),
            load_weight_t(tw2, agent, h1, h2, H1, H2), load_bias(tb2, agent, h2, H2),
            load_weight_t(tw3, agent, h2, n_act, H2, A), load_bias(tb3, agent, n_act, A), PRECISION,
        )  # fmt: skip
        w1t = load_weight_t(w1, agent, n_in, h1, IN, H1)
        w2t = load_weight_t(w2, agent, h1, h2, H1, H2)
        w3t = load_weight_t(w3, agent, h2, n_act, H2, A)
        c1, c2, c3 = load_bias(b1, agent, h1, H1), load_bias(b2, agent, h2, H2), load_bias(b3, agent, n_act, A)
        if DOUBLE_Q:  # a' = the online network's argmax (the first of equal maxima), valued by the target
            _, _, qo = mlp(nx, w1t, c1, w2t, c2, w3t, c3, PRECISION)
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
        a1, a2, q = mlp(x, w1t, c1, w2t, c2, w3t, c3, PRECISION)
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
        loss_sum = tl.sum(tl.where(live, row_loss * weight, 0.0), axis=0)
        q_sum = tl.sum(tl.where(live, q_a, 0.0), axis=0)
        td_sum = tl.sum(tl.where(live, abs_td, 0.0), axis=0)
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
        return (
            tl.dot(d_a1t, x, input_precision=PRECISION), tl.sum(d_a1t, axis=1),
            tl.dot(d_a2t, a1, input_precision=PRECISION), tl.sum(d_a2t, axis=1),
            tl.dot(d_qt, a2, input_precision=PRECISION), tl.sum(d_qt, axis=1),
            loss_sum, q_sum, td_sum,
        )  # fmt: skip
