"""``equity.png`` of a walk-forward report: cumulative out-of-sample log P&L of the policy,
buy-and-hold, flat and the classical baselines (and an ensemble's members, each alone) against the
dates of the bars, a thin line where each fold's test starts.

matplotlib comes with gper's ``train`` extra and is imported only here, when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gper._files import atomic_file
from gper.walkforward.baselines import BASELINES, LABELS
from gper.walkforward.outcome import FoldOutcome, in_time_order

#: the baselines' line colours
COLORS = {"long_only": "tab:green", "tsmom": "tab:purple", "macd": "tab:brown"}


def equity_figure(folds: list[FoldOutcome], title: str = "") -> Any:
    """Cumulative log P&L of the policy, buy-and-hold, flat and the baselines (where every fold holds
    them) over the folds' test bars in time order,
    against their dates, with a thin vertical line where each fold's test window starts, marked with
    the fold's index. A plain :class:`matplotlib.figure.Figure` on the Agg canvas: no pyplot, nothing
    global to close."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ordered = in_time_order(folds)
    dates = np.concatenate([f.time_ns for f in ordered]).astype("datetime64[ns]")
    fig = Figure(figsize=(11, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lines = [
        ("policy", "tab:blue", np.concatenate([f.policy_pnl for f in ordered])),
        ("buy-and-hold", "tab:orange", np.concatenate([f.hold_pnl for f in ordered])),
        ("flat", "tab:gray", np.zeros(len(dates))),
    ]
    for name in BASELINES:  # where every fold holds it
        if all(name in f.baselines for f in ordered):
            lines.append((LABELS[name], COLORS[name], np.concatenate([f.baselines[name][0] for f in ordered])))
    sizes = {None if f.members is None else f.members[0].shape[0] for f in ordered}
    if len(sizes) == 1 and None not in sizes:  # an ensemble: each member alone, thin, beneath the rest
        members = np.concatenate([f.members[0] for f in ordered], axis=1)
        for i, pnl in enumerate(members):
            label = f"members alone ({len(members)})" if i == 0 else None
            ax.plot(dates, np.cumsum(pnl), lw=0.5, alpha=0.35, color="tab:cyan", label=label, zorder=1)
        lines[0] = ("policy (the members' mean position)", "tab:blue", lines[0][2])
    for name, color, pnl in lines:
        width = 0.9 if name in LABELS.values() else 1.2
        ax.plot(dates, np.cumsum(pnl), lw=width, color=color, label=name)
    for i, fold in enumerate(ordered):
        start = np.datetime64(int(fold.time_ns[0]), "ns")
        ax.axvline(start, lw=0.6, ls=":", color="black", label="fold test start" if i == 0 else None)
        # the fold's index at the top of its line (x in data units, y in axes units)
        ax.text(start, 0.99, f" {fold.index}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel("cumulative log P&L after costs")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def write_equity_png(path: Path, folds: list[FoldOutcome], title: str = "") -> Path | None:
    """:func:`equity_figure` written to the PNG ``path``; None (and no file) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401 (the check: equity_figure imports from it)
    except ImportError:
        return None
    fig = equity_figure(folds, title)
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=110)
    return Path(path)
