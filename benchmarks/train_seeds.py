"""Train several variants over several seeds (and environments), in parallel processes, and tabulate the outcomes.

Each (environment, variant, seed) is one ``gper train`` run in its own process; the table gives,
per run, the env steps and wall seconds at which the mean return of the last 100 episodes first
reached the environment's ``solve_return`` (cartpole: 475), the best and final 100-episode
means, and for ``market`` the greedy policy's log P&L on held-out prices against buy-and-hold and flat.

    python benchmarks/train_seeds.py --env cartpole --seeds 1 2 3 \\
        --variant prioritized: --variant "uniform:--sampling uniform" --parallel 6

    # n-step returns on both tasks, one table (cartpole first: its runs take longest). Cartpole
    # runs 200,000 steps, epsilon decaying over the preset's 30,000: about 5 minutes on an H200
    python benchmarks/train_seeds.py --env cartpole market --seeds 1 2 3 --parallel 6 --label nstep \\
        --variant "n1:--n-step 1" --variant "n3:--n-step 3" --variant "n5:--n-step 5" \\
        --env-extra "cartpole:--total-steps 200000 --exploration-fraction 0.15"

A variant is ``name:flags`` (flags as for ``gper train``; empty for the defaults);
``--env-extra ENV:FLAGS`` adds flags to one environment's runs. Writes
``benchmarks/results/train-<env>[+<env>...]-<device>[-<label>]-<stamp>.{md,csv}`` and prints the same table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table

COLUMNS = [
    "env",
    "variant",
    "seed",
    "status",
    "solved_at_step",
    "solved_at_s",
    "best_mean100",
    "final_mean100",
    "env_steps",
    "wall_s",
    "test_log_pnl",
    "buy_and_hold_log_pnl",
    "flat_log_pnl",
    "test_sharpe_per_bar",
    "flags",
]


def run_one(
    env: str, device: str, name: str, flags: str, seed: int, folder: Path, extra: str, keep: Path | None = None
) -> dict:
    run_name = f"{env.replace(':', '_')}-{name}-s{seed}"
    cmd = [sys.executable, "-m", "gper", "train", "--env", env, "--device", device, "--seed", str(seed)]
    cmd += ["--run-dir", str(folder), "--run-name", run_name, "--progress", "False", "--save", "False"]
    cmd += shlex.split(extra) + shlex.split(flags)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row = {"env": env, "variant": name, "seed": seed, "flags": flags}
    if keep is not None and (folder / run_name).exists():
        shutil.copytree(folder / run_name, keep / run_name, dirs_exist_ok=True)
        (keep / run_name / "stdout.txt").write_text(proc.stdout + proc.stderr)
    summary = folder / run_name / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return row | {"status": "error: " + " / ".join(tail)[:300], "wall_s": time.perf_counter() - t0}
    s = json.loads(summary.read_text())
    row |= {
        "status": "ok",
        "solved_at_step": s["solved_at_step"],
        "solved_at_s": s["solved_at_s"],
        "best_mean100": s["best_mean_return_last100"],
        "final_mean100": s["mean_return_last100"],
        "env_steps": s["env_steps"],
        "wall_s": s["wall_s"],
    }
    ev = s.get("evaluation")
    if ev:
        row |= {
            "test_log_pnl": ev["total_log_pnl"],
            "buy_and_hold_log_pnl": ev["buy_and_hold_log_pnl"],
            "flat_log_pnl": ev["flat_log_pnl"],
            "test_sharpe_per_bar": ev["sharpe_per_bar"],
        }
    print(
        f"  {env} {name} seed {seed}: {row['status']}, solved at {row['solved_at_step']}, final {row['final_mean100']}"
    )
    return row


def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 1e6 else f"{v:.3g}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", nargs="+", default=["cartpole"], help="one or more environments (one table)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--variant", action="append", default=[], help="name:flags (repeatable; default the presets)")
    p.add_argument("--extra", default="", help="flags added to every run")
    p.add_argument("--env-extra", action="append", default=[], help="ENV:FLAGS added to that environment's runs")
    p.add_argument("--parallel", type=int, default=3, help="runs at a time")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--label", default="", help="added to the file names")
    p.add_argument("--keep", help="copy each run's folder (metrics, plot, its output) here")
    args = p.parse_args(argv)
    variants = [v.split(":", 1) if ":" in v else (v, "") for v in (args.variant or ["default:"])]
    env_extra = dict.fromkeys(args.env, args.extra)
    for item in args.env_extra:
        name, _, flags = item.partition(":") if not item.startswith("gym:") else _split_gym(item)
        if name not in env_extra:
            p.error(f"--env-extra {item!r}: {name} is not among --env {' '.join(args.env)}")
        env_extra[name] = f"{env_extra[name]} {flags}".strip()
    envs = " ".join(args.env)
    env = environment(torch.device(args.device))
    print(header_line(env, f"train {envs}"))
    label = f"-{args.label}" if args.label else ""
    slug = "+".join(e.replace(":", "_") for e in args.env)
    env_for_files = dict(env, slug=f"{slug}-{env['slug']}{label}")
    files = ResultFiles(Path(args.out), env_for_files, COLUMNS, prefix="train")
    lock = threading.Lock()
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)

    def job(j: tuple[str, str, str, int]) -> dict:
        row = run_one(j[0], args.device, j[1], j[2], j[3], Path(tmp), env_extra[j[0]], keep)
        with lock:  # the CSV grows as runs finish, so a run cut short keeps what it measured
            files.append([row])
        return row

    with tempfile.TemporaryDirectory() as tmp:
        # in the order given: list the longest environment first, so its runs start first
        jobs = [(e, name, flags, seed) for e in args.env for name, flags in variants for seed in args.seeds]
        with ThreadPoolExecutor(args.parallel) as pool:
            rows = list(pool.map(job, jobs))
    several = len(args.env) > 1
    headers = ["variant", "seed", "solved at step", "solved at s", "best mean100", "final mean100", "wall s"]
    headers = (["env"] if several else []) + headers
    keys = ["solved_at_step", "solved_at_s", "best_mean100", "final_mean100", "wall_s"]
    if "market" in args.env:
        headers += ["test log P&L", "buy&hold", "flat", "Sharpe/bar"]
        keys += ["test_log_pnl", "buy_and_hold_log_pnl", "flat_log_pnl", "test_sharpe_per_bar"]
    table = []
    for r in rows:
        first = ([r["env"]] if several else []) + [r["variant"], str(r["seed"])]
        if r["status"] != "ok":
            table.append([*first, r["status"]] + [""] * (len(headers) - len(first) - 1))
            continue
        digits = {"test_log_pnl": 4, "buy_and_hold_log_pnl": 4, "flat_log_pnl": 4, "test_sharpe_per_bar": 4}
        table.append([*first, *(_fmt(r.get(k), digits.get(k, 1)) for k in keys)])
    right = ([False] if several else []) + [False, True] + [True] * len(keys)
    print_table(headers, table, right)
    summary_lines = []
    for e, (name, flags) in ((e, v) for e in args.env for v in variants):
        ok = [r for r in rows if r["env"] == e and r["variant"] == name and r["status"] == "ok"]
        solved = [r["solved_at_step"] for r in ok if r["solved_at_step"] is not None]
        where = f"{e} " if several else ""
        line = f"- **{where}{name}** (`{flags or 'presets'}`): {len(solved)}/{len(ok)} seeds solved"
        if solved:
            line += f", median {statistics.median(solved):,.0f} env steps"
        if ok:
            line += f"; final mean100 median {statistics.median(r['final_mean100'] for r in ok):.1f}"
        if ok and ok[0].get("test_log_pnl") is not None:
            beat = sum(r["test_log_pnl"] > max(r["buy_and_hold_log_pnl"], r["flat_log_pnl"]) for r in ok)
            pnl = statistics.median(r["test_log_pnl"] for r in ok)
            line += f"; held-out log P&L median {pnl:+.4f}, beat buy-and-hold and flat in {beat}/{len(ok)} seeds"
        summary_lines.append(line)
        print(line)
    files.write_markdown(
        "\n".join(
            [
                f"# gper train {envs}: {len(variants)} variant(s) x {len(args.seeds)} seeds",
                "",
                header_line(env, f"train {envs}"),
                "",
                f"Command: `python benchmarks/train_seeds.py {shlex.join(argv or sys.argv[1:])}`",
                "",
                format_markdown(headers, table, right),
                "",
                *summary_lines,
                "",
            ]
        )
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _split_gym(item: str) -> tuple[str, str, str]:
    """``gym:<ID>:FLAGS`` -> (``gym:<ID>``, ``:``, FLAGS): the id's own colon is not the separator."""
    env, sep, flags = item[4:].partition(":")
    return f"gym:{env}", sep, flags


if __name__ == "__main__":
    raise SystemExit(main())
