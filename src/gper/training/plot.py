"""``plot.png`` of a run folder, drawn from its ``metrics.jsonl`` (:mod:`gper.training.runlog`).

Three panels against env steps: on top the training episodes' returns, their 100-episode mean,
the greedy evaluations (``eval/mean_return`` with ``eval/std_return`` as error bars) and the
environment's "solved" threshold with the step where the 100-episode mean first reached it, and
any published scores to compare with (``references``: a line, or a band where a range is given);
below, the losses (``losses/td_loss`` on a log scale, ``losses/q_values`` on its own axis) and
the per-phase times.

A population's record (``agent_<i>/charts/episodic_return``, :mod:`gper.training.population_report`)
draws, instead of the episodes and their mean, each agent's 100-episode mean as a thin line, the
interquartile mean across the agents as a bold one with the agents' interquartile range (25th to
75th percentile) as its band (a spread of the agents, not a confidence interval: that is
``summary.json``'s, by bootstrap), and the step where that IQM first reached ``solve_return``. The
IQM is taken at the epochs' ends (the steps of the ``charts/SPS`` records), from each agent's mean
of its last 100 episodes then: the values of the epoch records' ``charts/iqm_return_last100``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gper.training.population_stats import finite, iqm
from gper.training.runlog import read_metrics

#: the 100-episode window of the mean return (and of the solve point)
WINDOW = 100

#: a population's episode returns in ``metrics.jsonl``
AGENT_RETURN = re.compile(r"agent_(\d+)/charts/episodic_return")


#: a score to compare with: (label, low, high); a line where low == high, else a band
Reference = tuple[str, float, float]


def plot_run(
    metrics_path: str | Path,
    out: str | Path,
    title: str = "",
    solve_return: float | None = None,
    references: Sequence[Reference] = (),
) -> Path | None:
    """Draw the run whose ``metrics.jsonl`` is ``metrics_path`` into the PNG ``out``.

    Args:
        metrics_path: the run's ``metrics.jsonl``.
        out: the PNG to write.
        title: heads the figure (the environment, say).
        solve_return: the return at which the environment counts as solved: a horizontal line,
            and a vertical one where the mean of the last 100 episodes first reached it.
        references: published scores to draw beside the curve, each ``(label, low, high)``: a
            dash-dotted line where ``low == high``, else a grey band from ``low`` to ``high``
            (``("CleanRL dqn_atari.py after 10M env steps: 20.25 ± 0.41", 19.84, 20.66)``, say;
            a run's plot gets its environment's, :func:`gper.envs.registry.published`).

    Returns:
        The PNG's path, or None when matplotlib cannot be imported.
    """
    references = _check_references(references)
    try:
        import matplotlib  # noqa: F401 (the check: figure imports from it)
    except ImportError:
        return None
    out = Path(out)
    figure(read_metrics(metrics_path), title, solve_return, references).savefig(out, dpi=110)
    return out


def figure(
    rows: list[dict[str, Any]],
    title: str = "",
    solve_return: float | None = None,
    references: Sequence[Reference] = (),
) -> Any:
    """The matplotlib figure of :func:`plot_run` from the records ``rows`` of a ``metrics.jsonl``
    (its axes: return, losses, phase times; the losses' Q-value axis is a twin of the loss axis).
    A plain :class:`matplotlib.figure.Figure`: no pyplot, no backend, nothing global to close."""
    references = _check_references(references)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8.5))
    grid = fig.add_gridspec(2, 2, height_ratios=(3, 2))
    ax_ret = fig.add_subplot(grid[0, :])
    # one env-step axis for all three, so a step lines up across the panels
    ax_loss = fig.add_subplot(grid[1, 0], sharex=ax_ret)
    ax_time = fig.add_subplot(grid[1, 1], sharex=ax_ret)
    _returns(ax_ret, rows, solve_return, references)
    ax_ret.set_title(f"{title}: return" if title else "return")
    _losses(ax_loss, rows)
    _timing(ax_time, rows)
    fig.tight_layout()
    return fig


def _check_references(references: Sequence[Reference]) -> tuple[Reference, ...]:
    """``references`` as a tuple (an iterator is read once), each finite with ``low <= high``."""
    references = tuple(references)
    for label, low, high in references:
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"reference {label!r}: low {low} and high {high} must be finite with low <= high")
    return references


def _series(rows: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that hold a number under ``name``."""
    pts = [(r["global_step"], r[name]) for r in rows if r.get(name) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def population_agents(rows: list[dict[str, Any]]) -> list[int]:
    """The agents whose episodes ``rows`` hold (none for a single agent's record)."""
    # a record's names repeat (a population's run holds 10^6 episode records of a few hundred names):
    # each distinct name matched once
    agent_of: dict[str, int | None] = {}
    found = set()
    for r in rows:
        for k in r:
            if k not in agent_of:
                m = AGENT_RETURN.fullmatch(k)
                agent_of[k] = int(m.group(1)) if m else None
            if agent_of[k] is not None:
                found.add(agent_of[k])
    return sorted(found)


def _agent_series(rows: list[dict[str, Any]], agents: list[int]) -> list[tuple[list[int], list[float]]]:
    """:func:`_series` of each agent's episodic return, in one pass over ``rows``."""
    index = {f"agent_{agent}/charts/episodic_return": n for n, agent in enumerate(agents)}
    series: list[tuple[list[int], list[float]]] = [([], []) for _ in agents]
    for r in rows:
        for k, v in r.items():
            n = index.get(k)
            if n is not None and v is not None:
                series[n][0].append(r["global_step"])
                series[n][1].append(v)
    return series


def _running_means(returns: list[float]) -> list[float]:
    """The mean of the last ``WINDOW`` returns (fewer at the start) after each one (from one
    cumulative sum in float64: a plot's values, to rounding)."""
    import numpy as np

    sums = np.concatenate(([0.0], np.cumsum(np.asarray(returns, dtype=np.float64))))
    end = np.arange(1, len(returns) + 1)
    start = np.maximum(0, end - WINDOW)
    return ((sums[end] - sums[start]) / (end - start)).tolist()


def _returns(ax: Any, rows: list[dict[str, Any]], solve_return: float | None, references: Sequence[Reference]) -> None:
    agents = population_agents(rows)
    if agents:
        solved, what = _population(ax, rows, agents, solve_return)
    else:
        solved, what = _episodes(ax, rows, solve_return), f"mean of last {WINDOW}"
    ev_steps, ev_mean = _series(rows, "eval/mean_return")
    if ev_steps:
        std = [r.get("eval/std_return") or 0.0 for r in rows if r.get("eval/mean_return") is not None]
        episodes = next((r["eval/episodes"] for r in rows if r.get("eval/episodes")), None)
        label = "greedy evaluation" + (f" (mean ± std of {episodes:g} episodes)" if episodes else "")
        ax.errorbar(ev_steps, ev_mean, yerr=std, fmt="o-", ms=5, lw=1.5, capsize=3, color="tab:green", label=label)
    if solve_return is not None:
        ax.axhline(solve_return, ls="--", lw=1, color="tab:red", label=f"solved: {solve_return:g}")
        if solved is not None:
            ax.axvline(solved, ls=":", lw=1, color="tab:red", label=f"{what} reached it: {solved:,}")
    for label, low, high in references:
        if low == high:
            ax.axhline(low, ls="-.", lw=1.2, color="dimgray", label=label)
        else:
            ax.axhspan(low, high, alpha=0.2, color="gray", label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episodic return")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=9)


def _episodes(ax: Any, rows: list[dict[str, Any]], solve_return: float | None) -> int | None:
    """One agent's episodes and their 100-episode mean; the step where that first reached ``solve_return``."""
    steps, returns = _series(rows, "charts/episodic_return")
    if not steps:
        return None
    ax.plot(steps, returns, ".", ms=2, alpha=0.25, color="tab:blue", label="training episode")
    window = _running_means(returns)
    ax.plot(steps, window, "-", lw=2, color="tab:orange", label=f"mean of last {WINDOW}")
    if solve_return is None:
        return None
    return next((s for i, s in enumerate(steps) if i + 1 >= WINDOW and window[i] >= solve_return), None)


def _population(
    ax: Any, rows: list[dict[str, Any]], agents: list[int], solve_return: float | None
) -> tuple[int | None, str]:
    """A population's curves (see the module docstring); the epoch end where the IQM first
    reached ``solve_return``, and what reached it."""
    import numpy as np

    curves = []
    for n, (steps, returns) in enumerate(_agent_series(rows, agents)):
        curves.append((steps, _running_means(returns)))
        label = f"an agent's mean of last {WINDOW}" if n == 0 else None
        ax.plot(steps, curves[-1][1], "-", lw=0.7, alpha=0.45, color="tab:blue", label=label)
    grid, center, low, high = [], [], [], []
    for step in sorted({r["global_step"] for r in rows if "charts/SPS" in r}):
        # each agent's mean after its last episode at or before the epoch's end
        at = [window[i - 1] for steps, window in curves if (i := bisect.bisect_right(steps, step))]
        if finite(at):
            grid.append(step)
            center.append(iqm(at))
            low.append(float(np.percentile(at, 25)))
            high.append(float(np.percentile(at, 75)))
    what = f"IQM across {len(agents)} agents"
    if grid:
        ax.fill_between(grid, low, high, alpha=0.25, color="tab:orange", label="interquartile range of the agents")
        ax.plot(grid, center, "-", lw=2.5, color="tab:orange", label=what)
    if solve_return is None:
        return None, what
    return next((s for s, v in zip(grid, center, strict=True) if v >= solve_return), None), what


def _losses(ax: Any, rows: list[dict[str, Any]]) -> None:
    steps, loss = _series(rows, "losses/td_loss")
    kept = [(s, v) for s, v in zip(steps, loss, strict=True) if v > 0]  # a log scale: the epochs that trained
    lines = []
    if kept:
        lines += ax.plot([p[0] for p in kept], [p[1] for p in kept], "o-", ms=3, color="tab:blue", label="TD loss")
        ax.set_yscale("log")
    ax.set_ylabel("TD loss (× IS weight, mean per step)")
    q_steps, q = _series(rows, "losses/q_values")
    if q_steps:
        twin = ax.twinx()
        lines += twin.plot(q_steps, q, "s-", ms=3, color="tab:purple", label="mean Q-value")
        twin.set_ylabel("mean Q-value of the batch")
    ax.set_xlabel("env steps")
    ax.set_title("losses (mean over the epoch)")
    ax.grid(alpha=0.3)
    if lines:
        ax.legend(lines, [line.get_label() for line in lines], loc="best", fontsize=8)


def _timing(ax: Any, rows: list[dict[str, Any]]) -> None:
    names = sorted({k for r in rows for k in r if k.startswith("timing/")})
    for name in names:
        steps, ms = _series(rows, name)
        if steps:
            ax.plot(steps, ms, "o-", ms=3, label=name.removeprefix("timing/").removesuffix("_ms"))
    ax.set_xlabel("env steps")
    ax.set_ylabel("ms per step (mean over the epoch)")
    ax.set_title("phase times")
    ax.grid(alpha=0.3)
    if names:
        ax.legend(loc="best", fontsize=8)
