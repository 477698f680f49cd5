"""Any Gymnasium environment with a discrete action space, as a :class:`~gper.envs.base.VecEnv`.

The copies run on the CPU in one process (Gymnasium's ``SyncVectorEnv``); observations are
flattened to float32 vectors and moved to the training device, actions moved back. Every step
goes through the host, so this env is not graph safe.

Either of Gymnasium's autoreset modes (:attr:`~gper.envs.base.VecEnv.autoreset`):

- ``same-step`` (the default here, ``AutoresetMode.SAME_STEP``): an ended copy is reset in the
  step that ended it, and its last observation comes in ``info["final_obs"]``: exactly the
  ``next_obs``/``obs`` split of :class:`~gper.envs.base.Step`.
- ``next-step`` (``AutoresetMode.NEXT_STEP``, Gymnasium's own default): the step that ends an
  episode returns its final observation as both ``next_obs`` and ``obs``; the copy's next step
  is a reset step (its action ignored, reward 0, flags false, ``next_obs`` = ``obs`` = the new
  episode's first observation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gper.envs.base import AUTORESET_MODES, Autoreset, Step, VecEnv, canonical_device
from gper.envs.registry import EnvSpec, UnknownEnvironment


def _import_gymnasium(env_id: str):
    try:
        import gymnasium
    except ImportError as e:
        raise ImportError(f'gym:{env_id} needs Gymnasium: pip install ".[gym]"') from e
    return gymnasium


class GymVecEnv(VecEnv):
    """``num_envs`` copies of the Gymnasium environment ``env_id``, stepped on the CPU.

    Args:
        env_id: a registered Gymnasium id, e.g. "CartPole-v1".
        num_envs: copies stepped together.
        device: where observations, rewards and flags are returned.
        seed: seeds copy ``i`` with ``seed + i`` at construction (and at ``reset(seed)``).
        autoreset: ``"same-step"`` or ``"next-step"`` (see the module docstring).
        make_kwargs: passed to the environment's constructor through ``gymnasium.make_vec``.
    """

    graph_safe = False

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        autoreset: Autoreset = "same-step",
        **make_kwargs: Any,
    ) -> None:
        if autoreset not in AUTORESET_MODES:
            raise ValueError(f"autoreset must be one of {', '.join(AUTORESET_MODES)}, got {autoreset!r}")
        gym = _import_gymnasium(env_id)
        self.name = f"gym:{env_id}"
        self.num_envs = num_envs
        self.device = canonical_device(device)
        self.autoreset = autoreset
        mode = gym.vector.AutoresetMode.SAME_STEP if autoreset == "same-step" else gym.vector.AutoresetMode.NEXT_STEP
        try:
            self._env = gym.make_vec(
                env_id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": mode},
                **make_kwargs,
            )
        except gym.error.Error as e:
            raise ValueError(f"cannot make Gymnasium environment {env_id!r}: {e}") from e
        space = self._env.single_action_space
        if not isinstance(space, gym.spaces.Discrete):
            self._env.close()
            raise ValueError(f"gym:{env_id} has action space {space}: only Discrete action spaces are supported")
        self._gym = gym
        spec = getattr(self._env, "spec", None)  # the registered id's, as make_vec found it
        threshold = getattr(spec, "reward_threshold", None)
        self.reward_threshold = None if threshold is None else float(threshold)
        self._obs_space = self._env.single_observation_space
        self._action_start = int(space.start)
        self.n_actions = int(space.n)
        self.obs_dim = gym.spaces.flatdim(self._obs_space)
        self.reset(seed)

    def _flat(self, batch: Any) -> np.ndarray:
        """A batch of observations as a float32 array ``[N, obs_dim]``."""
        if isinstance(self._obs_space, self._gym.spaces.Box):
            return np.asarray(batch, dtype=np.float32).reshape(self.num_envs, -1)
        items = self._gym.vector.utils.iterate(self._env.observation_space, batch)
        return np.stack([self._gym.spaces.flatten(self._obs_space, o) for o in items]).astype(np.float32)

    def _tensor(self, array: np.ndarray, dtype: np.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array, dtype=dtype)).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        seeds = None if seed is None else [seed + i for i in range(self.num_envs)]
        obs, _ = self._env.reset(seed=seeds)
        return self._tensor(self._flat(obs), np.float32)

    def step(self, actions: torch.Tensor) -> Step:
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must be [{self.num_envs}], got {list(actions.shape)}")
        host_actions = actions.detach().cpu().numpy().astype(np.int64) + self._action_start
        obs, reward, terminated, truncated, info = self._env.step(host_actions)
        obs = self._flat(obs)
        next_obs = obs.copy()
        if self.autoreset == "same-step":  # next-step: obs is the final observation itself
            for i in np.flatnonzero(np.logical_or(terminated, truncated)):
                next_obs[i] = self._gym.spaces.flatten(self._obs_space, info["final_obs"][i])
        return Step(
            self._tensor(next_obs, np.float32),
            self._tensor(reward, np.float32),
            self._tensor(terminated, np.bool_),
            self._tensor(truncated, np.bool_),
            self._tensor(obs, np.float32),
        )

    def close(self) -> None:
        self._env.close()


def make_gym(env_id: str, num_envs: int, device: torch.device | str, seed: int = 0, **kwargs: Any) -> GymVecEnv:
    """``gym:<env_id>``: a :class:`GymVecEnv` of ``env_id`` (``kwargs`` go to it)."""
    if not env_id:
        raise UnknownEnvironment("gym:")
    return GymVecEnv(env_id, num_envs, device, seed=seed, **kwargs)


# The trainer's presets (gper.envs.registry.PRESETS), a line per concern as cartpole's.
# fmt: off
SPEC = EnvSpec(
    "gym:<ID>",
    make_gym,
    help="a Gymnasium id with discrete actions, stepped on the CPU",
    autoreset=("same-step", "next-step"),
    graph_safe_rng=False,
    own_defaults={"solve_return": "Gymnasium's reward_threshold for the id, if it has one"},
    presets={
        "cuda": dict(
            total_steps=500_000, num_envs=4, hidden=(256, 256), buffer_size=200_000, batch_size=128,
            learning_rate=2.5e-4, max_grad_norm=10.0, tau=1.0, target_every=500, eps_end=0.05, exploration_fraction=0.2,
            learning_starts=10_000, epoch_steps=10_000, solve_return=None, weight_norm="global",
        ),
        "cpu": {},
    },
)
# fmt: on
