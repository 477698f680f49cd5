"""What data-parallel DQN training accepts (the plumbing, the same for any algorithm, is
:mod:`gper.training.parallel`): the flat replay, sharded over the ranks, in proportional,
stratified or uniform sampling."""

from __future__ import annotations

from typing import Any

from gper.dqn.config import is_goal_env_name

#: why a data-parallel run refuses the trajectory replay
NO_TRAJECTORY = (
    "data-parallel training runs on the flat replay only: the sharded trajectory replay is not built yet "
    "(n_step 1, --replay flat or auto, no goal environment or --her, gym:<ID> with --gym-autoreset same-step)"
)


def check_settings(cfg: Any, world_size: int) -> None:
    """Refuse the settings a data-parallel run of ``world_size`` processes cannot train with (``cfg``
    resolved; one line each): the trajectory replay, rank sampling, a ``buffer_size`` that is not a
    multiple of the world size."""
    goal = is_goal_env_name(cfg.env)  # a goal task needs the trajectory replay
    if cfg.n_step > 1 or cfg.replay == "trajectory" or cfg.her != "none" or goal or cfg.gym_autoreset == "next-step":
        raise ValueError(NO_TRAJECTORY)
    if cfg.sampling == "rank":
        raise ValueError(
            "sampling rank is not supported by the sharded replay (a global rank needs a sort over every shard): "
            "use proportional, stratified or uniform"
        )
    if cfg.buffer_size % world_size:
        down = cfg.buffer_size - cfg.buffer_size % world_size or world_size
        raise ValueError(
            f"buffer_size {cfg.buffer_size} is not a multiple of the world size {world_size}: every rank holds "
            f"buffer_size / world_size slots (e.g. --buffer-size {down})"
        )
