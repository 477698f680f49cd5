"""The statistics of a population (N agents trained together): the agents' 100-episode means
aggregated, the way the field reports many runs (Agarwal et al., *Deep Reinforcement Learning at
the Edge of the Statistical Precipice*, NeurIPS 2021).

- :func:`iqm`: the interquartile mean, rliable's ``metrics.aggregate_iqm``: SciPy's
  ``trim_mean(x, 0.25)``, the mean of what is left after ``floor(n / 4)`` values are cut from
  each end of the sorted values. Plain Python here: the epoch line reports it without the
  optional extra.
- :func:`iqm_interval`: its 95% confidence interval by rliable's stratified bootstrap
  (``rly.get_interval_estimates``, percentile method), over the agents as runs of one task.
  rliable is the optional extra ``.[stats]``, imported only here; without it (or when it fails,
  as rliable 1.2 does with arch 8) the summary says the interval is left out and why.
- :func:`population_summary`: the ``population`` entry of ``summary.json``.

Agents without a finished episode have no mean (NaN): they count in ``agents`` but not in the
aggregates, whose ``agents_counted`` says how many went in.
"""

from __future__ import annotations

import math
from typing import Any

#: bootstrap replications of the interval (rliable's default is 50000: seconds for nothing at
#: a population's handful of agents, whose interval is already stable to a few parts in a thousand)
REPS = 10_000

#: the interval's coverage
CONFIDENCE = 0.95

#: the extra that brings rliable
INSTALL_STATS = 'pip install ".[stats]"'


def finite(values: list[float]) -> list[float]:
    """The values that are numbers (the agents that have a mean)."""
    return [v for v in values if v is not None and math.isfinite(v)]


def iqm(values: list[float]) -> float:
    """The interquartile mean of the finite ``values`` (NaN when there are none): as SciPy's
    ``trim_mean(values, 0.25)``, which rliable's ``aggregate_iqm`` is."""
    kept = sorted(finite(values))
    if not kept:
        return math.nan
    cut = int(0.25 * len(kept))  # floor, as trim_mean cuts: 4 values keep 2, 5 keep 3, 8 keep 4
    middle = kept[cut : len(kept) - cut]
    return sum(middle) / len(middle)


def mean(values: list[float]) -> float:
    """The mean of the finite ``values`` (NaN when there are none)."""
    kept = finite(values)
    return sum(kept) / len(kept) if kept else math.nan


def median(values: list[float]) -> float:
    """The median of the finite ``values`` (NaN when there are none)."""
    kept = sorted(finite(values))
    if not kept:
        return math.nan
    mid = len(kept) // 2
    return kept[mid] if len(kept) % 2 else (kept[mid - 1] + kept[mid]) / 2


def iqm_interval(values: list[float], seed: int = 0, reps: int = REPS) -> tuple[list[float] | None, str]:
    """The IQM's ``CONFIDENCE`` interval over the finite ``values`` (one per agent) by rliable's
    stratified bootstrap, seeded with ``seed``: ([low, high], how it was computed), or (None, why
    it was left out)."""
    kept = finite(values)
    if len(kept) < 2:
        return None, f"left out: {len(kept)} agent(s) with a mean, a bootstrap needs 2 or more"
    try:
        import numpy as np
        from rliable import library as rly
        from rliable import metrics
    except ImportError as err:
        return None, f"left out: it needs rliable ({err}): {INSTALL_STATS}"
    scores = {"population": np.asarray(kept, dtype=np.float64)[:, None]}  # runs x tasks: agents x 1
    try:
        _, intervals = rly.get_interval_estimates(
            scores,
            lambda x: np.array([metrics.aggregate_iqm(x)]),
            reps=reps,
            confidence_interval_size=CONFIDENCE,
            random_state=np.random.RandomState(seed),
        )
    except Exception as err:  # a broken install (rliable 1.2 under arch 8) must not lose the run's summary
        return None, f"left out: rliable failed: {type(err).__name__}: {err}"
    low, high = (float(v) for v in np.asarray(intervals["population"]).reshape(2))
    return [low, high], f"rliable stratified bootstrap, percentile method, {reps} replications, seed {seed}"


def population_summary(
    means: list[float], solved_steps: list[int | None], solve_return: float | None, seed: int = 0
) -> dict[str, Any]:
    """The aggregate of the agents' final 100-episode ``means`` (one per agent, NaN for an agent
    without episodes) and their solve points ``solved_steps`` (env step or None)."""
    interval, how = iqm_interval(means, seed)
    return {
        "agents": len(means),
        "agents_counted": len(finite(means)),
        "mean_return_last100": mean(means),
        "median_return_last100": median(means),
        "iqm_return_last100": iqm(means),
        "iqm_ci95": interval,
        "iqm_ci": how,
        "solve_return": solve_return,
        "agents_solved": sum(step is not None for step in solved_steps),
    }
