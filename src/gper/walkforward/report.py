"""The report of a walk-forward evaluation: each fold's test scores and the out-of-sample whole.

:func:`build_report` scores every fold (:class:`~gper.walkforward.outcome.FoldOutcome`) and the test
bars of all folds joined in time order, the out-of-sample period, for the policy, buy-and-hold,
flat and the classical baselines (:mod:`~gper.walkforward.baselines`: volatility-scaled long only,
time-series momentum, MACD; where every fold holds them); :func:`write_report` writes it as
``report.json``, ``report.md`` and ``equity.png``.

Each fold's policy starts flat and buy-and-hold enters on each fold's first test bar, so both pay
an entry cost per fold: the comparison stays like for like.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gper._files import atomic_file
from gper.walkforward.baselines import BASELINES
from gper.walkforward.baselines import LABELS as BASELINE_LABELS
from gper.walkforward.outcome import ARRAYS, FoldOutcome, Window, in_time_order
from gper.walkforward.plot import write_equity_png
from gper.walkforward.scores import bars_per_year, pnl_scores
from gper.walkforward.stats import INSTALL, STATISTICS, performance

#: the strategies every fold and the out-of-sample period are scored for, in table order (then the
#: baselines of :func:`strategies`)
STRATEGIES = ("policy", "buy_and_hold", "flat")
LABELS = {"policy": "policy", "buy_and_hold": "buy-and-hold", "flat": "flat", **BASELINE_LABELS}


def strategies(report: dict[str, Any]) -> tuple[str, ...]:
    """The strategies ``report`` scores, in table order: :data:`STRATEGIES`, then the baselines it holds."""
    return STRATEGIES + tuple(name for name in BASELINES if name in report["out_of_sample"])


def build_report(folds: list[FoldOutcome], meta: dict[str, Any], per_year: float | None = None) -> dict[str, Any]:
    """Every fold's scores and those of the out-of-sample period, the folds' test bars joined.

    Args:
        folds: the folds, in any order (they are reported in time order); their test bars must not
            overlap.
        meta: what the run was (series, replay kind, seed, cost, ...), copied into the report.
        per_year: bars per year to annualise with; default estimated from the test bars' times,
            which counts the gaps between test windows as time: with a step longer than the test
            window, pass the estimate from every bar of the out-of-sample span instead.

    Returns:
        ``{"meta", "folds": [{"index", "train", "val", "test", "chosen", "policy", "buy_and_hold",
        "flat", and each baseline}], "out_of_sample": {"start", "end", "bars", "bars_per_year",
        "folds", "policy", "buy_and_hold", "flat", each baseline, "policy_vs_flat", "policy_vs_hold",
        "folds_beating_flat", "folds_beating_hold"}}``, each strategy's entry its :func:`pnl_scores`,
        out of sample with ``empyrical``: :func:`gper.walkforward.stats.performance` (None without
        empyrical-reloaded). An ensemble's folds add ``members`` (each member's scores) to each fold's
        row, and ``members`` and ``members_beating_flat`` out of sample when every fold has the same members.
        A baseline is in the out-of-sample entry when every fold holds it (folds recorded before
        the baselines were reported hold none). ``bars_per_year``
        is estimated from the out-of-sample bars' times and annualises every Sharpe ratio, the
        folds' too (a fold's own span is shorter and its estimate noisier).
    """
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
    ordered = in_time_order(folds)
    time_ns = np.concatenate([f.time_ns for f in ordered])
    if per_year is None:
        per_year = bars_per_year(time_ns)
    elif not (isinstance(per_year, (int, float)) and math.isfinite(per_year) and per_year > 0):
        raise ValueError(f"per_year must be a finite number > 0, got {per_year!r}")
    fold_rows = []
    for fold in ordered:
        row: dict[str, Any] = {"index": fold.index}
        row.update({name: getattr(fold, name).to_dict() for name in ("train", "val", "test")})
        row["chosen"] = fold.chosen
        row.update(fold.scores(per_year))
        if fold.members is not None:
            row["members"] = fold.member_scores(per_year)
        fold_rows.append(row)
    joined = {name: np.concatenate([getattr(f, name) for f in ordered]) for name in ARRAYS}
    zeros = np.zeros(len(time_ns))
    window = Window.of(time_ns)
    oos: dict[str, Any] = {"start": window.start, "end": window.end, "bars": window.bars}
    oos.update({"bars_per_year": per_year, "folds": len(ordered)})
    oos["policy"] = pnl_scores(joined["policy_pnl"], joined["policy_traded"], per_year)
    oos["buy_and_hold"] = pnl_scores(joined["hold_pnl"], joined["hold_traded"], per_year)
    oos["flat"] = pnl_scores(zeros, zeros, per_year)
    for name in BASELINES:
        if all(name in f.baselines for f in ordered):
            pnl, traded = (np.concatenate([f.baselines[name][k] for f in ordered]) for k in (0, 1))
            oos[name] = pnl_scores(pnl, traded, per_year)
    for name in strategies({"out_of_sample": oos}):  # empyrical's statistics; None without it
        oos[name]["empyrical"] = performance(_joined_pnl(ordered, name), per_year)
    members = _joined_members(ordered)
    if members is not None:
        oos["members"] = [pnl_scores(p, t, per_year) for p, t in zip(*members, strict=True)]
        oos["members_beating_flat"] = sum(m["log_pnl"] > 0 for m in oos["members"])
    oos["policy_vs_flat"] = oos["policy"]["log_pnl"] - oos["flat"]["log_pnl"]
    oos["policy_vs_hold"] = oos["policy"]["log_pnl"] - oos["buy_and_hold"]["log_pnl"]
    oos["folds_beating_flat"] = sum(r["policy"]["log_pnl"] > r["flat"]["log_pnl"] for r in fold_rows)
    oos["folds_beating_hold"] = sum(r["policy"]["log_pnl"] > r["buy_and_hold"]["log_pnl"] for r in fold_rows)
    return {"meta": meta, "folds": fold_rows, "out_of_sample": oos}


def _joined_pnl(ordered: list[FoldOutcome], name: str) -> np.ndarray:
    """The out-of-sample per-bar log P&L of strategy ``name``, the folds' test bars joined."""
    if name == "policy":
        return np.concatenate([f.policy_pnl for f in ordered])
    if name == "buy_and_hold":
        return np.concatenate([f.hold_pnl for f in ordered])
    if name == "flat":
        return np.zeros(sum(len(f.time_ns) for f in ordered))
    return np.concatenate([f.baselines[name][0] for f in ordered])


