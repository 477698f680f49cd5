"""The bit-flipping task of hindsight experience replay (Andrychowicz et al. 2017, arXiv 1707.01495,
section 4.1), ``num_envs`` copies stepped on the device.

A state is ``n`` bits and so is a goal. Action ``i`` flips bit ``i``; the reward is 0 on the step
that makes the state equal the goal and -1 on every other step; that step terminates the episode,
and an episode that has not reached its goal after ``n`` steps is truncated. The observation is
``cat(state, goal)`` as float32 zeros and ones, the layout of :class:`gper.envs.goals.GoalEnv`: the
achieved goal is the state itself. With a reward this sparse, random exploration almost never
sees a 0 beyond a few tens of bits, which is what makes the task a test of hindsight relabelling.

Start states and goals are uniform random bits, except that a goal drawn equal to its state has
one uniformly chosen bit flipped (no rejection loop, so no host synchronisation). Given a state,
each other pattern is therefore a goal with probability ``2^-n``, plus ``2^-n / n`` for the ``n``
patterns one bit away: ``n = 1`` always asks for the other bit, ``n = 2`` for a neighbour with
probability 3/8 each and the opposite pattern with 1/4, and from about 10 bits on the skew is
below a thousandth of a percent. Every goal is reachable within the episode (at most ``n`` flips).

``step`` is CUDA-graph safe: fixed-shape device ops only, and every piece of state is updated in place.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from gper.envs._rng import EnvRng
from gper.envs.base import Step, VecEnv, canonical_device, check_num_envs
from gper.envs.goals import GoalEnv, GoalInfo
from gper.envs.registry import EnvSpec

MAX_BITS = 1024
"""The most bits a state may have (observations of 2048 floats, 1024 actions), far beyond the 50
of the paper's experiments."""


