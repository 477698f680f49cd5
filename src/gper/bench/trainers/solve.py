"""When a run first reached its goal, from the per-step episode records a trainer returns: the
env step at which the mean return of the last 100 finished episodes first reached ``goal``
(CartPole-v1: 475), counted as ``gper train`` counts it (:mod:`gper.training.report`): windows of
exactly 100 episodes, in the order they finished, the solve step being the step at which the
window's last episode finished.

Plain NumPy: the arrays come back from JAX (PureJaxRL's metrics) but nothing here imports it.
"""

from __future__ import annotations

import numpy as np

#: CartPole-v1's "solved" threshold (its reward_threshold), the goal both trainers are timed to
GOAL = 475.0
#: episodes in the window whose mean is compared with the goal
WINDOW = 100


def finished_episodes(done: np.ndarray, returns: np.ndarray, timesteps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The returns of one seed's finished episodes in the order they finished, and the env step of each.

    Args:
        done: [T, E] bool, true where env ``e`` finished an episode at update ``t``.
        returns: [T, E] float, the return of the episode that finished there (read where ``done`` only).
        timesteps: [T] int, env steps done (all envs together) after update ``t``.

    Episodes that finish at the same update are taken in env order (row-major order of ``done``).
    """
    done, returns, timesteps = np.asarray(done, bool), np.asarray(returns), np.asarray(timesteps)
    if done.ndim != 2 or returns.shape != done.shape or timesteps.shape != done.shape[:1]:
        raise ValueError(
            f"expected done and returns [T, E] and timesteps [T], got {done.shape}, {returns.shape}, {timesteps.shape}"
        )
    t, _ = np.nonzero(done)
    return returns[done].astype(np.float64), timesteps[t]


def first_solve_step(
    done: np.ndarray, returns: np.ndarray, timesteps: np.ndarray, goal: float = GOAL, window: int = WINDOW
) -> int | None:
    """The env step at which the mean of the last ``window`` episodes first reached ``goal``; None if never.

    Arguments as :func:`finished_episodes` (one seed).
    """
    ep_returns, ep_steps = finished_episodes(done, returns, timesteps)
    if len(ep_returns) < window:
        return None
    # the windows' sums from one cumulative sum (float64: CartPole returns are small integers, so exact)
    csum = np.concatenate(([0.0], np.cumsum(ep_returns)))
    means = (csum[window:] - csum[:-window]) / window
    hit = np.flatnonzero(means >= goal)
    return int(ep_steps[hit[0] + window - 1]) if hit.size else None


def solve_steps(
    done: np.ndarray, returns: np.ndarray, timesteps: np.ndarray, goal: float = GOAL, window: int = WINDOW
) -> list[int | None]:
    """:func:`first_solve_step` of each seed of ``vmap``-ed metrics: ``done`` and ``returns`` [S, T, E],
    ``timesteps`` [S, T]."""
    done, returns, timesteps = np.asarray(done), np.asarray(returns), np.asarray(timesteps)
    if done.ndim != 3 or timesteps.ndim != 2:
        raise ValueError(f"expected done [S, T, E] and timesteps [S, T], got {done.shape} and {timesteps.shape}")
    return [first_solve_step(done[s], returns[s], timesteps[s], goal, window) for s in range(done.shape[0])]


def time_to_solve_estimate(run_s: float, step: int | None, total_steps: int) -> float | None:
    """Seconds into a run of ``run_s`` at which env step ``step`` of ``total_steps`` was reached,
    assuming the run went at an even pace: ``run_s * step / total_steps``. An estimate: a run that
    is one compiled program reports no time until it ends (and compilation is not included)."""
    if step is None:
        return None
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    return run_s * step / total_steps
