"""The table of ``gper bench trainers``: one row per (trainer, settings, seed count), as printed,
as CSV and as Markdown. A row is a dict (what :mod:`~gper.bench.trainers.purejaxrl_run` and
:mod:`~gper.bench.trainers.gper_run` return, plus ``trainer``, ``settings`` and, for rows that did
not run, ``status``); nothing here times anything.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gper.bench.report import format_markdown
from gper.bench.trainers.solve import GOAL

HEADERS = (
    "trainer",
    "settings",
    "seeds",
    "compile/setup s",
    "run s",
    "env steps/s",
    f"reached {GOAL:g}",
    f"env step at {GOAL:g} (median)",
    f"s to {GOAL:g} (median)",
    "note",
)
RIGHT = (False, False, True, True, True, True, True, True, True, False)
CSV_COLUMNS = (
    "trainer",
    "settings",
    "seeds",
    "status",
    "compile_or_setup_s",
    "run_s",
    "total_env_steps",
    "env_steps_per_s",
    "reached",
    "median_solve_step",
    "time_to_goal_s",
    "time_to_goal_is_estimate",
    "all_at_goal_s",
    "solve_steps",
    "device",
)
#: what the note column says of each way a time to the goal is had
EST_NOTE = "s to goal estimated: run s x step / total steps"
MEASURED_NOTE = "s to goal measured at the end of the epoch that reached it"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def goal_time(row: dict[str, Any]) -> tuple[float | None, bool]:
    """The row's time to the goal and whether it is an estimate (PureJaxRL's, from the run's pace)."""
    if "median_time_to_goal_est_s" in row:
        return row["median_time_to_goal_est_s"], True
    return row.get("time_to_goal_s"), False


def table_row(row: dict[str, Any]) -> list[str]:
    """The printed cells of one row."""
    head = [row["trainer"], row["settings"], str(row["seeds"])]
    if row.get("status"):  # skipped, failed, or not run yet: no numbers
        return [*head, "-", "-", "-", "-", "-", "-", row["status"]]
    secs, est = goal_time(row)
    step = row.get("median_solve_step")
    return [
        *head,
        _num(row.get("compile_s", row.get("setup_s"))),
        _num(row["run_s"]),
        _num(row["env_steps_per_s"], 0),
        f"{row['reached']}/{row['seeds']}",
        "-" if step is None else f"{step:,.0f}",
        "-" if secs is None else ("~" if est else "") + _num(secs),
        EST_NOTE if est else MEASURED_NOTE,
    ]


def csv_row(row: dict[str, Any]) -> dict[str, object]:
    """One row as :data:`CSV_COLUMNS` (every seed's solve step in ``solve_steps``, space-separated)."""
    secs, est = goal_time(row)
    steps = row.get("solve_steps")
    return {
        "trainer": row["trainer"],
        "settings": row["settings"],
        "seeds": row["seeds"],
        "status": row.get("status") or "ok",
        "compile_or_setup_s": row.get("compile_s", row.get("setup_s")),
        "run_s": row.get("run_s"),
        "total_env_steps": row.get("total_env_steps"),
        "env_steps_per_s": row.get("env_steps_per_s"),
        "reached": row.get("reached"),
        "median_solve_step": row.get("median_solve_step"),
        "time_to_goal_s": secs,
        "time_to_goal_is_estimate": est if secs is not None else None,
        "all_at_goal_s": row.get("all_at_goal_s"),
        "solve_steps": None if steps is None else " ".join("-" if s is None else str(s) for s in steps),
        "device": row.get("device"),
    }


def markdown(header: str, versions: Sequence[str], rows: Sequence[dict[str, Any]], notes: Sequence[str]) -> str:
    """The Markdown report: the header line, the versions, the table, then the notes."""
    table = format_markdown(HEADERS, [table_row(r) for r in rows], RIGHT)
    lines = [f"# gper bench trainers\n\n{header}\n", *(f"- {v}" for v in versions), "", table, "", "Notes:", ""]
    return "\n".join([*lines, *(f"- {n}" for n in notes)]) + "\n"


def seed_spread(steps: Sequence[int | None]) -> str:
    """``min..max`` of the seeds' solve steps that reached the goal (for the notes), or ``none``."""
    got = [s for s in steps if s is not None]
    if not got:
        return "none"
    return f"{min(got):,}..{max(got):,} (median {statistics.median(got):,.0f})"
