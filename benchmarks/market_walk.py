"""Walk-forward DQN on the market task: real daily bars and the synthetic series, prioritized
against uniform replay, over seeds; the real-data settings chosen on validation windows only.

Two stages, each run a process (``--parallel`` at a time, side by side on one GPU):

1. **select** (``--candidates``): each candidate setting trains every fold of each real series
   (``--select-series``, seed ``--select-seed``, prioritized replay) and picks its checkpoints on
   the validation windows; the test windows are never walked (``walk_forward(score_test=False)``).
   A candidate's score is the mean over folds and series of the chosen checkpoint's validation
   score (flat's 0 where a fold stays flat). The best candidate wins.
2. **final**: the winner (or ``--settings``) on every ``--series`` x ``--seeds`` x ``--replay``,
   tested: each run writes its report (JSON, Markdown, PNG) in its run folder.

    python benchmarks/market_walk.py --parallel 10 --candidates "steps_per_bar=30" "steps_per_bar=100" ...

Writes ``benchmarks/results/market-walk-<device>-<stamp>.{md,csv,png}`` (the final runs, one row
each, and the mean over seeds per series and replay), ``...-select.csv`` (the candidates'
validation scores) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path

import torch

from gper.bench import workers
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.dqn.walk_settings import nest_walk

WINDOWS = dict(train_months=36, val_months=12, test_months=12, step_months=12)
#: the cost its committed results used (the market's default on real bars is now 2 bp); a candidate's or
#: --settings' cost_bps overrides it
COST_BPS = 1.0
SERIES = {"synthetic": None, "sp500": "arch:sp500", "nasdaq": "arch:nasdaq"}
COLUMNS = [
    "series",
    "replay",
    "seed",
    "status",
    "folds",
    "flat_folds",
    "oos_start",
    "oos_end",
    "policy_log_pnl",
    "policy_sharpe_yr",
    "policy_max_dd",
    "policy_turnover",
    "hold_log_pnl",
    "hold_sharpe_yr",
    "hold_max_dd",
    "folds_beating_flat",
    "folds_beating_hold",
    "wall_s",
    "settings",
]


def parse_settings(items: list[str]) -> dict:
    """``["steps_per_bar=30", "hidden=64,64"]`` -> settings for :func:`gper.dqn.config.from_settings`
    (the walk-forward ones flat)."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if key == "hidden":
            out[key] = tuple(int(h) for h in value.split(","))
        elif key in ("learning_rate", "cost_bps", "tau", "eps_end", "exploration_fraction", "max_grad_norm"):
            out[key] = float(value)
        else:
            out[key] = int(value)
    return out


def worker(spec: dict) -> int:
    """One walk-forward run in this process (``--worker``): prints one JSON line with its result."""
    from gper.dqn.config import from_settings
    from gper.walkforward.run import walk_forward

    score_test = spec.pop("score_test")
    cfg = from_settings(dict(env="market", progress=False, tensorboard=False, **spec))
    torch.set_num_threads(1)
    result = walk_forward(cfg, log=lambda line: print(line, file=sys.stderr, flush=True), score_test=score_test)
    chosen = [run.chosen for run in result.folds]
    curves = [
        {k: v for k, v in o.to_dict().items() if k in ("time_ns", "policy_pnl", "hold_pnl")} for o in result.outcomes
    ]
    print(json.dumps({"folder": str(result.folder), "chosen": chosen, "report": result.report, "curves": curves}))
    return 0


def run_all(specs: list[dict], parallel: int, logs: Path) -> list[tuple[dict, dict | None, float, str]]:
    """Every run of ``specs`` as a process of this script's ``--worker`` (:func:`gper.bench.workers.run_all`)."""
    return workers.run_all(Path(__file__), specs, parallel, logs)