def _joined_members(ordered: list[FoldOutcome]) -> tuple[np.ndarray, np.ndarray] | None:
    """Each ensemble member's out-of-sample ``(log_pnl, traded)``, ``[S, bars]``: where every fold is an
    ensemble of the same S members; else None."""
    sizes = {None if f.members is None else f.members[0].shape[0] for f in ordered}
    if len(sizes) != 1 or None in sizes:
        return None
    return tuple(np.concatenate([f.members[k] for f in ordered], axis=1) for k in (0, 1))  # type: ignore[index]


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists, for :func:`json.dumps`."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def report_json(report: dict[str, Any]) -> str:
    """``report`` as indented JSON; ValueError if it holds a NaN or an infinity (JSON has neither)."""
    try:
        return json.dumps(report, indent=2, allow_nan=False, default=_plain) + "\n"
    except ValueError as err:
        raise ValueError(f"the report holds a NaN or an infinity, which JSON cannot hold: {err}") from None


# -- Markdown --------------------------------------------------------------------------------------


def fmt_pnl(x: float) -> str:
    """A log P&L with its sign, to 4 decimals."""
    return f"{x:+.4f}"


def fmt_sharpe(x: float | None) -> str:
    """A Sharpe ratio with its sign, to 2 decimals; "n/a" for None."""
    return "n/a" if x is None else f"{x:+.2f}"