class BitFlip(VecEnv, GoalEnv):
    """``num_envs`` bit-flipping tasks of ``n_bits`` bits on ``device`` (see the module docstring).

    Args:
        n_bits: bits of a state and of a goal, 1 to :data:`MAX_BITS`: also the number of actions
            and the episode length.
        num_envs: copies stepped together.
        device: where the state lives and every step runs.
        seed: seeds the environment's own generator (ignored with ``generator`` or ``graph_safe_rng``).
        generator: draw states and goals from this generator (the caller seeds it).
        graph_safe_rng: draw from torch's default generator of ``device``, which a CUDA graph
            capture handles by itself; the trainer then seeds torch globally (see :mod:`gper.envs._rng`).

    There is no return threshold (:attr:`reward_threshold` is ``None``): an episode is solved when
    it reaches its goal, i.e. when its last step is ``terminated``, and the share of episodes
    solved is the measure of learning.

    Actions are checked on the host for shape, dtype and device. Their values are checked too on
    the CPU, where that costs nothing; on CUDA that would need a synchronisation, so an action
    outside ``[0, n_bits)`` there flips no bit (and still counts as a step).
    """

    graph_safe = True
    reward_threshold = None

    def __init__(
        self,
        n_bits: int,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        generator: torch.Generator | None = None,
        graph_safe_rng: bool = False,
    ) -> None:
        if not isinstance(n_bits, int) or isinstance(n_bits, bool) or not 1 <= n_bits <= MAX_BITS:
            raise ValueError(f"n_bits must be an int in [1, {MAX_BITS}], got {n_bits!r}")
        check_num_envs(num_envs)
        self.n_bits = n_bits
        self.name = f"bitflip:{n_bits}"
        self.obs_dim = 2 * n_bits
        self.n_actions = n_bits
        self.goal_dim = n_bits
        self.max_steps = n_bits
        """Steps after which an episode that has not reached its goal is truncated."""
        self.num_envs = num_envs
        self.device = canonical_device(device)
        self._rng = EnvRng(self.device, seed, generator, graph_safe_rng)
        self.state = torch.zeros(num_envs, n_bits, dtype=torch.bool, device=self.device)
        """[N, n_bits] bool: the bits of each copy."""
        self.goal = torch.zeros(num_envs, n_bits, dtype=torch.bool, device=self.device)
        """[N, n_bits] bool: the bits each copy is after (never equal to :attr:`state` at a reset)."""
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        """[N] int64: steps taken in the current episode."""
        self._bits = torch.arange(n_bits, device=self.device)
        self.reset()

    @property
    def generator(self) -> torch.Generator | None:
        """The generator states and goals come from (``None``: torch's default one of the device)."""
        return self._rng.generator

    def _random_episodes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh (state, goal) for every copy, both bool ``[N, n_bits]``, the goal never the state."""
        n, gen = self.n_bits, self._rng.generator
        bits = torch.randint(0, 2, (2, self.num_envs, n), dtype=torch.uint8, device=self.device, generator=gen)
        state, goal = bits.bool().unbind(0)
        # where the goal came out equal to the state, flip one of its bits, chosen uniformly
        fix = torch.randint(0, n, (self.num_envs,), device=self.device, generator=gen)
        same = (goal == state).all(1, keepdim=True)
        return state, goal ^ (same & (self._bits == fix.unsqueeze(1)))

    def _observe(self, state: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        return torch.cat((state, goal), 1).float()

    def observe(self) -> torch.Tensor:
        """The current observations, float32 ``[N, 2 * n_bits]``: ``cat(state, goal)``."""
        return self._observe(self.state, self.goal)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self._rng.seed(seed)
        state, goal = self._random_episodes()
        self.state.copy_(state)
        self.goal.copy_(goal)
        self.steps.zero_()
        return self.observe()

    def check_actions(self, actions: torch.Tensor) -> None:
        """:meth:`VecEnv.check_actions`, and on the CPU (where reading them costs no sync) their range."""
        super().check_actions(actions)
        if self.device.type == "cpu":
            bad = (actions < 0) | (actions >= self.n_bits)
            if bad.any():
                i = int(bad.nonzero()[0, 0])
                raise ValueError(f"actions must be in [0, {self.n_bits}), got {int(actions[i])} for copy {i}")

    def step(self, actions: torch.Tensor) -> Step:
        self.check_actions(actions)
        # a comparison, not an index: an out-of-range action on CUDA flips nothing instead of faulting
        new_state = self.state ^ (self._bits == actions.unsqueeze(1))
        next_obs = self._observe(new_state, self.goal)
        reward = self.compute_reward(new_state, self.goal)
        terminated = self.compute_terminated(new_state, self.goal)
        steps = self.steps + 1
        truncated = (steps >= self.max_steps) & ~terminated
        done = (terminated | truncated).unsqueeze(1)
        fresh_state, fresh_goal = self._random_episodes()
        self.state.copy_(torch.where(done, fresh_state, new_state))
        self.goal.copy_(torch.where(done, fresh_goal, self.goal))
        self.steps.copy_(torch.where(done.squeeze(1), 0, steps))
        return Step(next_obs, reward, terminated, truncated, self.observe())

    def achieved_goal(self, observation: torch.Tensor) -> torch.Tensor:
        """The state part of an observation is its achieved goal: ``observation`` itself, float32."""
        return observation.float()

    def compute_reward(
        self, achieved_goal: torch.Tensor, desired_goal: torch.Tensor, info: GoalInfo | None = None
    ) -> torch.Tensor:
        """0.0 where ``achieved_goal`` equals ``desired_goal`` in every bit, else -1.0: float32 ``[...]``.

        The goals are ``[..., n_bits]`` of zeros and ones, of any dtype and broadcastable leading
        shapes; ``info`` is unused."""
        return self.compute_terminated(achieved_goal, desired_goal, info).float() - 1.0

    def compute_terminated(
        self, achieved_goal: torch.Tensor, desired_goal: torch.Tensor, info: GoalInfo | None = None
    ) -> torch.Tensor:
        """Where ``achieved_goal`` equals ``desired_goal`` in every bit: bool ``[...]`` (arguments as
        :meth:`compute_reward`)."""
        for what, goal in (("achieved_goal", achieved_goal), ("desired_goal", desired_goal)):
            if goal.dim() < 1 or goal.shape[-1] != self.goal_dim:
                raise ValueError(f"{what} must be [..., {self.goal_dim}], got {list(goal.shape)}")
        return (achieved_goal == desired_goal).all(-1)

    def set_state(self, state: torch.Tensor, goal: torch.Tensor, steps: torch.Tensor | None = None) -> None:
        """Put every copy in ``state`` with ``goal`` (both ``[N, n_bits]`` of zeros and ones, any dtype)
        and ``steps`` (``[N]`` int in ``[0, n_bits)``, default 0) taken so far.

        Checked on the host before anything changes (a goal equal to its state is allowed: the
        copy then has to leave it and come back)."""
        shape = (self.num_envs, self.n_bits)
        bits = []
        for what, t in (("state", state), ("goal", goal)):
            t = torch.as_tensor(t)
            if tuple(t.shape) != shape or not ((t == 0) | (t == 1)).all():
                raise ValueError(f"{what} must be {list(shape)} of zeros and ones, got {t.dtype} {list(t.shape)}")
            bits.append(t.to(self.device, torch.bool))
        if steps is None:
            steps = torch.zeros(self.num_envs, dtype=torch.int64)
        steps = torch.as_tensor(steps)
        if tuple(steps.shape) != (self.num_envs,) or steps.is_floating_point() or steps.dtype == torch.bool:
            raise ValueError(f"steps must be [{self.num_envs}] integers, got {steps.dtype} {list(steps.shape)}")
        if ((steps < 0) | (steps >= self.max_steps)).any():
            raise ValueError(f"steps must be in [0, {self.max_steps}), got {int(steps.min())} to {int(steps.max())}")
        self.state.copy_(bits[0])
        self.goal.copy_(bits[1])
        self.steps.copy_(steps.to(self.device, torch.int64))

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.clone(), "goal": self.goal.clone(), "steps": self.steps.clone()}
        if self._rng.owned:
            out["generator"] = self._rng.generator.get_state()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_state(state["state"], state["goal"], state["steps"])
        if self._rng.owned and "generator" in state:
            self._rng.generator.set_state(state["generator"])


def make_bitflip(bits: str, num_envs: int, device: torch.device | str, seed: int = 0, **kwargs: Any) -> BitFlip:
    """``bitflip:<bits>``: a :class:`BitFlip` of ``int(bits)`` bits (``kwargs`` go to it)."""
    if not re.fullmatch(r"[0-9]+", bits) or not 1 <= int(bits) <= MAX_BITS:
        raise ValueError(f"bitflip:<N> takes a number of bits N from 1 to {MAX_BITS}, got {f'bitflip:{bits}'!r}")
    return BitFlip(int(bits), num_envs, device, seed=seed, **kwargs)


# The trainer's presets (gper.envs.registry.PRESETS), a line per concern as cartpole's: episodes of N
# steps, one update per collection step of 16 episodes.
# fmt: off
SPEC = EnvSpec(
    "bitflip:<N>",
    make_bitflip,
    help="the bit-flipping task of hindsight replay, N bits",
    goal=True,
    presets={
        "cuda": dict(
            total_steps=1_000_000, num_envs=16, hidden=(256,), buffer_size=2**20, batch_size=1024,
            learning_rate=1e-3, max_grad_norm=0.0, tau=0.05, target_every=1, eps_end=0.2,
            exploration_fraction=0.05, learning_starts=4096, epoch_steps=50_000, solve_return=None, weight_norm="batch",
        ),
        "cpu": dict(total_steps=300_000, batch_size=256),
    },
)
# fmt: on
