"""CartPole-v1's step as one Triton kernel: what :meth:`gper.envs.cartpole.CartPole.step` computes
with some fifty torch ops, each its own launch on CUDA.

A step of a few thousand copies is a few microseconds of arithmetic, but as torch ops it is a
chain of ~50 launches (the float64 expressions one operator at a time, the flags, the reset's
``where``, the float32 copies), which costs more than the rest of a small agent's collect step
together (``gper bench train-step --population``). Here one program handles ``BLOCK`` copies: it
loads the state, applies the action, integrates, tests the thresholds and the time limit, and
writes the next state (a fresh one from the caller's uniform draws where the episode ended), the
float32 observations, the reward and both flags.

The arithmetic is the torch ops': float64, the same expressions in the same order, each operation
rounded on its own (the launch asks for no fused multiply-adds), the constants read from a float64
tensor (a Python float would reach the kernel as float32). So on the CPU under the Triton
interpreter the kernel computes what the torch ops compute, up to ``sin``/``cos``, which NumPy and
PyTorch round differently on some arguments; on CUDA both call the device's math library.
"""

from __future__ import annotations

import torch

from gper._triton import HAS_TRITON, tl, triton

#: copies a program steps
BLOCK = 256

#: the float64 constants the kernel reads, in this order (:func:`constants` makes the tensor)
CONSTANT_NAMES = (
    "force_mag",
    "polemass_length",
    "total_mass",
    "gravity",
    "length",
    "four_thirds",
    "masspole",
    "tau",
    "x_threshold",
    "theta_threshold",
    "reset_span",
    "reset_bound",
)


def constants(values: dict[str, float], device: torch.device) -> torch.Tensor:
    """The kernel's float64 constants (:data:`CONSTANT_NAMES`, from ``values``) as one device tensor."""
    return torch.tensor([values[name] for name in CONSTANT_NAMES], dtype=torch.float64, device=device)


