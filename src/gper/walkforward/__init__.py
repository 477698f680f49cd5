"""Walk-forward evaluation over calendar folds: scores of per-bar log P&L, each fold's outcome, the
report of a run (``report.json``, ``report.md``, ``equity.png``) and the summary of several runs.

These modules need numpy only (matplotlib for the plot, when installed); importing the package
loads nothing else.
"""

from gper.walkforward.aggregate import aggregate, aggregate_markdown
from gper.walkforward.outcome import FoldOutcome, Window
from gper.walkforward.report import build_report, write_report
from gper.walkforward.scores import bars_per_year, buy_and_hold, pnl_scores

__all__ = [
    "FoldOutcome",
    "Window",
    "aggregate",
    "aggregate_markdown",
    "bars_per_year",
    "buy_and_hold",
    "build_report",
    "pnl_scores",
    "write_report",
]
