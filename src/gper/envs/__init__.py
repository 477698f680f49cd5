"""Vectorized environments for :mod:`gper.dqn`, made by name with :func:`make_env`.

Each is registered once (:mod:`gper.envs.registry`); built in:

- ``cartpole``: Gymnasium's ``CartPole-v1`` in PyTorch on the training device (:mod:`gper.envs.cartpole`).
- ``market``: a futures-style trading task on synthetic or CSV prices (:mod:`gper.envs.market`).
- ``bitflip:<N>``: the bit-flipping task of hindsight experience replay with ``N`` bits (1 to 1024),
  in PyTorch on the training device (:mod:`gper.envs.bitflip`); goal-conditioned, with the
  :class:`~gper.envs.goals.GoalEnv` protocol that hindsight relabelling uses (:mod:`gper.envs.goals`).
- ``gym:<ID>``: any Gymnasium environment with a discrete action space, stepped on the CPU through
  Gymnasium's vector API (:mod:`gper.envs.gym`), with either autoreset mode; needs ``pip install ".[gym]"``.
- ``atari:<Game>``: an Atari 2600 game on ale-py's C++ vector environment, 84 x 84 uint8 frames in
  stacks of 4 (:mod:`gper.envs.atari`); needs ``pip install ".[atari]"``.

``ENV_NAMES`` is the registered names and patterns at the time it is read.
"""

from __future__ import annotations

from gper.envs import atari, bitflip, cartpole, gym, market
from gper.envs.base import AUTORESET_MODES, Autoreset, Step, VecEnv
from gper.envs.goals import GoalEnv, is_goal_env
from gper.envs.registry import EnvSpec, UnknownEnvironment, env_names, lookup, make_env, register, unregister

# the order of the names in messages and help
for _spec in (cartpole.SPEC, market.SPEC, bitflip.SPEC, gym.SPEC, atari.SPEC):
    register(_spec)
del _spec


def __getattr__(name: str) -> object:
    if name == "ENV_NAMES":
        return env_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTORESET_MODES",
    "ENV_NAMES",
    "Autoreset",
    "EnvSpec",
    "GoalEnv",
    "Step",
    "UnknownEnvironment",
    "VecEnv",
    "env_names",
    "is_goal_env",
    "lookup",
    "make_env",
    "register",
    "unregister",
]
