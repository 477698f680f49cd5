"""Candidate cartpole presets, each trained as one population of N seeds: how many reach a
100-episode mean of 475, when, and at what speed (:func:`gper.bench.trainers.gper_run.run_gper`,
the rows of ``gper bench trainers``). Used to pick the preset's network, environments and batch.

Usage: python benchmarks/cartpole_presets.py --seeds 16 --candidates envs4-128 envs16-128 --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gper.bench.report import ResultFiles, environment, format_markdown, header_line
from gper.bench.trainers.gper_run import QUIET, run_gper

CANDIDATES = {
    "preset": {},
    "envs4-128": {"hidden": (128, 128)},
    "envs8-128": {"hidden": (128, 128), "num_envs": 8},
    "envs16-128": {"hidden": (128, 128), "num_envs": 16},
    "envs16-128-b128": {"hidden": (128, 128), "num_envs": 16, "batch_size": 128},
    "envs16-128-t100": {"hidden": (128, 128), "num_envs": 16, "target_every": 100},
    "envs16-128-lr1e-3": {"hidden": (128, 128), "num_envs": 16, "learning_rate": 1e-3},
    "envs32-128": {"hidden": (128, 128), "num_envs": 32},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[16])
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    env = environment(__import__("torch").device(args.device))
    rows, raw = [], []
    for name in args.candidates:
        for seeds in args.seeds:
            fields = {"env": "cartpole", "solve_return": 475.0, **QUIET, "device": args.device, "seed": 1}
            res = run_gper({**fields, **CANDIDATES[name]}, seeds, log=lambda *a, **k: None)
            raw.append({"candidate": name, **res})
            cells = [name, str(seeds), f"{res['setup_s']:.1f}", f"{res['run_s']:.1f}"]
            cells += [f"{res['env_steps_per_s']:,.0f}", f"{res['reached']}/{seeds}"]
            cells += [f"{res['median_solve_step']:,.0f}" if res["median_solve_step"] else "-"]
            cells += [f"{res['time_to_goal_s']:.1f}" if res["time_to_goal_s"] else "-"]
            cells += [f"{res['all_at_goal_s']:.1f}" if res["all_at_goal_s"] else "-"]
            rows.append(cells)
            print(*cells, flush=True)
    headers = ["candidate", "seeds", "setup s", "run s", "env steps/s", "reached 475", "median step", "median s",
               "all s"]  # fmt: skip
    md = ["# Cartpole preset candidates", "", header_line(env, "cartpole_presets"), ""]
    md += [f"- {k}: {CANDIDATES[k]}" for k in args.candidates] + [""]
    md += [format_markdown(headers, rows, [False] + [True] * 8), ""]
    files = ResultFiles(args.out, env, None, prefix="cartpole-presets")
    files.write_markdown("\n".join(md))
    files.path(".json").write_text(json.dumps(raw, indent=1, default=str))
    print(f"wrote {files.md_path}")


if __name__ == "__main__":
    main()