def _score_cells(s: dict[str, Any]) -> list[str]:
    return [fmt_pnl(s["log_pnl"]), fmt_sharpe(s["sharpe_annual"]), f"{s['max_drawdown']:.4f}", f"{s['turnover']:.2f}"]


def _chosen(chosen: dict[str, Any]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k} {cell(v)}" for k, v in chosen.items()) or "-"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table (a ``|`` in a cell becomes ``/``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]


def comparison_sentence(report: dict[str, Any]) -> str:
    """One sentence: how the policy's out-of-sample log P&L compares with flat's and buy-and-hold's."""
    oos = report["out_of_sample"]
    n = oos["folds"]
    said = (
        f"The policy ended {fmt_pnl(oos['policy_vs_flat'])} in log P&L against flat (0) and "
        f"{fmt_pnl(oos['policy_vs_hold'])} against buy-and-hold over {oos['start']} to {oos['end']}, "
        f"beating flat in {oos['folds_beating_flat']} of {n} folds and buy-and-hold in {oos['folds_beating_hold']}."
    )
    named = [s for s in strategies(report) if s in BASELINES and oos[s]["sharpe_annual"] is not None]
    if named and oos["policy"]["sharpe_annual"] is not None:
        best = max(named, key=lambda s: oos[s]["sharpe_annual"])
        said += (
            f" Its Sharpe ratio {fmt_sharpe(oos['policy']['sharpe_annual'])} against the best baseline's, "
            f"{LABELS[best]}, {fmt_sharpe(oos[best]['sharpe_annual'])}."
        )
    return said


def report_markdown(report: dict[str, Any], title: str, equity_png: str | None = None) -> str:
    """``report.md``: the run, the folds' windows, each fold's scores, the out-of-sample summary and
    :func:`comparison_sentence`, then the equity plot ``equity_png`` when there is one."""
    oos = report["out_of_sample"]
    per_year = oos["bars_per_year"]
    lines = [f"# {title}", ""]
    for key, value in report["meta"].items():
        lines.append(f"- {key}: {value if isinstance(value, str) else json.dumps(value, default=_plain)}")
    scale = "not annualised: one bar" if per_year is None else f"annualised at {per_year:.1f} bars a year"
    lines += [
        "",
        f"Log P&L after costs, in log units; max DD: the largest fall from a peak of cumulative log P&L; "
        f"Sharpe ratio {scale} (estimated from the out-of-sample bars' times).",
        "",
        "## Folds",
        "",
    ]
    lines += markdown_table(
        ["fold", "train", "validation", "test"],
        [
            [str(f["index"])]
            + [f"{f[w]['start']} to {f[w]['end']} ({f[w]['bars']} bars)" for w in ("train", "val", "test")]
            for f in report["folds"]
        ],
    )
    lines += ["", "## Test scores per fold", ""]
    header = [
        "fold",
        "test window",
        "strategy",
        "log P&L",
        "Sharpe (annual)",
        "max DD",
        "turnover",
        "chosen checkpoint",
    ]
    rows = []
    for f in report["folds"]:
        window = f"{f['test']['start']} to {f['test']['end']}"
        for s in strategies(report):
            rows.append(
                [str(f["index"]), window, LABELS[s]]
                + _score_cells(f[s])
                + [_chosen(f["chosen"]) if s == "policy" else ""]
            )
    lines += markdown_table(header, rows)
    lines += ["", f"## Out of sample: {oos['start']} to {oos['end']}, {oos['bars']} bars, {oos['folds']} folds", ""]
    lines += markdown_table(
        ["strategy", "log P&L", "Sharpe (annual)", "max DD", "turnover"],
        [[LABELS[s]] + _score_cells(oos[s]) for s in strategies(report)],
    )
    lines += ["", comparison_sentence(report), ""]
    lines += _empyrical_lines(report)
    lines += _member_lines(report)
    if equity_png is not None:
        lines += [f"![cumulative out-of-sample log P&L]({equity_png})", ""]
    return "\n".join(lines)


