"""DQN with and without hindsight relabelling on the bit-flipping task, over bit counts and seeds.

Each (bits, strategy, seed) is one ``gper train --env bitflip:N --her STRATEGY`` run in its own
process, evaluated after every epoch on 256 episodes (flags in ``--extra`` may change that).
The table gives the greedy policy's success rate (the fraction of evaluation episodes
that reach their goal) at the end, the env steps and wall seconds at which an evaluation first
reached 0.9, and the run's wall time; the PNG plots the final success rate against the bit count,
mean and range over the seeds.

    python benchmarks/her_bitflip.py --bits 10 20 30 40 50 --her future none --seeds 1 2 3 --parallel 6 \\
        --steps 10:200000 20:200000 30:400000 40:600000 50:600000

Writes ``benchmarks/results/her-bitflip-<device>[-<label>]-<stamp>.{md,csv,png}`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table

COLUMNS = [
    "bits",
    "her",
    "seed",
    "status",
    "success",
    "best_success",
    "success90_step",
    "success90_s",
    "env_steps",
    "train_steps",
    "wall_s",
    "flags",
]


def run_one(bits: int, her: str, seed: int, device: str, folder: Path, flags: str, steps: int | None) -> dict:
    name = f"bitflip{bits}-{her}-s{seed}"
    cmd = [sys.executable, "-m", "gper", "train", "--env", f"bitflip:{bits}", "--her", her, "--seed", str(seed)]
    cmd += ["--device", device, "--run-dir", str(folder), "--run-name", name, "--progress", "False"]
    cmd += ["--save", "False", "--tensorboard", "False", "--eval-every", "1", "--eval-episodes", "256"]
    cmd += shlex.split(flags) + (["--total-steps", str(steps)] if steps else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row = {"bits": bits, "her": her, "seed": seed, "flags": flags + (f" --total-steps {steps}" if steps else "")}
    summary = folder / name / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return row | {"status": "error: " + " / ".join(tail)[:300], "wall_s": time.perf_counter() - t0}
    s = json.loads(summary.read_text())
    rates = [
        r["eval/success_rate"]
        for r in map(json.loads, (folder / name / "metrics.jsonl").read_text().splitlines())
        if r.get("eval/success_rate") is not None
    ]
    row |= {
        "status": "ok",
        "success": s["eval_success_rate"],
        "best_success": max(rates) if rates else None,
        "success90_step": s["first_success_90_step"],
        "success90_s": s["first_success_90_s"],
        "env_steps": s["env_steps"],
        "train_steps": s["train_steps"],
        "wall_s": s["wall_s"],
    }
    print(f"  bitflip:{bits} her {her} seed {seed}: success {row['success']}, 0.9 at {row['success90_step']}")
    return row


def _fmt(v: object, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def plot(rows: list[dict], path: Path, title: str) -> Path | None:
    """Final success rate against the bit count, one line per strategy (mean, and the seeds' range)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for her in dict.fromkeys(r["her"] for r in rows):
        bits = sorted({r["bits"] for r in rows if r["her"] == her})
        got = [[r["success"] for r in rows if r["her"] == her and r["bits"] == b and r["status"] == "ok"] for b in bits]
        keep = [(b, g) for b, g in zip(bits, got, strict=True) if g]
        if not keep:
            continue
        xs = [b for b, _ in keep]
        ax.plot(
            xs,
            [statistics.mean(g) for _, g in keep],
            marker="o",
            label=f"DQN + HER ({her})" if her != "none" else "DQN",
        )
        ax.fill_between(xs, [min(g) for _, g in keep], [max(g) for _, g in keep], alpha=0.2)
    ax.set_xlabel("bits (n)")
    ax.set_ylabel("success rate (greedy policy)")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=7)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bits", nargs="+", type=int, default=[10, 20, 30, 40, 50])
    p.add_argument("--her", nargs="+", default=["future", "none"], help="strategies (none: no relabelling)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--extra", default="", help="flags added to every run (as for gper train)")
    p.add_argument(
        "--steps", nargs="+", default=[], metavar="BITS:STEPS", help="env steps of BITS bits' runs (else the preset)"
    )
    p.add_argument("--parallel", type=int, default=4, help="runs at a time")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--label", default="", help="added to the file names")
    args = p.parse_args(argv)
    try:
        steps = {int(b): int(n) for b, n in (item.split(":") for item in args.steps)}
    except ValueError:
        p.error(f"--steps takes BITS:STEPS pairs, got {args.steps}")
    env = environment(torch.device(args.device))
    what = f"bitflip {' '.join(map(str, args.bits))} bits, her {' '.join(args.her)}"
    print(header_line(env, what))
    label = f"-{args.label}" if args.label else ""
    files = ResultFiles(Path(args.out), dict(env, slug=f"bitflip-{env['slug']}{label}"), COLUMNS, prefix="her")
    lock = threading.Lock()
    # the largest tasks first: they take longest
    jobs = [(b, h, s) for b in sorted(args.bits, reverse=True) for h in args.her for s in args.seeds]
    with tempfile.TemporaryDirectory() as tmp:

        def job(j: tuple[int, str, int]) -> dict:
            row = run_one(*j, args.device, Path(tmp), args.extra, steps.get(j[0]))
            with lock:  # the CSV grows as runs finish, so a run cut short keeps what it measured
                files.append([row])
            return row

        with ThreadPoolExecutor(args.parallel) as pool:
            rows = sorted(pool.map(job, jobs), key=lambda r: (r["bits"], r["her"], r["seed"]))
    headers = ["bits", "her", "seed", "success", "best", "0.9 at step", "0.9 at s", "env steps", "wall s"]
    keys = ["success", "best_success", "success90_step", "success90_s", "env_steps", "wall_s"]
    table = []
    for r in rows:
        first = [str(r["bits"]), r["her"], str(r["seed"])]
        if r["status"] != "ok":
            table.append([*first, r["status"]] + [""] * (len(headers) - 4))
            continue
        table.append([*first, *(_fmt(r.get(k), 1 if k.endswith("_s") else 2) for k in keys)])
    right = [True, False, True] + [True] * len(keys)
    print_table(headers, table, right)
    lines = []
    for her in args.her:
        cells = []
        for b in sorted(args.bits):
            ok = [r for r in rows if r["her"] == her and r["bits"] == b and r["status"] == "ok"]
            if ok:
                cells.append(f"{b} bits {statistics.mean(r['success'] for r in ok):.2f}")
        lines.append(f"- **her {her}**: mean final success " + ", ".join(cells))
        print(lines[-1])
    png = plot(rows, files.path(".png"), header_line(env, what))
    files.write_markdown(
        "\n".join(
            [
                f"# DQN on bit-flipping, with and without hindsight relabelling: {len(args.seeds)} seeds",
                "",
                header_line(env, what),
                "",
                f"Command: `python benchmarks/her_bitflip.py {shlex.join(argv or sys.argv[1:])}`",
                "",
                format_markdown(headers, table, right),
                "",
                *lines,
                "",
                f"Plot: `{png.name}`" if png else "(no plot: matplotlib is missing)",
                "",
            ]
        )
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