def select(args, folder: Path, env: dict) -> dict:
    candidates = [parse_settings(c.split()) for c in args.candidates]
    specs = []
    for c, settings in enumerate(candidates):
        for series in args.select_series:
            specs.append(
                WINDOWS
                | settings
                | dict(data=SERIES[series], seed=args.select_seed, device=args.device, score_test=False)
                | ({} if "cost_bps" in settings else dict(cost_bps=COST_BPS))
                | dict(run_dir=str(folder / "select"), run_name=f"c{c}-{series}")
            )
    print(f"select: {len(candidates)} candidates x {len(args.select_series)} series, validation only", flush=True)
    results = run_all(specs, args.parallel, folder)
    rows = []
    for c in range(len(candidates)):
        scores, status = [], "ok"
        for spec, out, _, st in results:
            if not spec["run_name"].startswith(f"c{c}-"):
                continue
            if out is None:
                status = st
                continue
            scores += [0.0 if ch["flat"] else ch["score"] for ch in out["chosen"]]
        mean = sum(scores) / len(scores) if scores else float("nan")
        rows.append(
            {"candidate": c, "settings": args.candidates[c], "val_score": mean, "folds": len(scores), "status": status}
        )
    files = ResultFiles(
        Path(args.out), env, ["candidate", "settings", "val_score", "folds", "status"], prefix="market-walk-select"
    )
    files.append(rows)
    table = [[str(r["candidate"]), r["settings"], f"{r['val_score']:+.5f}", str(r["folds"]), r["status"]] for r in rows]
    print_table(
        ["candidate", "settings", "mean validation score", "folds", "status"], table, [True, False, True, True, False]
    )
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise SystemExit("no candidate finished")
    best = max(ok, key=lambda r: r["val_score"])
    print(f"select: candidate {best['candidate']} ({best['settings']}) has the best validation score", flush=True)
    return {
        "rows": rows,
        "best": best,
        "md": format_markdown(
            ["candidate", "settings", "mean validation score", "folds", "status"],
            table,
            [True, False, True, True, False],
        ),
        "csv": files.csv_path,
    }


def rescore(runs: Path, until: int) -> list[dict]:
    """The candidates' validation scores of a select stage's runs (``<runs>/c<k>-<series>/fold_*.json``)
    from the folds whose validation window ends in ``until`` or before only: the choice those
    windows make leaves the test windows after ``until`` untouched."""
    rows = []
    for c in sorted({p.name.split("-")[0] for p in runs.iterdir() if p.is_dir()}, key=lambda n: int(n[1:])):
        scores, settings = [], None
        for fold_file in sorted(runs.glob(f"{c}-*/fold_*.json")):
            record = json.loads(fold_file.read_text())
            settings = settings or json.loads((fold_file.parent / "config.json").read_text())["settings"]
            if int(record["val"]["end"][:4]) <= until:
                scores.append(0.0 if record["chosen"]["flat"] else record["chosen"]["score"])
        hidden = ",".join(str(h) for h in settings["hidden"])
        steps_per_bar = nest_walk(settings)["walk"]["steps_per_bar"]  # flat in a run from before Config.walk
        rows.append(
            {
                "candidate": int(c[1:]),
                "settings": f"steps_per_bar={steps_per_bar} hidden={hidden}",
                "val_score": sum(scores) / len(scores),
                "folds": len(scores),
            }
        )
    return rows