def _empyrical_lines(report: dict[str, Any]) -> list[str]:
    oos = report["out_of_sample"]
    names = strategies(report)
    lines = ["## Out of sample, empyrical's statistics", ""]
    if oos["bars_per_year"] is None:
        return lines + ["Left out: one out-of-sample bar gives no year to annualise with.", ""]
    if any(oos[s].get("empyrical") is None for s in names):
        return lines + [f"Left out: they need empyrical-reloaded: {INSTALL}.", ""]
    lines.append(
        "From the simple returns exp(log P&L) - 1, by empyrical-reloaded: annual return compounded, "
        "the Sharpe ratio from the sample standard deviation, the Sortino ratio from the downside deviation "
        "over every bar, max drawdown a fraction of the peak's equity."
    )
    lines.append("")

    def cell(name: str, v: float | None) -> str:
        if v is None:
            return "n/a"
        if name == "max_drawdown":  # a fall: negative or 0, no sign to add
            return f"{100 * v:.2f}%"
        return f"{100 * v:+.2f}%" if name in ("annual_return", "annual_volatility") else f"{v:+.2f}"

    rows = [[LABELS[s]] + [cell(k, oos[s]["empyrical"][k]) for k in STATISTICS] for s in names]
    return lines + markdown_table(["strategy", *STATISTICS.values()], rows) + [""]


def _member_lines(report: dict[str, Any]) -> list[str]:
    oos = report["out_of_sample"]
    members = oos.get("members")
    if not members:
        return []
    pnl = [m["log_pnl"] for m in members]
    lines = [f"## Ensemble members ({len(members)})", ""]
    lines.append(
        f"The policy is the ensemble: the mean of {len(members)} members' positions. Each member alone (the "
        f"same checkpoint, trading its own positions; flat in the folds kept flat) ended "
        f"{fmt_pnl(float(np.mean(pnl)))} on average "
        f"({fmt_pnl(min(pnl))} .. {fmt_pnl(max(pnl))}) against the ensemble's {fmt_pnl(oos['policy']['log_pnl'])}; "
        f"{oos['members_beating_flat']} of {len(members)} beat flat."
    )
    lines.append("")
    rows = [[str(i)] + _score_cells(m) for i, m in enumerate(members)]
    return lines + markdown_table(["member", "log P&L", "Sharpe (annual)", "max DD", "turnover"], rows) + [""]


def write_report(folder: Path, report: dict[str, Any], folds: list[FoldOutcome], title: str) -> dict[str, Path | None]:
    """Write ``report.json``, ``report.md`` and ``equity.png`` into ``folder`` (created if missing).

    Each file appears whole or not at all (:func:`gper._files.atomic_file`), and a report that
    cannot be written as JSON (a NaN, an infinity) raises before any file is written.

    Args:
        folder: where the files go.
        report: :func:`build_report` of ``folds``.
        folds: the folds the report was built from (the plot needs their per-bar arrays).
        title: heads ``report.md`` and the plot.

    Returns:
        ``{"json": path, "markdown": path, "png": path or None}``: None when matplotlib (gper's
        ``train`` extra) is missing, in which case ``report.md`` says so (and an ``equity.png``
        left in ``folder`` by an earlier report is removed).
    """
    text = report_json(report)
    indices = [f.index for f in in_time_order(folds)]
    if indices != [f["index"] for f in report["folds"]]:
        raise ValueError(f"the report's folds {[f['index'] for f in report['folds']]} are not these folds {indices}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    png = write_equity_png(folder / "equity.png", folds, title)
    markdown = report_markdown(report, title, png.name if png is not None else None)
    if png is None:
        # an equity.png of an earlier report in this folder would not be this report's
        (folder / "equity.png").unlink(missing_ok=True)
        markdown += '\nNo equity.png: the plot needs matplotlib: pip install ".[train]"\n'
    paths: dict[str, Path | None] = {"json": folder / "report.json", "markdown": folder / "report.md", "png": png}
    for key, content in (("markdown", markdown), ("json", text)):
        with atomic_file(paths[key]) as f:
            f.write(content.encode("utf-8"))
    return paths
