"""Gymnasium's ``CartPole-v1`` re-implemented in PyTorch, ``num_envs`` copies stepped on the device.

It follows Gymnasium 1.x ``gymnasium/envs/classic_control/cartpole.py`` operation by operation: the
same constants, the explicit Euler integrator, the same termination thresholds, reward 1.0 on every
step including the terminating one, truncation after 500 steps (the ``TimeLimit`` of
``CartPole-v1``), and reset states uniform in [-0.05, 0.05). The state is kept in float64 because
Gymnasium computes in float64 and only rounds the observation to float32; with the same arithmetic
in the same order, a trajectory matches Gymnasium's bit for bit wherever ``sin``/``cos`` round as
NumPy's do (PyTorch's vectorized CPU ``sin``/``cos`` differ from glibc's by one ulp on a small share of
arguments, and CUDA's may too, so long runs can drift apart at the last float64 digit).

``step`` is CUDA-graph safe: fixed-shape device ops only, and every piece of state is updated in place.
On CUDA (``backend="auto"``, where Triton is installed) it runs as one kernel plus the reset
states' draw (:mod:`gper.envs.cartpole_kernel`): the same float64 arithmetic, two launches instead
of some fifty.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from gper._triton import HAS_TRITON
from gper.envs._rng import EnvRng
from gper.envs.base import Step, VecEnv, canonical_device, check_num_envs
from gper.envs.cartpole_kernel import cartpole_step, constants
from gper.envs.registry import EnvSpec
from gper.ops.probe import triton_problem

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5
"""Half the pole's length, as in Gymnasium."""
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
"""Seconds per step."""
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
MAX_STEPS = 500
RESET_BOUND = 0.05


class CartPole(VecEnv):
    """``num_envs`` CartPole-v1 copies on ``device``, each reset automatically when it ends.

    Args:
        num_envs: copies stepped together.
        device: where the state lives and every step runs.
        seed: seeds the environment's own generator (ignored with ``generator`` or ``graph_safe_rng``).
        generator: draw reset states from this generator (the caller seeds it).
        graph_safe_rng: draw from torch's default generator of ``device``, which a CUDA graph
            capture handles by itself; the trainer then seeds torch globally (see :mod:`gper.envs._rng`).
        backend: ``"auto"`` (default): the step as one Triton kernel on CUDA where Triton is
            installed and passes its probe (:func:`gper.ops.probe.triton_problem`), the torch ops
            elsewhere; ``"torch"``: the torch ops; ``"triton"``: the kernel
            (on the CPU only under ``TRITON_INTERPRET=1``). Both draw the same reset states.

    Actions are checked on the host for shape, dtype and device only; their values are not
    (that would need a sync): any nonzero action pushes right, like Gymnasium's ``action == 1``.
    """

    name = "cartpole"
    obs_dim = 4
    n_actions = 2
    graph_safe = True
    reward_threshold = 475.0  # CartPole-v1's

    def __init__(
        self,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        generator: torch.Generator | None = None,
        graph_safe_rng: bool = False,
        backend: str = "auto",
    ) -> None:
        self.num_envs = check_num_envs(num_envs)
        self.device = canonical_device(device)
        self.backend = _step_backend(backend, self.device)
        self._rng = EnvRng(self.device, seed, generator, graph_safe_rng)
        self.state = torch.zeros(num_envs, 4, dtype=torch.float64, device=self.device)
        """[N, 4] float64: x, x_dot, theta, theta_dot."""
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        """[N] int64: steps taken in the current episode."""
        # A divisor tensor on the device, not a Python float: CUDA divides by a host scalar as a
        # multiplication by its reciprocal, which rounds differently from NumPy's division.
        self._total_mass = torch.tensor(TOTAL_MASS, dtype=torch.float64, device=self.device)
        self._constants = constants(_KERNEL_CONSTANTS, self.device) if self.backend == "triton" else None
        self.reset()

    @property
    def generator(self) -> torch.Generator | None:
        """The generator reset states come from (``None``: torch's default one of the device)."""
        return self._rng.generator

    def _random_states(self) -> torch.Tensor:
        u = torch.rand(self.num_envs, 4, dtype=torch.float64, device=self.device, generator=self._rng.generator)
        return u * (2 * RESET_BOUND) - RESET_BOUND

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self._rng.seed(seed)
        self.state.copy_(self._random_states())
        self.steps.zero_()
        return self.state.float()

    def step(self, actions: torch.Tensor) -> Step:
        self.check_actions(actions)
        if self.backend == "triton":
            # every copy draws its reset state, as below: the same numbers from the same generator
            draws = torch.rand(self.num_envs, 4, dtype=torch.float64, device=self.device, generator=self._rng.generator)
            return Step(*cartpole_step(self.state, self.steps, actions, draws, self._constants, MAX_STEPS))
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(actions != 0, FORCE_MAG, -FORCE_MAG).to(torch.float64)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        # Same expressions, same order of operations as Gymnasium (float64 rounding included).
        temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / self._total_mass
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / self._total_mass)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / self._total_mass
        new_state = torch.stack(
            (x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc), dim=1
        )
        nx, ntheta = new_state[:, 0], new_state[:, 2]
        terminated = (nx < -X_THRESHOLD) | (nx > X_THRESHOLD) | (ntheta < -THETA_THRESHOLD) | (ntheta > THETA_THRESHOLD)
        steps = self.steps + 1
        truncated = steps >= MAX_STEPS
        done = terminated | truncated
        self.state.copy_(torch.where(done.unsqueeze(1), self._random_states(), new_state))
        self.steps.copy_(torch.where(done, 0, steps))
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return Step(new_state.float(), reward, terminated, truncated, self.state.float())

    def set_state(self, state: torch.Tensor, steps: torch.Tensor | None = None) -> None:
        """Put every copy in ``state`` ([N, 4] float64) with ``steps`` ([N] int, default 0) taken so far."""
        self.state.copy_(state.to(self.device, torch.float64).reshape(self.num_envs, 4))
        if steps is None:
            self.steps.zero_()
        else:
            self.steps.copy_(torch.as_tensor(steps, device=self.device).to(torch.int64).reshape(self.num_envs))

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.clone(), "steps": self.steps.clone()}
        if self._rng.owned:
            out["generator"] = self._rng.generator.get_state()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_state(state["state"], state["steps"])
        if self._rng.owned and "generator" in state:
            self._rng.generator.set_state(state["generator"])