def final(args, folder: Path, settings_text: str) -> list[dict]:
    settings = parse_settings(settings_text.split())
    specs = []
    for series in args.series:
        for replay in args.replay:
            for seed in args.seeds:
                sampling = "uniform" if replay == "uniform" else "proportional"
                specs.append(
                    WINDOWS
                    | settings
                    | dict(data=SERIES[series], seed=seed, device=args.device, sampling=sampling, score_test=True)
                    | ({} if "cost_bps" in settings else dict(cost_bps=COST_BPS))
                    | dict(run_dir=str(folder / "final"), run_name=f"{series}-{replay}-s{seed}")
                )
    print(f"final: {len(specs)} runs ({settings_text})", flush=True)
    rows = []
    for spec, out, wall, status in run_all(specs, args.parallel, folder):
        series, replay, seed = spec["run_name"].rsplit("-", 2)
        row = {"series": series, "replay": replay, "seed": int(seed[1:]), "status": status, "wall_s": round(wall, 1)}
        row["settings"] = settings_text
        if out is not None:
            rep = out["report"]
            oos, p, h = rep["out_of_sample"], rep["out_of_sample"]["policy"], rep["out_of_sample"]["buy_and_hold"]
            row |= {
                "folds": len(rep["folds"]),
                "flat_folds": sum(bool(f["chosen"]["flat"]) for f in rep["folds"]),
                "oos_start": oos["start"],
                "oos_end": oos["end"],
                "policy_log_pnl": round(p["log_pnl"], 5),
                "policy_sharpe_yr": round(p["sharpe_annual"], 3),
                "policy_max_dd": round(p["max_drawdown"], 5),
                "policy_turnover": round(p["turnover"], 2),
                "hold_log_pnl": round(h["log_pnl"], 5),
                "hold_sharpe_yr": round(h["sharpe_annual"], 3),
                "hold_max_dd": round(h["max_drawdown"], 5),
                "folds_beating_flat": oos["folds_beating_flat"],
                "folds_beating_hold": oos["folds_beating_hold"],
                "report": rep,
                "curves": out["curves"],
            }
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Mean (min .. max) over seeds per series and replay."""
    headers = [
        "series",
        "replay",
        "runs",
        "policy log P&L",
        "policy Sharpe/yr",
        "max DD",
        "flat folds",
        "buy-and-hold",
        "flat",
        "vs flat",
    ]
    table = []
    for series in dict.fromkeys(r["series"] for r in rows):
        for replay in dict.fromkeys(r["replay"] for r in rows):
            done = [r for r in rows if r["series"] == series and r["replay"] == replay and r["status"] == "ok"]
            if not done:
                continue
            pnl = [r["policy_log_pnl"] for r in done]
            sh = [r["policy_sharpe_yr"] for r in done]
            dd = [r["policy_max_dd"] for r in done]
            mean = sum(pnl) / len(pnl)
            table.append(
                [
                    series,
                    replay,
                    str(len(done)),
                    f"{mean:+.4f} ({min(pnl):+.4f} .. {max(pnl):+.4f})",
                    f"{sum(sh) / len(sh):+.2f}",
                    f"{sum(dd) / len(dd):.4f}",
                    f"{sum(r['flat_folds'] for r in done)}/{sum(r['folds'] for r in done)}",
                    f"{done[0]['hold_log_pnl']:+.4f}",
                    "+0.0000",
                    "no worse" if min(pnl) >= 0 else f"worse in {sum(p < 0 for p in pnl)} of {len(pnl)}",
                ]
            )
    return headers, table


def plot(rows: list[dict], path: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    series = list(dict.fromkeys(r["series"] for r in rows if r["status"] == "ok"))
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4), squeeze=False)
    colors = {"prioritized": "tab:blue", "uniform": "tab:orange"}
    for ax, s in zip(axes[0], series, strict=True):
        hold_done = False
        for r in rows:
            if r["series"] != s or r["status"] != "ok":
                continue
            folds = r["curves"]
            t = np.concatenate([np.asarray(f["time_ns"], dtype=np.int64) for f in folds]).astype("datetime64[ns]")
            pol = np.cumsum(np.concatenate([f["policy_pnl"] for f in folds]))
            ax.plot(
                t,
                pol,
                color=colors.get(r["replay"], "gray"),
                lw=0.8,
                alpha=0.8,
                label=f"{r['replay']}" if r["seed"] == rows[0]["seed"] else None,
            )
            if not hold_done:
                hold = np.cumsum(np.concatenate([f["hold_pnl"] for f in folds]))
                ax.plot(t, hold, color="black", lw=1.0, label="buy-and-hold")
                ax.axhline(0.0, color="gray", lw=0.8, ls="--", label="flat")
                hold_done = True
        ax.set_title(s)
        ax.set_ylabel("cumulative log P&L, out of sample")
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 60 * len(series)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--series", nargs="+", default=list(SERIES), choices=list(SERIES))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--replay", nargs="+", default=["prioritized", "uniform"], choices=["prioritized", "uniform"])
    p.add_argument(
        "--candidates", nargs="*", default=[], help='settings to choose from, e.g. "steps_per_bar=30 hidden=64,64"'
    )
    p.add_argument("--select-series", nargs="+", default=["sp500", "nasdaq"], choices=["sp500", "nasdaq"])
    p.add_argument("--select-seed", type=int, default=1)
    p.add_argument("--select-only", action="store_true", help="stop after choosing the settings")
    p.add_argument("--rescore", default=None, help="a select stage's runs folder: rescore it (with --select-until)")
    p.add_argument(
        "--select-until", type=int, default=9999, help="use validation windows ending in this year or before"
    )
    p.add_argument("--settings", default="", help="the final runs' settings when there are no candidates")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--work", default=None, help="folder for the runs (default a temporary one under /tmp)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.rescore:
        rows = rescore(Path(args.rescore), args.select_until)
        headers = [
            "candidate",
            "settings",
            f"mean validation score, validation windows ending by {args.select_until}",
            "folds",
        ]
        table = [[str(r["candidate"]), r["settings"], f"{r['val_score']:+.5f}", str(r["folds"])] for r in rows]
        right = [True, False, True, True]
        print_table(headers, table, right)
        best = max(rows, key=lambda r: r["val_score"])
        text = f"Best: candidate {best['candidate']} ({best['settings']})."
        print(text)
        out = Path(f"{args.rescore.rstrip('/').removesuffix('-runs')}-until{args.select_until}.md")
        out.write_text(
            "\n".join(
                [
                    f"# Candidates rescored on validation windows ending by {args.select_until}",
                    "",
                    f"From `{Path(args.rescore).name}/`.",
                    "",
                    format_markdown(headers, table, right),
                    "",
                    text,
                    "",
                ]
            )
        )
        print(f"wrote {out}")
        return 0
    env = environment(torch.device(args.device))
    folder = Path(args.work or f"/tmp/market-walk-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    what = "walk-forward DQN on the market task, " + ", ".join(
        f"{k.split('_')[0]} {v} months" for k, v in WINDOWS.items()
    )
    print(header_line(env, what), flush=True)
    chosen = select(args, folder, env) if args.candidates else None
    if args.select_only:
        if chosen:
            md = [f"# {what}: settings chosen on validation windows", "", header_line(env, what), "", chosen["md"], ""]
            files = ResultFiles(Path(args.out), env, ["candidate"], prefix="market-walk-select")
            files.write_markdown("\n".join(md + [f"Chosen: `{chosen['best']['settings']}`.", ""]))
        return 0
    settings = chosen["best"]["settings"] if chosen else args.settings
    rows = final(args, folder, settings)
    files = ResultFiles(Path(args.out), env, COLUMNS, prefix="market-walk")
    files.append([{k: r.get(k) for k in COLUMNS} for r in rows])
    headers, table = summary(rows)
    print_table(headers, table, [False, False] + [True] * 8)
    png = plot(rows, files.md_path.with_suffix(".png"), f"{what}; settings: {settings}")
    parts = [f"# {what}", "", header_line(env, what), ""]
    if chosen:
        parts += ["## Settings chosen on validation windows", "", chosen["md"], "", f"Chosen: `{settings}`.", ""]
    parts += [
        "## Out of sample, mean over seeds (min .. max)",
        "",
        format_markdown(headers, table, [False, False] + [True] * 8),
        "",
    ]
    runs = [
        [r["series"], r["replay"], str(r["seed"]), r["status"], *(str(r.get(k, "")) for k in COLUMNS[4:-1])]
        for r in rows
    ]
    parts += ["## Every run", "", format_markdown(COLUMNS[:-1], runs, [False] * 4 + [True] * (len(COLUMNS) - 5)), ""]
    if png is not None:
        parts += [f"![out-of-sample equity]({png.name})", ""]
    files.write_markdown("\n".join(parts))
    print(f"wrote {files.csv_path}, {files.md_path}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
