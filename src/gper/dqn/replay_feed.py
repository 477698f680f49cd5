"""The replay as the learner sees it: a :class:`ReplayFeed`, whichever buffer is behind it.

A feed tells the agent how to add one collected step to its replay, how to draw a batch, how to
lay a batch out as the learner's inputs and bootstrap its TD target, and how to update the
priorities of the drawn rows. :func:`replay_feed` picks the feed for a buffer:

- :class:`FlatFeed`: a :class:`gper.PrioritizedReplayBuffer` or a
  :class:`~gper.distributed.ShardedPrioritizedReplayBuffer` (the same API), one transition a row
  with its done flag; the target is ``r + gamma (1 - done) Q'(s')``.
- :class:`TrajectoryFeed`: a :class:`gper.TrajectoryReplayBuffer`, each environment's steps in
  order; the batch holds the discounted sum ``R`` of up to ``n_step`` rewards and ``discount`` =
  gamma^m (0 where the episode terminated); the target is ``R + discount Q'(s_m)``.
- :class:`GoalTrajectoryFeed`: the trajectory replay of a goal task (hindsight relabelling), whose
  steps go to the replay as observation, achieved and desired goal, and whose learner input is the
  drawn observation beside the drawn (possibly relabelled) desired goal.

The feeds use the buffers' public methods only. ``add`` and ``sample`` run inside the captured
collect and learn steps (CUDA graphs): they launch device work and read nothing back; the flat
feed keeps its done flags and gamma apart (not a precomputed discount) because the loss and the
fused kernel make ``gamma (1 - done)`` themselves, which keeps the trained parameters bit for bit.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

import gper
from gper.distributed import ShardedPrioritizedReplayBuffer
from gper.dqn.batch_source import Batch
from gper.dqn.config import Config
from gper.dqn.network import GOAL_OBS_KEYS, padded_width
from gper.envs import GoalEnv, Step, VecEnv, is_goal_env

#: the replays an agent learns from
Replay = gper.PrioritizedReplayBuffer | gper.TrajectoryReplayBuffer | ShardedPrioritizedReplayBuffer


class LearnerInputs(Protocol):
    """Where a feed lays out a batch for the learner (:class:`gper.dqn.LearnState` is one)."""

    x: torch.Tensor | None
    """observations [B, obs_width], the network's input"""
    next_x: torch.Tensor | None
    """next observations [B, obs_width]"""
    action: torch.Tensor | None
    """int64 actions [B]"""
    reward: torch.Tensor | None
    """rewards [B] (from the trajectory replay, n-step discounted sums)"""
    done: torch.Tensor | None
    """flat replay: 1.0 where the episode terminated [B]; None from the trajectory replay"""
    discount: torch.Tensor | None
    """trajectory replay: gamma^m [B], 0 where the episode terminated; None from the flat replay"""
    weights: torch.Tensor | None
    """IS weights [B]"""


@runtime_checkable
class ReplayFeed(Protocol):
    """The replay as the learner sees it: the one interface :class:`gper.dqn.Agent` uses.
    ``isinstance(x, ReplayFeed)`` checks that ``x`` has its members, not their signatures."""

    replay: Replay
    """the buffer behind the feed (its checkpoint, its back end)"""
    collect_warmup: int
    """eager collect steps before the collect step may be captured in a CUDA graph"""
    goal_env: GoalEnv | None
    """the goal task whose observations the replay holds in parts, or None"""

    def add(self, obs: torch.Tensor, action: torch.Tensor, step: Step, next_obs: torch.Tensor) -> None:
        """Add one collected step of every environment: ``obs`` and ``next_obs`` [N, obs_width]
        (padded), ``action`` [N], and the environment's ``step`` (reward and episode flags)."""

    def sample(self, batch_size: int, beta: torch.Tensor) -> Batch:
        """Draw ``batch_size`` rows with IS exponent ``beta`` (a 0-d device tensor)."""

    def upload(self, batch: Batch, inputs: LearnerInputs) -> None:
        """Lay ``batch`` (a draw of this feed's, or a batch of the same fields) out in ``inputs``:
        views of the batch's tensors where it can, no kernel."""

    def target(self, inputs: LearnerInputs, next_q: torch.Tensor) -> torch.Tensor:
        """The TD target of :meth:`upload`'s ``inputs`` from the bootstrap values ``next_q`` [B]."""

    def loss_discount(self, inputs: LearnerInputs) -> tuple[torch.Tensor, float | None]:
        """``(discount, gamma)`` as :func:`gper.dqn.fused_loss.td_loss` takes them."""

    def update_priorities(self, batch: Batch, td: torch.Tensor) -> None:
        """Priorities of ``batch``'s rows (a draw of :meth:`sample`) from their TD errors ``td``."""


