"""Walk-forward ensembles on the packaged daily series, with the rule fixed on the development period.

The protocol (docs/training.md, "Ensembles, and a rule fixed in advance"):

1. **dev** (``--candidates``): each candidate setting runs the whole walk-forward (train 36 months,
   validation 12, test 12, step 12) on each packaged series cut at the end of ``--dev-until``
   (2010): its test windows are 2003-2010, and no bar after the cut exists for it. The rule that
   picks the winner is fixed here, before any run: the candidates no worse than flat on both series
   over the development tests, and of those the highest mean annual Sharpe ratio over the two
   series (all of them when none is no worse than flat).
2. **final** (``--settings``, the winner): the whole series, seeds ``--seeds``; each run's folds whose
   test window starts after ``--dev-until`` are reported (2011-2018) beside buy-and-hold, flat
   and the classical baselines, with each ensemble's members.

Each run is a process (``--parallel`` at a time, side by side on one GPU), the worker of
``benchmarks/market_walk.py``. Writes ``benchmarks/results/market-ensemble-<stage>-<device>-<stamp>.{md,csv}``
and prints the tables.

    python benchmarks/market_ensemble.py dev --parallel 16 --candidates "population=16 actions=3" ...
    python benchmarks/market_ensemble.py final --parallel 6 --settings "population=16 actions=3 ..."
    python benchmarks/market_ensemble.py report --runs <work>/runs --out <folder>   # each run, 2011 on
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gper.bench import workers
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.envs.packaged import read_bars
from gper.walkforward.outcome import FoldOutcome
from gper.walkforward.report import build_report, write_report

#: the worker each run is a process of (it trains one walk-forward run and prints its report)
WORKER = Path(__file__).with_name("market_walk.py")
#: the windows of every run, those of benchmarks/market_walk.py
WINDOWS = dict(train_months=36, val_months=12, test_months=12, step_months=12)

SERIES = {"sp500": "arch:sp500", "nasdaq": "arch:nasdaq"}
BASELINE_COLUMNS = ("long_only", "tsmom", "macd")


def parse_settings(text: str) -> dict:
    """``"population=16 actions=3 vol_target=0.15"`` -> settings: ints, floats, ``True``/``False``/``None``,
    ``hidden=64,64`` a tuple, anything else a string (``select_metric=log_pnl``); a name given again
    replaces its earlier value (a candidate's own setting after the common ones)."""
    out: dict = {}
    for item in text.split():
        key, _, value = item.partition("=")
        if key == "hidden":
            out[key] = tuple(int(h) for h in value.split(","))
            continue
        named = {"True": True, "False": False, "None": None}
        if value in named:
            out[key] = named[value]
            continue
        for kind in (int, float, str):
            try:
                out[key] = kind(value)
                break
            except ValueError:
                continue
    return out


def cut_series(name: str, until: int, folder: Path) -> Path:
    """The packaged series ``name`` up to the end of year ``until`` as a bar file (close as every price)."""
    bars = read_bars(SERIES[name])
    days = bars.time_ns.numpy().astype("datetime64[ns]").astype("datetime64[D]")
    keep = days <= np.datetime64(f"{until}-12-31")
    path = folder / f"{name}.csv"
    with path.open("w") as f:
        f.write("date,open,high,low,close,volume\n")
        for day, close in zip(days[keep], bars.close.numpy()[keep].tolist(), strict=True):
            f.write(f"{day},{close!r},{close!r},{close!r},{close!r},0\n")
    return path


def period_outcomes(folder: Path, first_year: int | None = None, last_year: int | None = None) -> list[FoldOutcome]:
    """A run's folds whose test window starts in ``[first_year, last_year]``."""
    outcomes = []
    for path in sorted((folder / "folds").glob("fold_*.json")):
        outcome = FoldOutcome.from_dict(json.loads(path.read_text())["outcome"])
        year = int(outcome.test.start[:4])
        if (first_year is None or year >= first_year) and (last_year is None or year <= last_year):
            outcomes.append(outcome)
    return outcomes


def period_report(folder: Path, first_year: int | None = None, last_year: int | None = None) -> dict:
    """The report of a run's folds whose test window starts in ``[first_year, last_year]``."""
    return build_report(period_outcomes(folder, first_year, last_year), {"folder": str(folder)})


def held_out_reports(runs: Path, first_year: int, out: Path) -> None:
    """Each run folder's report (``report.md``, ``.json``, ``equity.png``) of the folds whose test starts
    in ``first_year`` or later, written to ``out/<run>/``, beside a copy of the whole run's report."""
    for folder in sorted(p for p in runs.iterdir() if (p / "report.json").exists()):
        outcomes = period_outcomes(folder, first_year)
        meta = json.loads((folder / "config.json").read_text())
        report = build_report(outcomes, {"run": folder.name, "settings": meta["settings"]})
        title = f"{folder.name}: walk-forward ensemble out of sample, tests from {first_year}"
        write_report(out / folder.name / f"from{first_year}", report, outcomes, title)
        for name in ("report.md", "report.json", "equity.png"):
            shutil.copyfile(folder / name, out / folder.name / name)
        print(f"report: {out / folder.name}")


def row_of(series: str, seed: int, report: dict, wall: float) -> dict:
    oos = report["out_of_sample"]
    pol, hold = oos["policy"], oos["buy_and_hold"]
    row = {
        "series": series,
        "seed": seed,
        "test_start": oos["start"],
        "test_end": oos["end"],
        "folds": oos["folds"],
        "flat_folds": sum(bool(f["chosen"].get("flat")) for f in report["folds"]),
        "log_pnl": round(pol["log_pnl"], 5),
        "sharpe_yr": round(pol["sharpe_annual"], 3),
        "max_dd": round(pol["max_drawdown"], 4),
        "turnover": round(pol["turnover"], 2),
        "hold_log_pnl": round(hold["log_pnl"], 5),
        "hold_sharpe_yr": round(hold["sharpe_annual"], 3),
        "hold_max_dd": round(hold["max_drawdown"], 4),
        "hold_turnover": round(hold["turnover"], 2),
    }
    for name in BASELINE_COLUMNS:
        row[f"{name}_sharpe_yr"] = round(oos[name]["sharpe_annual"], 3) if name in oos else None
    members = oos.get("members") or []
    row["members_mean_log_pnl"] = round(float(np.mean([m["log_pnl"] for m in members])), 5) if members else None
    row["members_beating_flat"] = oos.get("members_beating_flat")
    row["sortino"] = (pol.get("empyrical") or {}).get("sortino_ratio")
    row["wall_s"] = round(wall, 1)
    return row


COLUMNS = [
    "series", "seed", "test_start", "test_end", "folds", "flat_folds", "log_pnl", "sharpe_yr", "max_dd", "turnover",
    "hold_log_pnl", "hold_sharpe_yr", "hold_max_dd", "hold_turnover", "long_only_sharpe_yr", "tsmom_sharpe_yr",
    "macd_sharpe_yr", "members_mean_log_pnl", "members_beating_flat", "sortino", "wall_s",
]  # fmt: skip


def _cell(v) -> str:
    return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def dev(args, work: Path, env: dict) -> None:
    data = {name: cut_series(name, args.dev_until, work) for name in args.series}
    specs = []
    for c, text in enumerate(args.candidates):
        for name in args.series:
            spec = WINDOWS | parse_settings(text) | dict(data=str(data[name]), seed=args.dev_seed, device=args.device)
            specs.append(spec | dict(run_dir=str(work / "runs"), run_name=f"c{c}-{name}", score_test=True))
    print(f"dev: {len(args.candidates)} candidates x {len(args.series)} series, bars up to {args.dev_until}")
    results = workers.run_all(WORKER, specs, args.parallel, work)
    rows, by_candidate = [], {}
    for spec, out, wall, status in results:
        c, name = spec["run_name"].split("-", 1)
        if out is None:
            print(f"dev: {spec['run_name']} failed: {status}")
            continue
        row = {"candidate": int(c[1:]), "settings": args.candidates[int(c[1:])]} | row_of(
            name, args.dev_seed, out["report"], wall
        )
        rows.append(row)
        by_candidate.setdefault(row["candidate"], []).append(row)
    # the rule, fixed before the runs: no worse than flat on every series, then the best mean Sharpe
    complete = {c: rs for c, rs in by_candidate.items() if len(rs) == len(args.series)}
    if not complete:
        raise SystemExit("dev: no candidate finished on every series")
    safe = {c: rs for c, rs in complete.items() if all(r["log_pnl"] >= 0 for r in rs)} or complete
    best = max(safe, key=lambda c: np.mean([r["sharpe_yr"] for r in safe[c]]))
    cols = ["candidate", "settings", *COLUMNS]
    _write(args, env, "dev", cols, rows)
    print(f"dev: the rule picks candidate {best}: {args.candidates[best]}")


def final(args, work: Path, env: dict) -> None:
    settings = parse_settings(args.settings)
    specs = []
    for name in args.series:
        for seed in args.seeds:
            spec = WINDOWS | settings | dict(data=SERIES[name], seed=seed, device=args.device, score_test=True)
            specs.append(spec | dict(run_dir=str(work / "runs"), run_name=f"{name}-s{seed}"))
    print(f"final: {args.settings} on {', '.join(args.series)} x seeds {args.seeds}")
    results = workers.run_all(WORKER, specs, args.parallel, work)
    rows = []
    for spec, out, wall, status in results:
        name = spec["run_name"].split("-s")[0]
        if out is None:
            print(f"final: {spec['run_name']} failed: {status}")
            continue
        folder = Path(out["folder"])
        for period, (first, last) in (("dev", (None, args.dev_until)), ("held out", (args.dev_until + 1, None))):
            row = {"period": period} | row_of(name, spec["seed"], period_report(folder, first, last), wall)
            rows.append(row)
    _write(args, env, "final", ["period", *COLUMNS], rows, note=f"settings: {args.settings}")


def _write(args, env: dict, stage: str, cols: list[str], rows: list[dict], note: str = "") -> None:
    files = ResultFiles(Path(args.out), env, cols, prefix=f"market-ensemble-{stage}")
    files.append(rows)
    table = [[_cell(r.get(k)) for k in cols] for r in rows]
    right = [k not in ("settings", "series", "period", "test_start", "test_end") for k in cols]
    print_table(cols, table, right)
    md = [f"# Walk-forward ensembles, {stage} stage", "", header_line(env), ""]
    if note:
        md += [note, ""]
    md += format_markdown(cols, table, right).splitlines()
    files.md_path.write_text("\n".join(md) + "\n")
    print(f"wrote {files.csv_path} and {files.md_path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["dev", "final", "report"])
    p.add_argument("--runs", type=Path, default=None, help="report: a final stage's runs folder")
    p.add_argument("--candidates", nargs="+", default=[], help="dev: settings strings, one per candidate")
    p.add_argument("--settings", default="", help="final: the chosen settings string")
    p.add_argument("--series", nargs="+", default=list(SERIES), choices=list(SERIES))
    p.add_argument("--dev-until", type=int, default=2010, help="last year of the development period")
    p.add_argument("--dev-seed", type=int, default=1)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--work", default=None, help="folder for the runs (default a temporary one under /tmp)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.stage == "dev" and not args.candidates:
        p.error("dev needs --candidates")
    if args.stage == "final" and not args.settings:
        p.error("final needs --settings")
    if args.stage == "report":
        if args.runs is None:
            p.error("report needs --runs")
        held_out_reports(args.runs, args.dev_until + 1, Path(args.out))
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="market-ensemble-"))
    work.mkdir(parents=True, exist_ok=True)
    env = environment(torch.device(args.device))
    t0 = time.perf_counter()
    (dev if args.stage == "dev" else final)(args, work, env)
    print(f"{args.stage}: {time.perf_counter() - t0:.0f} s; runs in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
