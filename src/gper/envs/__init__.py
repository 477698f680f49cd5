"""Vectorized environments for :mod:`gper.dqn`, made by name with :func:`make_env`.

- ``cartpole``: Gymnasium's ``CartPole-v1`` in PyTorch on the training device (:mod:`gper.envs.cartpole`).
- ``market``: a futures-style trading task on synthetic or CSV prices (:mod:`gper.envs.market`).
- ``bitflip:<N>``: the bit-flipping task of hindsight experience replay with ``N`` bits (1 to 1024),
  in PyTorch on the training device (:mod:`gper.envs.bitflip`); goal-conditioned, with the
  :class:`~gper.envs.goals.GoalEnv` protocol that hindsight relabelling uses (:mod:`gper.envs.goals`).
- ``gym:<ID>``: any Gymnasium environment with a discrete action space, stepped on the CPU through
  Gymnasium's vector API (:mod:`gper.envs.gym`), with either autoreset mode; needs ``pip install ".[gym]"``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from gper.envs.base import AUTORESET_MODES, Autoreset, Step, VecEnv
from gper.envs.goals import GoalEnv, is_goal_env

ENV_NAMES = ("cartpole", "market", "bitflip:<N>", "gym:<ID>")


def make_env(
    name: str,
    num_envs: int,
    device: torch.device | str,
    seed: int = 0,
    autoreset: Autoreset | None = None,
    **kwargs: Any,
) -> VecEnv:
    """Make ``num_envs`` copies of the environment ``name`` (see the module docstring) on ``device``.

    ``autoreset`` (:attr:`VecEnv.autoreset`): ``None`` for the environment's own, ``"same-step"``
    or ``"next-step"``; ``cartpole``, ``market`` and ``bitflip:<N>`` reset in the same step only. ``kwargs`` go to
    the environment's constructor (``market``: ``data``, ``split``, ...).
    """
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if autoreset is not None and autoreset not in AUTORESET_MODES:
        raise ValueError(f"autoreset must be one of {', '.join(AUTORESET_MODES)}, got {autoreset!r}")
    gym = name.startswith("gym:")
    if autoreset == "next-step" and not gym:
        raise ValueError(f"{name} resets in the same step only: next-step autoreset is for gym:<ID> environments")
    device = torch.device(device)
    if name == "cartpole":
        from gper.envs.cartpole import CartPole

        return CartPole(num_envs, device, seed=seed, **kwargs)
    if name == "market":
        from gper.envs.market import MarketEnv

        return MarketEnv.from_source(num_envs, device, seed=seed, **kwargs)
    if name.startswith("bitflip:"):
        from gper.envs.bitflip import MAX_BITS, BitFlip

        bits = name[len("bitflip:") :]
        if not re.fullmatch(r"[0-9]+", bits) or not 1 <= int(bits) <= MAX_BITS:
            raise ValueError(f"bitflip:<N> takes a number of bits N from 1 to {MAX_BITS}, got {name!r}")
        return BitFlip(int(bits), num_envs, device, seed=seed, **kwargs)
    if gym and len(name) > 4:
        from gper.envs.gym import GymVecEnv

        return GymVecEnv(name[4:], num_envs, device, seed=seed, autoreset=autoreset or "same-step", **kwargs)
    raise ValueError(f"unknown environment {name!r}: expected one of {', '.join(ENV_NAMES)}")


__all__ = ["AUTORESET_MODES", "ENV_NAMES", "Autoreset", "GoalEnv", "Step", "VecEnv", "is_goal_env", "make_env"]