class FlatFeed:
    """A :class:`gper.PrioritizedReplayBuffer` or a :class:`~gper.distributed.ShardedPrioritizedReplayBuffer`:
    one transition a row, 1-step targets. Not for ``n_step`` > 1, nor for an environment whose
    ``autoreset`` is ``next-step`` (a transition cannot tell its reset step)."""

    collect_warmup = 3
    goal_env = None

    def __init__(self, rb: gper.PrioritizedReplayBuffer | ShardedPrioritizedReplayBuffer, cfg: Config, env: VecEnv):
        if cfg.n_step > 1:
            raise ValueError(f"n_step {cfg.n_step} needs a TrajectoryReplayBuffer, got {type(rb).__name__}")
        if env.autoreset == "next-step":
            raise ValueError(
                f"{env.name} resets on the next step, which a {type(rb).__name__} cannot tell from a "
                "transition: use a TrajectoryReplayBuffer"
            )
        self.replay, self.gamma = rb, cfg.gamma

    def add(self, obs: torch.Tensor, action: torch.Tensor, step: Step, next_obs: torch.Tensor) -> None:
        # only termination stops bootstrapping: a truncated step's next_obs is the final observation
        done = step.terminated.to(torch.float32)
        self.replay.add({"obs": obs, "next_obs": next_obs, "action": action, "reward": step.reward, "done": done})

    def sample(self, batch_size: int, beta: torch.Tensor) -> Batch:
        return self.replay.sample(batch_size, beta=beta)

    def upload(self, batch: Batch, inputs: LearnerInputs) -> None:
        inputs.x, inputs.next_x = batch["obs"], batch["next_obs"]
        inputs.action, inputs.reward, inputs.weights = batch["action"], batch["reward"], batch.weights
        inputs.done = batch["done"]

    def target(self, inputs: LearnerInputs, next_q: torch.Tensor) -> torch.Tensor:
        return inputs.reward + self.gamma * (1.0 - inputs.done) * next_q

    def loss_discount(self, inputs: LearnerInputs) -> tuple[torch.Tensor, float | None]:
        return inputs.done, self.gamma  # the kernel makes gamma (1 - done) from the done flags

    def update_priorities(self, batch: Batch, td: torch.Tensor) -> None:
        self.replay.update_priorities(batch, td)