#: the step kernel's float64 constants (gper.envs.cartpole_kernel.CONSTANT_NAMES), as the torch ops use them
_KERNEL_CONSTANTS = {
    "force_mag": FORCE_MAG, "polemass_length": POLEMASS_LENGTH, "total_mass": TOTAL_MASS, "gravity": GRAVITY,
    "length": LENGTH, "four_thirds": 4.0 / 3.0, "masspole": MASSPOLE, "tau": TAU, "x_threshold": X_THRESHOLD,
    "theta_threshold": THETA_THRESHOLD, "reset_span": 2 * RESET_BOUND, "reset_bound": RESET_BOUND,
}  # fmt: skip


def _step_backend(request: str, device: torch.device) -> str:
    """``"torch"`` or ``"triton"`` for ``backend=request`` on ``device`` (see :class:`CartPole`)."""
    if request == "auto":  # Triton where the replay would take it: installed, on CUDA, past the probe
        return "triton" if HAS_TRITON and device.type == "cuda" and triton_problem(device) is None else "torch"
    if request == "torch":
        return request
    if request != "triton":
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {request!r}")
    if not HAS_TRITON:
        raise ImportError("CartPole(backend='triton') needs the triton package: pip install \".[triton]\"")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"CartPole(backend='triton') runs on CUDA (or on CPU under TRITON_INTERPRET=1), not {device}")
    return request


# The trainer's presets (gper.envs.registry.PRESETS), a line per concern: the run, the network and
# its optimiser, the target and exploration. total_steps: long enough to reach 475 (docs/training.md,
# "Results on the H200"); cartpole is small: the same on the CPU, but shorter (enough there too).
# hidden (256, 256): with a (128, 128) network (which the one-kernel learn step holds) 11 of 16 and
# 48 of 64 seeds reached 475 within 300k steps (an H100, the fused kernels; seed 1 not at all),
# where this preset had 13 of 16 and 56 of 64 (an H200, the torch ops, the day before): not one
# comparison, but no reason to change (benchmarks/results/trainers-*-20261205-*, -20261204-184643).
# fmt: off
SPEC = EnvSpec(
    "cartpole",
    CartPole,
    # the step's kernels follow the run's back end setting (--backend torch: the torch ops)
    settings=lambda run, split: {"backend": getattr(run, "backend", "auto")},
    presets={
        "cuda": dict(
            total_steps=300_000, num_envs=4, hidden=(256, 256), buffer_size=100_000, batch_size=256,
            learning_rate=5e-4, max_grad_norm=10.0, tau=1.0, target_every=200, eps_end=0.01, exploration_fraction=0.1,
            learning_starts=5_000, epoch_steps=10_000, solve_return=475.0, weight_norm="global",
        ),
        "cpu": dict(total_steps=200_000),
    },
)
# fmt: on
