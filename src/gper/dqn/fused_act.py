"""Epsilon-greedy actions of N agents in one kernel: the Q-network's forward, the argmax, the
exploration rate from the env-step counter and the coin flips.

Why: the collect step of a small agent is a chain of short launches, each bound by its launch,
not its work (``gper bench train-step --population``). As torch ops, choosing the actions takes
about fifteen of them: three GEMMs with their bias and ReLU passes, the argmax, four for the
exploration rate, two draws, the comparison and the ``where``. Here one program per agent (and
block of rows) runs all of it with the activations on chip.

It computes what the torch ops compute (:func:`epsilon_greedy_reference`), to rounding: the
matmuls run at the precision asked for (TF32 or IEEE FP32, as cuBLAS's under PyTorch's TF32
switch), so where an agent's two best Q-values lie within rounding of each other the greedy
action may differ. The random numbers are the caller's: ``draws[..., 0]`` decides exploration,
``draws[..., 1]`` picks the random action (``floor(u * n_actions)``).

It serves networks of two hidden ReLU layers (:func:`fused_act_supported`); the second hidden
layer is walked in column blocks, each block's activations feeding the output layer at once, so
what a program holds on chip is ``W1^T [inputs, hidden_1]``, ``[rows, hidden_1]`` and one block of
``W2^T [hidden_1, 32 or 64]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gper._triton import HAS_TRITON, tl, triton

#: the widest hidden layer the kernel serves: 256, the widest run on a GPU (the cartpole preset's);
#: wider ones take the torch ops
MAX_WIDTH = 256
#: the widest input and action count (the market task's 52 and 45 fit)
MAX_IO = 64
#: rows (an agent's environments) a program handles
BLOCK_ROWS = 16


def fused_act_supported(obs_width: int, hidden: tuple[int, ...], n_actions: int) -> bool:
    """Whether :func:`epsilon_greedy` serves this architecture: two hidden layers of at most
    :data:`MAX_WIDTH` units, at most :data:`MAX_IO` inputs and actions."""
    return len(hidden) == 2 and max(hidden) <= MAX_WIDTH and max(obs_width, n_actions) <= MAX_IO


def _padded(n: int) -> int:
    # tl.dot needs every dimension a power of two of at least 16
    return max(16, 1 << (n - 1).bit_length())


if HAS_TRITON:
    from gper.dqn.population_fused_learn import load_bias, load_weight_t

    @triton.jit
    def _act_kernel(
        obs_ptr, obs_agent_stride, obs_row_stride,  # [N, E, n_in] observations (columns contiguous)
        draw_ptr,  # [N, E, 2] float32 uniform draws, contiguous
        counter_ptr,  # float64 env steps taken (each agent's count)
        start_ptr, span_ptr, decay_ptr,  # [N] float64 eps_start, eps_end - eps_start, decay steps
        w1, b1, w2, b2, w3, b3,  # stacked parameters [N, out, in] and [N, out], contiguous
        act_ptr,  # [N, E] int64 actions, written
        E, n_in, h1, h2, n_act,
        IN: tl.constexpr, H1: tl.constexpr, BLOCK_H2: tl.constexpr, A: tl.constexpr, ROWS: tl.constexpr,
        PRECISION: tl.constexpr,
    ):  # fmt: skip
        agent = tl.program_id(0).to(tl.int64)
        r = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
        live = r < E
        cols_in = tl.arange(0, IN)
        x = tl.load(
            obs_ptr + agent * obs_agent_stride + r[:, None] * obs_row_stride + cols_in[None, :],
            mask=live[:, None] & (cols_in[None, :] < n_in),
            other=0.0,
        )
        # layer 1, whole: W1^T [IN, H1]
        w1t = load_weight_t(w1, agent, n_in, h1, IN, H1)
        a1 = tl.maximum(tl.dot(x, w1t, input_precision=PRECISION) + load_bias(b1, agent, h1, H1)[None, :], 0.0)
        # layer 2 a block of columns at a time (rows start.. of W2), each block's share of the Q-values
        # added at once
        cols_a = tl.arange(0, A)
        q = tl.zeros((ROWS, A), dtype=tl.float32)
        for start in range(0, h2, BLOCK_H2):
            o2 = start + tl.arange(0, BLOCK_H2)
            w2t = load_weight_t(w2 + (agent * h2 + start) * h1, 0, h1, h2 - start, H1, BLOCK_H2)
            c2 = load_bias(b2 + agent * h2 + start, 0, h2 - start, BLOCK_H2)
            a2 = tl.maximum(tl.dot(a1, w2t, input_precision=PRECISION) + c2[None, :], 0.0)
            w3t = tl.load(
                w3 + agent * n_act * h2 + cols_a[None, :] * h2 + o2[:, None],
                mask=(o2[:, None] < h2) & (cols_a[None, :] < n_act),
                other=0.0,
            )
            q += tl.dot(a2, w3t, input_precision=PRECISION)
        q += load_bias(b3, agent, n_act, A)[None, :]
        greedy = tl.argmax(tl.where(cols_a[None, :] < n_act, q, float("-inf")), axis=1)
        # the exploration rate: linear from eps_start to eps_end over decay env steps, then flat
        frac = tl.minimum(tl.load(counter_ptr) / tl.load(decay_ptr + agent), 1.0)
        eps = tl.load(start_ptr + agent) + tl.load(span_ptr + agent) * frac
        d = draw_ptr + (agent * E + r) * 2
        explore = tl.load(d, mask=live, other=1.0).to(tl.float64) < eps
        pick = (tl.load(d + 1, mask=live, other=0.0) * n_act).to(tl.int64)
        pick = tl.minimum(pick, n_act - 1)
        tl.store(act_ptr + agent * E + r, tl.where(explore, pick, greedy.to(tl.int64)), mask=live)


def epsilon_greedy(
    params: Sequence[torch.Tensor],
    obs: torch.Tensor,
    draws: torch.Tensor,
    env_steps: torch.Tensor,
    eps_start: torch.Tensor,
    eps_span: torch.Tensor,
    decay: torch.Tensor,
    *,
    precision: str = "ieee",
) -> torch.Tensor:
    """Each agent's epsilon-greedy actions for its observations, in one launch.

    Args:
        params: the agents' stacked parameters, weight ``[N, out, in]`` and bias ``[N, out]`` of
            three layers (:class:`~gper.dqn.population_net.StackedQNetwork`'s order), contiguous float32.
        obs: ``[N, E, in]`` float32 observations (columns contiguous).
        draws: ``[N, E, 2]`` float32 uniform draws in [0, 1), contiguous: exploration, random action.
        env_steps: a float64 element on the device, the env steps each agent has taken.
        eps_start, eps_span, decay: ``[N]`` float64: the exploration rate is
            ``eps_start + eps_span * min(env_steps / decay, 1)``.
        precision: the matmuls' input precision on the GPU, ``"tf32"`` or ``"ieee"``.

    Returns:
        ``[N, E]`` int64 actions.
    """
    if not HAS_TRITON:
        raise RuntimeError("epsilon_greedy needs Triton (pip install triton)")
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision must be tf32 or ieee, got {precision!r}")
    n, e, n_in = obs.shape
    if len(params) != 6:
        raise ValueError(f"epsilon_greedy needs the 6 parameters of two hidden layers, got {len(params)}")
    h1, h2, n_act = params[0].shape[1], params[2].shape[1], params[4].shape[1]
    if not fused_act_supported(n_in, (h1, h2), n_act):
        raise ValueError(f"epsilon_greedy serves two hidden layers of up to {MAX_WIDTH}, got {(n_in, h1, h2, n_act)}")
    expected = [(n, h1, n_in), (n, h1), (n, h2, h1), (n, h2), (n, n_act, h2), (n, n_act)]
    for t, shape in zip(params, expected, strict=True):
        if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"params: needs contiguous float32 tensors of shapes {expected}, got {tuple(t.shape)}")
    if obs.stride(2) != 1 or tuple(draws.shape) != (n, e, 2) or not draws.is_contiguous():
        raise ValueError(f"obs needs contiguous columns and draws the contiguous shape {(n, e, 2)}")
    actions = torch.empty(n, e, dtype=torch.int64, device=obs.device)
    h1p = _padded(h1)
    block_h2 = min(_padded(h2), 32 if h1p > 128 else 64)
    _act_kernel[(n, triton.cdiv(e, BLOCK_ROWS))](
        obs, obs.stride(0), obs.stride(1), draws, env_steps, eps_start, eps_span, decay, *params, actions,
        e, n_in, h1, h2, n_act,
        IN=_padded(n_in), H1=h1p, BLOCK_H2=block_h2, A=_padded(n_act), ROWS=BLOCK_ROWS, PRECISION=precision,
        num_warps=4 if h1p <= 128 else 8,
    )  # fmt: skip
    return actions


def epsilon_greedy_reference(
    q: torch.Tensor,
    draws: torch.Tensor,
    env_steps: torch.Tensor,
    eps_start: torch.Tensor,
    eps_span: torch.Tensor,
    decay: torch.Tensor,
) -> torch.Tensor:
    """What :func:`epsilon_greedy` computes, as torch ops from the Q-values ``q`` ``[N, E, A]``."""
    n_act = q.shape[2]
    eps = eps_start + eps_span * (env_steps / decay).clamp(max=1.0)
    explore = draws[..., 0].to(torch.float64) < eps[:, None]
    pick = (draws[..., 1] * n_act).to(torch.int64).clamp(max=n_act - 1)
    return torch.where(explore, pick, q.argmax(dim=2))