class TrajectoryFeed:
    """A :class:`gper.TrajectoryReplayBuffer`: each environment's steps in order, ``cfg.n_step``-step
    targets discounted by ``cfg.gamma``. Its ``num_envs`` is the environment's (unless the agent
    only learns: ``collects`` False) and its ``window`` at least ``cfg.n_step``."""

    goal_env: GoalEnv | None = None

    def __init__(self, rb: gper.TrajectoryReplayBuffer, cfg: Config, env: VecEnv, *, collects: bool = True):
        if collects and rb.num_envs != env.num_envs:
            raise ValueError(
                f"the TrajectoryReplayBuffer has {rb.num_envs} streams, the environment {env.num_envs} copies"
            )
        if rb.window < cfg.n_step:
            raise ValueError(f"the TrajectoryReplayBuffer's window {rb.window} is shorter than n_step {cfg.n_step}")
        if is_goal_env(env) and rb.obs_keys != GOAL_OBS_KEYS:
            raise ValueError(
                f"{env.name} is a goal task: its TrajectoryReplayBuffer needs obs_keys {GOAL_OBS_KEYS} "
                f"(gper.dqn.build_replay makes one), got {rb.obs_keys}"
            )
        self.replay, self.n_step, self.gamma = rb, cfg.n_step, cfg.gamma
        # the buffer counts its adds on the host (sampling needs window + 1 of them), and replays of
        # the collect graph add steps that the host does not see: enough eager steps first
        self.collect_warmup = max(3, rb.window + 1)

    def add(self, obs: torch.Tensor, action: torch.Tensor, step: Step, next_obs: torch.Tensor) -> None:
        # one step of every stream: the buffer reads episode ends and reset steps from the flags
        # and from whether obs continues the stream's last next_obs, on the device
        fields = self._step_fields({"obs": obs, "action": action, "reward": step.reward, "next_obs": next_obs})
        self.replay.add(fields | {"terminated": step.terminated, "truncated": step.truncated})

    def _step_fields(self, fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return fields

    def sample(self, batch_size: int, beta: torch.Tensor) -> Batch:
        return self.replay.sample(batch_size, n_step=self.n_step, gamma=self.gamma, beta=beta)

    def upload(self, batch: Batch, inputs: LearnerInputs) -> None:
        inputs.x, inputs.next_x = self._network_inputs(batch)
        inputs.action, inputs.reward, inputs.weights = batch["action"], batch["reward"], batch.weights
        inputs.discount = batch["discount"]

    def _network_inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["obs"], batch["next_obs"]

    def target(self, inputs: LearnerInputs, next_q: torch.Tensor) -> torch.Tensor:
        # R + gamma^m Q'(s_m), 0 in place of gamma^m where it terminated
        return inputs.reward + inputs.discount * next_q

    def loss_discount(self, inputs: LearnerInputs) -> tuple[torch.Tensor, float | None]:
        return inputs.discount, None

    def update_priorities(self, batch: Batch, td: torch.Tensor) -> None:
        self.replay.update_priorities(batch, td)


class GoalTrajectoryFeed(TrajectoryFeed):
    """The trajectory replay of a goal task: a step goes to the replay as observation, achieved and
    desired goal (the fields hindsight relabelling reads and rewrites); the learner's input is the
    drawn observation beside the drawn desired goal (relabelled where hindsight chose one), laid
    out as the environment's observation and padded to the network's width."""

    def __init__(self, rb: gper.TrajectoryReplayBuffer, cfg: Config, env: GoalEnv, *, collects: bool = True):
        super().__init__(rb, cfg, env, collects=collects)
        self.goal_env, self.obs_dim, self.obs_width = env, env.obs_dim, padded_width(env.obs_dim)

    def _step_fields(self, fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {"action": fields["action"], "reward": fields["reward"]}
        for prefix, key in (("", "obs"), ("next_", "next_obs")):
            parts = self.goal_env.split_goal_obs(fields[key][:, : self.obs_dim])
            for name, part in zip(GOAL_OBS_KEYS, parts, strict=True):
                out[prefix + name] = part.contiguous()
        return out

    def _network_inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        obs = self._input(batch["obs"], batch["desired_goal"])
        return obs, self._input(batch["next_obs"], batch["next_desired_goal"])

    def _input(self, obs: torch.Tensor, desired_goal: torch.Tensor) -> torch.Tensor:
        x = torch.cat((obs, desired_goal), dim=1)
        return F.pad(x, (0, self.obs_width - x.shape[1]))


def replay_feed(cfg: Config, env: VecEnv, rb: Replay, *, collects: bool = True) -> ReplayFeed:
    """The feed of ``rb`` for an agent with settings ``cfg`` on ``env``; refuses (one line) a replay
    that cannot serve them. ``collects`` False: the agent only learns, so the trajectory replay's
    streams need not match the environment's copies."""
    if not isinstance(rb, gper.TrajectoryReplayBuffer):
        return FlatFeed(rb, cfg, env)
    if is_goal_env(env):
        return GoalTrajectoryFeed(rb, cfg, env, collects=collects)
    return TrajectoryFeed(rb, cfg, env, collects=collects)


__all__ = ["FlatFeed", "GoalTrajectoryFeed", "LearnerInputs", "Replay", "ReplayFeed", "TrajectoryFeed", "replay_feed"]
