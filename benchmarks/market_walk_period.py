"""The out-of-sample scores of walk-forward runs over a sub-period: the folds whose test window
starts in or after ``--from`` (and starts before ``--to``), from each run's ``report.json``.

A preset chosen on validation windows that are also earlier folds' test windows leaves only the
test years after the last validation year used free of that choice: this reports those years.

    python benchmarks/market_walk_period.py benchmarks/results/market-walk-nvidia-h200-20261201-220427-runs --from 2011

Writes ``<runs folder>-from<YEAR>.{md,csv}`` beside the runs folder and prints the table. Log P&L
over the period is the sum over its folds (flat earns 0); Sharpe ratios need the per-bar P&L,
which the reports do not keep, so they are left out.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from gper.bench.report import format_markdown, print_table

COLUMNS = [
    "series",
    "replay",
    "seed",
    "folds",
    "test_start",
    "test_end",
    "policy_log_pnl",
    "hold_log_pnl",
    "folds_beating_flat",
]


def period_rows(runs: Path, start: int, end: int | None) -> list[dict]:
    rows = []
    for path in sorted(runs.glob("*.json")):
        series, replay, seed = path.stem.rsplit("-", 2)
        report = json.loads(path.read_text())
        folds = [
            f
            for f in report["folds"]
            if int(f["test"]["start"][:4]) >= start and (end is None or int(f["test"]["start"][:4]) < end)
        ]
        if not folds:
            continue
        rows.append(
            {
                "series": series,
                "replay": replay,
                "seed": int(seed[1:]),
                "folds": len(folds),
                "test_start": folds[0]["test"]["start"],
                "test_end": folds[-1]["test"]["end"],
                "policy_log_pnl": round(sum(f["policy"]["log_pnl"] for f in folds), 5),
                "hold_log_pnl": round(sum(f["buy_and_hold"]["log_pnl"] for f in folds), 5),
                "folds_beating_flat": sum(f["policy"]["log_pnl"] > 0 for f in folds),
            }
        )
    return rows


def summary(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["series", "replay", "runs", "policy log P&L, mean (min .. max)", "no worse than flat", "buy-and-hold"]
    table = []
    for key in dict.fromkeys((r["series"], r["replay"]) for r in rows):
        group = [r for r in rows if (r["series"], r["replay"]) == key]
        pnl = [r["policy_log_pnl"] for r in group]
        table.append(
            [
                *key,
                str(len(group)),
                f"{sum(pnl) / len(pnl):+.4f} ({min(pnl):+.4f} .. {max(pnl):+.4f})",
                f"{sum(p >= 0 for p in pnl)} of {len(pnl)}",
                f"{group[0]['hold_log_pnl']:+.4f}",
            ]
        )
    return headers, table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, help="a folder of <series>-<replay>-s<seed>.json reports")
    p.add_argument("--from", dest="start", type=int, required=True, help="first test year kept")
    p.add_argument("--to", dest="end", type=int, default=None, help="first test year left out")
    args = p.parse_args(argv)
    rows = period_rows(args.runs, args.start, args.end)
    if not rows:
        raise SystemExit(f"no fold of {args.runs} has a test window from {args.start}")
    headers, table = summary(rows)
    right = [False, False, True, True, True, True]
    print_table(headers, table, right)
    stem = args.runs.parent / f"{args.runs.name.removesuffix('-runs')}-from{args.start}"
    with stem.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    what = f"test windows starting in {args.start}" + (f" to {args.end - 1}" if args.end else " or later")
    md = [f"# Walk-forward out of sample, {what}", "", f"From the reports in `{args.runs.name}/`.", ""]
    md += [format_markdown(headers, table, right), ""]
    md += [format_markdown(COLUMNS, [[str(r[c]) for c in COLUMNS] for r in rows], [False] * 3 + [True] * 6), ""]
    stem.with_suffix(".md").write_text("\n".join(md))
    print(f"wrote {stem.with_suffix('.md')} and {stem.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
