"""Several walk-forward runs of the same series (seeds, replay kinds) summed up in one table.

Each run's :func:`~gper.walkforward.report.build_report` gives its out-of-sample scores; runs are
grouped by (series, replay kind), and a group gives the mean, min and max over its runs of the
policy's log P&L and Sharpe ratio beside buy-and-hold's and flat's, which depend on the series'
bars only and so are the same for every run of a series (checked).
"""

from __future__ import annotations

import math
from typing import Any

from gper.walkforward.report import fmt_pnl, fmt_sharpe, markdown_table

#: buy-and-hold figures of two runs of one series further apart than this are not the same bars
HOLD_TOL = 1e-9


def _check_row(i: int, row: Any) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"row {i} must be a dict, got {type(row).__name__}")
    missing = [k for k in ("series", "replay", "seed", "report") if k not in row]
    if missing:
        raise ValueError(f"row {i} lacks {', '.join(missing)}: each row needs series, replay, seed and report")
    if not (isinstance(row["series"], str) and isinstance(row["replay"], str)):
        raise ValueError(f"row {i}: series and replay must be strings, got {row['series']!r} and {row['replay']!r}")
    if isinstance(row["seed"], bool) or not isinstance(row["seed"], int):
        raise ValueError(f"row {i}: seed must be an int, got {row['seed']!r}")
    if not isinstance(row["report"], dict) or "out_of_sample" not in row["report"]:
        raise ValueError(f"row {i}: report must be a build_report dict (it has no out_of_sample)")


def _spread(name: str, values: list[float | None]) -> dict[str, float | None]:
    """``<name>_mean``, ``_min``, ``_max`` of ``values``; all None if any run has none (one bar, no annualising)."""
    if any(v is None for v in values):
        return {f"{name}_{k}": None for k in ("mean", "min", "max")}
    return {f"{name}_mean": math.fsum(values) / len(values), f"{name}_min": min(values), f"{name}_max": max(values)}


def _same_bars(series: str, first: dict[str, Any], oos: dict[str, Any]) -> None:
    for key in ("start", "end", "bars"):
        if oos[key] != first[key]:
            raise ValueError(f"runs of series {series!r} cover different bars: {key} {first[key]} and {oos[key]}")
    a, b = first["buy_and_hold"]["log_pnl"], oos["buy_and_hold"]["log_pnl"]
    if not math.isclose(a, b, rel_tol=HOLD_TOL, abs_tol=HOLD_TOL):
        raise ValueError(
            f"runs of series {series!r} differ in buy-and-hold log P&L ({a} and {b}): not the same bars or cost"
        )


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (series, replay kind), in the order the pairs first appear.

    Args:
        rows: ``{"series": str, "replay": str, "seed": int, "report": build_report dict}``, one per
            run; a (series, replay, seed) may appear once.

    Returns:
        Flat dicts (one CSV row each): ``series``, ``replay``, ``runs``, ``seeds`` (sorted),
        ``start``, ``end``, ``bars``, ``policy_log_pnl_{mean,min,max}``,
        ``policy_sharpe_annual_{mean,min,max}`` (None where a run could not annualise),
        ``runs_beating_flat``, ``runs_beating_hold``, ``buy_and_hold_log_pnl``,
        ``buy_and_hold_sharpe_annual``, ``flat_log_pnl``, ``flat_sharpe_annual``: all out of sample.
    """
    if not rows:
        raise ValueError("aggregate needs at least one run")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    seen: set[tuple[str, str, int]] = set()
    first_of_series: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        _check_row(i, row)
        key = (row["series"], row["replay"], row["seed"])
        if key in seen:
            raise ValueError(f"two runs of series {key[0]!r}, replay {key[1]!r}, seed {key[2]}")
        seen.add(key)
        oos = row["report"]["out_of_sample"]
        _same_bars(row["series"], first_of_series.setdefault(row["series"], oos), oos)
        groups.setdefault(key[:2], []).append(row)
    out = []
    for (series, replay), runs in groups.items():
        oos = [r["report"]["out_of_sample"] for r in runs]
        first = oos[0]
        summary: dict[str, Any] = {"series": series, "replay": replay, "runs": len(runs)}
        summary["seeds"] = sorted(r["seed"] for r in runs)
        summary.update({k: first[k] for k in ("start", "end", "bars")})
        summary.update(_spread("policy_log_pnl", [o["policy"]["log_pnl"] for o in oos]))
        summary.update(_spread("policy_sharpe_annual", [o["policy"]["sharpe_annual"] for o in oos]))
        summary["runs_beating_flat"] = sum(o["policy"]["log_pnl"] > o["flat"]["log_pnl"] for o in oos)
        summary["runs_beating_hold"] = sum(o["policy"]["log_pnl"] > o["buy_and_hold"]["log_pnl"] for o in oos)
        for strategy in ("buy_and_hold", "flat"):
            summary[f"{strategy}_log_pnl"] = first[strategy]["log_pnl"]
            summary[f"{strategy}_sharpe_annual"] = first[strategy]["sharpe_annual"]
        out.append(summary)
    return out


def aggregate_markdown(summaries: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`aggregate`'s summaries: one row per series and replay kind, the
    policy's mean [min, max] over runs beside buy-and-hold and flat, out of sample."""
    header = [
        "series",
        "replay",
        "runs",
        "out of sample",
        "policy log P&L mean [min, max]",
        "policy Sharpe (annual) mean [min, max]",
        "runs beating flat / buy-and-hold",
        "buy-and-hold log P&L",
        "buy-and-hold Sharpe",
        "flat log P&L",
    ]
    rows = []
    for s in summaries:
        cells = [
            s["series"],
            s["replay"],
            str(s["runs"]),
            f"{s['start']} to {s['end']} ({s['bars']} bars)",
            f"{fmt_pnl(s['policy_log_pnl_mean'])} "
            f"[{fmt_pnl(s['policy_log_pnl_min'])}, {fmt_pnl(s['policy_log_pnl_max'])}]",
            "n/a"
            if s["policy_sharpe_annual_mean"] is None
            else f"{fmt_sharpe(s['policy_sharpe_annual_mean'])} "
            f"[{fmt_sharpe(s['policy_sharpe_annual_min'])}, {fmt_sharpe(s['policy_sharpe_annual_max'])}]",
            f"{s['runs_beating_flat']} / {s['runs_beating_hold']}",
            fmt_pnl(s["buy_and_hold_log_pnl"]),
            fmt_sharpe(s["buy_and_hold_sharpe_annual"]),
            fmt_pnl(s["flat_log_pnl"]),
        ]
        rows.append(cells)
    return "\n".join(markdown_table(header, rows)) + "\n"