if HAS_TRITON:

    @triton.jit
    def _step_kernel(
        state_ptr,  # [n, 4] float64 x, x_dot, theta, theta_dot (updated in place)
        steps_ptr,  # [n] int64 steps taken in the episode (updated in place)
        action_ptr,  # [n] int64 actions (nonzero: push right)
        draw_ptr,  # [n, 4] float64 uniform draws in [0, 1) for the reset states
        const_ptr,  # [12] float64, CONSTANT_NAMES
        next_obs_ptr,  # [n, 4] float32, written: the state the action led to
        obs_ptr,  # [n, 4] float32, written: the state to act on next (reset where the episode ended)
        reward_ptr,  # [n] float32, written
        term_ptr,  # [n] bool, written
        trunc_ptr,  # [n] bool, written
        n,
        max_steps,
        BLOCK: tl.constexpr,
    ):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = i < n
        s = state_ptr + i * 4
        x = tl.load(s, mask=live, other=0.0)
        x_dot = tl.load(s + 1, mask=live, other=0.0)
        theta = tl.load(s + 2, mask=live, other=0.0)
        theta_dot = tl.load(s + 3, mask=live, other=0.0)
        force_mag = tl.load(const_ptr)
        polemass_length = tl.load(const_ptr + 1)
        total_mass = tl.load(const_ptr + 2)
        gravity = tl.load(const_ptr + 3)
        length = tl.load(const_ptr + 4)
        four_thirds = tl.load(const_ptr + 5)
        masspole = tl.load(const_ptr + 6)
        tau = tl.load(const_ptr + 7)
        x_threshold = tl.load(const_ptr + 8)
        theta_threshold = tl.load(const_ptr + 9)
        reset_span = tl.load(const_ptr + 10)
        reset_bound = tl.load(const_ptr + 11)
        action = tl.load(action_ptr + i, mask=live, other=0)
        force = tl.where(action != 0, force_mag, -force_mag)
        costheta = tl.cos(theta)
        sintheta = tl.sin(theta)
        # CartPole.step's expressions, operation by operation
        temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (four_thirds - masspole * (costheta * costheta) / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        nx = x + tau * x_dot
        nx_dot = x_dot + tau * xacc
        ntheta = theta + tau * theta_dot
        ntheta_dot = theta_dot + tau * thetaacc
        terminated = (nx < -x_threshold) | (nx > x_threshold) | (ntheta < -theta_threshold)
        terminated = terminated | (ntheta > theta_threshold)
        steps = tl.load(steps_ptr + i, mask=live, other=0) + 1
        truncated = steps >= max_steps
        done = terminated | truncated
        d = draw_ptr + i * 4
        rx = tl.load(d, mask=live, other=0.0) * reset_span - reset_bound
        rx_dot = tl.load(d + 1, mask=live, other=0.0) * reset_span - reset_bound
        rtheta = tl.load(d + 2, mask=live, other=0.0) * reset_span - reset_bound
        rtheta_dot = tl.load(d + 3, mask=live, other=0.0) * reset_span - reset_bound
        sx = tl.where(done, rx, nx)
        sx_dot = tl.where(done, rx_dot, nx_dot)
        stheta = tl.where(done, rtheta, ntheta)
        stheta_dot = tl.where(done, rtheta_dot, ntheta_dot)
        tl.store(s, sx, mask=live)
        tl.store(s + 1, sx_dot, mask=live)
        tl.store(s + 2, stheta, mask=live)
        tl.store(s + 3, stheta_dot, mask=live)
        tl.store(steps_ptr + i, tl.where(done, 0, steps), mask=live)
        o = next_obs_ptr + i * 4
        tl.store(o, nx.to(tl.float32), mask=live)
        tl.store(o + 1, nx_dot.to(tl.float32), mask=live)
        tl.store(o + 2, ntheta.to(tl.float32), mask=live)
        tl.store(o + 3, ntheta_dot.to(tl.float32), mask=live)
        o = obs_ptr + i * 4
        tl.store(o, sx.to(tl.float32), mask=live)
        tl.store(o + 1, sx_dot.to(tl.float32), mask=live)
        tl.store(o + 2, stheta.to(tl.float32), mask=live)
        tl.store(o + 3, stheta_dot.to(tl.float32), mask=live)
        tl.store(reward_ptr + i, tl.full((BLOCK,), 1.0, tl.float32), mask=live)
        tl.store(term_ptr + i, terminated, mask=live)
        tl.store(trunc_ptr + i, truncated, mask=live)


def cartpole_step(
    state: torch.Tensor,
    steps: torch.Tensor,
    actions: torch.Tensor,
    draws: torch.Tensor,
    consts: torch.Tensor,
    max_steps: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of every copy in one launch; ``state`` ([n, 4] float64) and ``steps`` ([n] int64)
    updated in place, ``draws`` ([n, 4] float64 uniform in [0, 1)) the reset states' draws,
    ``consts`` :func:`constants`' tensor. Returns (next_obs, reward, terminated, truncated, obs) as
    :class:`gper.envs.base.Step` holds them."""
    if not HAS_TRITON:
        raise RuntimeError("cartpole_step needs Triton (pip install triton)")
    n = state.shape[0]
    # the kernel reads every input flat: a strided view (a column of a wider tensor) is copied first
    state_c, steps_c = state.contiguous(), steps.contiguous()
    actions, draws = actions.contiguous(), draws.contiguous()
    next_obs = torch.empty(n, 4, dtype=torch.float32, device=state.device)
    obs = torch.empty_like(next_obs)
    reward = torch.empty(n, dtype=torch.float32, device=state.device)
    terminated = torch.empty(n, dtype=torch.bool, device=state.device)
    truncated = torch.empty_like(terminated)
    _step_kernel[(triton.cdiv(n, BLOCK),)](
        state_c, steps_c, actions, draws, consts, next_obs, obs, reward, terminated, truncated, n, max_steps,
        BLOCK=BLOCK, enable_fp_fusion=False,
    )  # fmt: skip
    if state_c is not state:  # the state was updated in a copy: back into the caller's tensors
        state.copy_(state_c)
    if steps_c is not steps:
        steps.copy_(steps_c)
    return next_obs, reward, terminated, truncated, obs
