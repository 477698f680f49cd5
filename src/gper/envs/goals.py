"""Goal-conditioned environments: the layout of their observations and their reward as a function of goals.

Hindsight experience replay (Andrychowicz et al. 2017, arXiv 1707.01495) stores a transition once
and, when it samples it, may swap the goal it was collected for with one reached later in the same
episode. Doing so needs three things of the environment, which :class:`GoalEnv` provides:

- where the goal sits in an observation. The convention of :mod:`gper.envs`: an observation is
  ``cat(observation_part, desired_goal)`` along its last dimension, float32, so the desired goal
  is the **last** :attr:`GoalEnv.goal_dim` entries and a relabelled observation is the same
  observation with those entries replaced (:meth:`GoalEnv.with_desired_goal`);
- the goal that an observation has reached (its *achieved goal*), a function of the observation
  part alone (:meth:`GoalEnv.achieved_goal`);
- the reward and the termination flag as pure functions of an achieved and a desired goal
  (:meth:`GoalEnv.compute_reward`, :meth:`GoalEnv.compute_terminated`), equal to what
  :meth:`~gper.envs.base.VecEnv.step` returns for the achieved goal of its ``next_obs`` and the
  goal that step was collected for.

All of these are torch functions of tensors of any leading shape, run on the tensors' device,
with no host synchronisation and no branching on tensor values, so a replay can call them inside
a captured CUDA graph.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

#: extra tensors a goal reward may need beside the goals (``info`` of Gymnasium's ``GoalEnv``)
GoalInfo = Mapping[str, torch.Tensor]


class GoalEnv(ABC):
    """Mixin of a goal-conditioned :class:`~gper.envs.base.VecEnv` (see the module docstring).

    A subclass sets :attr:`goal_dim` and implements :meth:`achieved_goal`, :meth:`compute_reward`
    and :meth:`compute_terminated`; :meth:`split_goal_obs` and :meth:`with_desired_goal` follow
    from the observation layout. An episode *succeeds* when it terminates: ``compute_terminated``
    of its last step is true.
    """

    goal_dim: int
    """Entries of a goal; the last ``goal_dim`` entries of an observation are its desired goal."""

    @abstractmethod
    def achieved_goal(self, observation: torch.Tensor) -> torch.Tensor:
        """The goal reached in ``observation`` (float32 ``[..., obs_dim - goal_dim]``, the part before
        the desired goal); returns float32 ``[..., goal_dim]``."""

    @abstractmethod
    def compute_reward(
        self, achieved_goal: torch.Tensor, desired_goal: torch.Tensor, info: GoalInfo | None = None
    ) -> torch.Tensor:
        """The reward of a step that reached ``achieved_goal`` while after ``desired_goal``.

        Args:
            achieved_goal: ``[..., goal_dim]``, the achieved goal of the step's ``next_obs``.
            desired_goal: ``[..., goal_dim]``, the goal the step is credited towards.
            info: extra tensors of the same leading shape, where the environment needs them.

        Returns:
            float32 ``[...]``, equal to :meth:`~gper.envs.base.VecEnv.step`'s ``reward`` for the
            same goals.
        """

    @abstractmethod
    def compute_terminated(
        self, achieved_goal: torch.Tensor, desired_goal: torch.Tensor, info: GoalInfo | None = None
    ) -> torch.Tensor:
        """Whether a step that reached ``achieved_goal`` while after ``desired_goal`` ends its episode
        in a terminal state: bool ``[...]``, equal to ``step``'s ``terminated`` (arguments as
        :meth:`compute_reward`)."""

    def split_goal_obs(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``obs`` (``[..., obs_dim]``) as ``(observation, achieved_goal, desired_goal)``.

        ``observation`` is ``[..., obs_dim - goal_dim]`` and ``desired_goal`` ``[..., goal_dim]``,
        both views of ``obs``; ``achieved_goal`` is ``[..., goal_dim]`` (:meth:`achieved_goal`).
        """
        self._check_width(obs, "obs")
        observation, desired = obs[..., : -self.goal_dim], obs[..., -self.goal_dim :]
        return observation, self.achieved_goal(observation), desired

    def with_desired_goal(self, obs: torch.Tensor, desired_goal: torch.Tensor) -> torch.Tensor:
        """A new tensor: ``obs`` (``[..., obs_dim]``) with its desired goal replaced by ``desired_goal``
        (``[..., goal_dim]``, broadcast against ``obs``'s leading shape), in ``obs``'s dtype."""
        self._check_width(obs, "obs")
        if desired_goal.shape[-1:] != (self.goal_dim,):
            raise ValueError(f"desired_goal must be [..., {self.goal_dim}], got {list(desired_goal.shape)}")
        out = obs.clone()
        out[..., -self.goal_dim :] = desired_goal
        return out

    def _check_width(self, obs: torch.Tensor, what: str) -> None:
        # shapes are known on the host: checking them costs no synchronisation
        width = getattr(self, "obs_dim", None)
        if obs.dim() < 1 or obs.shape[-1] != width:
            raise ValueError(f"{what} must be [..., {width}], got {list(obs.shape)}")


def is_goal_env(env: object) -> bool:
    """Whether ``env`` is goal-conditioned (:class:`GoalEnv`), so hindsight relabelling applies to it."""
    return isinstance(env, GoalEnv)


__all__ = ["GoalEnv", "GoalInfo", "is_goal_env"]
