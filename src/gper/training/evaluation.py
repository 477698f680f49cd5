"""Episodes of a fixed policy on a vectorized environment: one episode per copy, from a seeded reset.

:func:`run_episodes` takes any environment with the ``reset(seed)`` / ``step(actions)`` interface of
:class:`gper.envs.base.VecEnv` (copies reset automatically when an episode ends) and a policy
(observations -> actions, on the environment's device). Every copy plays its first episode; a copy
whose episode has ended goes on stepping with the others (the batch keeps its shape) but counts
no more. This is evaluation, outside the training step's CUDA graphs: the host checks every
``check_every`` steps whether all episodes have ended (one synchronisation each time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def run_episodes(
    policy: Callable[[torch.Tensor], torch.Tensor],
    env: Any,
    seed: int | None,
    max_steps: int = 100_000,
    check_every: int = 32,
    with_terminated: bool = False,
) -> tuple[list[float], list[int]] | tuple[list[float], list[int], list[bool]]:
    """Play one episode on each of ``env.num_envs`` copies with ``policy``, from ``env.reset(seed)``.

    Args:
        policy: float32 observations ``[N, obs_dim]`` -> int64 actions ``[N]``; run under ``torch.no_grad``.
        env: the environment (see the module docstring); its own random numbers only, so the
            caller's generators are untouched when it owns its generator.
        seed: passed to ``env.reset``: the same seed, the same episodes for the same policy.
        max_steps: stop after this many steps; an episode still running then counts with its
            return and length so far.
        check_every: steps between the host's checks for the end.
        with_terminated: also return whether each episode ended terminated (a goal task: reached
            its goal) rather than truncated or still running.

    Returns:
        (returns, lengths): one float and one int per copy; with ``with_terminated``,
        (returns, lengths, terminated) with one bool per copy.
    """
    obs = env.reset(seed=seed)
    n, device = env.num_envs, obs.device
    returns = torch.zeros(n, dtype=torch.float64, device=device)
    lengths = torch.zeros(n, dtype=torch.int64, device=device)
    running = torch.ones(n, dtype=torch.bool, device=device)
    terminated = torch.zeros(n, dtype=torch.bool, device=device)
    with torch.no_grad():
        for t in range(1, max_steps + 1):
            step = env.step(policy(obs))
            returns += step.reward.to(torch.float64) * running
            lengths += running
            terminated |= running & step.terminated
            running &= ~(step.terminated | step.truncated)
            obs = step.obs
            if t % check_every == 0 and not bool(running.any()):
                break
    if with_terminated:
        return returns.tolist(), lengths.tolist(), terminated.tolist()
    return returns.tolist(), lengths.tolist()
