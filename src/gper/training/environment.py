"""The environments of a run, from its settings and the registry (:mod:`gper.envs.registry`)."""

from __future__ import annotations

import torch

from gper._device import canonical_device
from gper.envs import VecEnv, make_env, registry
from gper.training.settings import RunSettings


def build_env(
    cfg: RunSettings, device: torch.device, split: str = "train", own_rng: bool = False, rank: int = 0
) -> VecEnv:
    """The environment of ``cfg`` on ``device`` (market: its ``split``). The training one draws from
    torch's default generator (seeded in the algorithm's setup), which a CUDA graph capture handles
    by itself, so replays draw fresh numbers; with ``own_rng`` it draws from a generator of its own
    (seeded by ``cfg.seed`` and by its ``reset(seed)``), leaving torch's untouched (evaluation).
    A data-parallel run's rank ``rank`` seeds it with ``cfg.seed + rank``, so the ranks' streams differ.

    An environment's registration may read settings of its own from ``cfg`` (the market's
    ``data``, ``episode_len``, ``cost_bps``, ``bars``, ``test_bars``; ``gym:<ID>``'s
    ``gym_autoreset``): ``gper.dqn.Config`` has them all, another algorithm's settings add those
    of the environments it trains on.

    Raises:
        ValueError: a ``data`` setting (``--data``) for an environment that reads no data; settings
            that lack one the environment reads; an unknown name.
    """
    spec = registry.lookup(cfg.env)  # None: make_env says it is unknown
    if getattr(cfg, "data", None) is not None and (spec is None or not spec.data):
        readers = " or ".join(s.name for s in registry.specs() if s.data)
        raise ValueError(f"--data is for the {readers} environment only")
    try:
        kwargs = spec.run_kwargs(cfg, split, own_rng) if spec is not None else {}
    except AttributeError as err:
        raise ValueError(
            f"{cfg.env} reads the setting {err.name!r}, which {type(cfg).__name__} lacks: add it to the settings"
        ) from None
    return make_env(cfg.env, cfg.num_envs, device, seed=cfg.seed + rank, **kwargs)


def pick_device(request: str) -> torch.device:
    """``auto`` -> the current CUDA device when there is one, else the CPU; ``cuda`` -> ``cuda:N``."""
    return canonical_device(request)
