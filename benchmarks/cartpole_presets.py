"""Candidate cartpole presets, each trained as one population of N seeds (times a sweep's grid):
how many agents of each grid point reach a 100-episode mean of 475, when, and at what speed. Used
to pick the preset's network, environments, learning rate and exploration.

A candidate is :class:`gper.dqn.Config` fields, with an optional ``sweep`` (``gper train --sweep``'s
texts): the population then holds ``seeds`` agents for each grid point, all in one run, and the
table has a row per grid point.

Usage: python benchmarks/cartpole_presets.py --seeds 16 --candidates envs4-128 lr-128 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from gper.bench.report import ResultFiles, environment, format_markdown, header_line
from gper.bench.trainers.gper_run import QUIET

CANDIDATES = {
    "preset": {},
    "envs4-128": {"hidden": (128, 128)},
    "envs8-128": {"hidden": (128, 128), "num_envs": 8},
    "envs16-128": {"hidden": (128, 128), "num_envs": 16},
    "envs16-128-b128": {"hidden": (128, 128), "num_envs": 16, "batch_size": 128},
    "envs16-128-t100": {"hidden": (128, 128), "num_envs": 16, "target_every": 100},
    "envs16-128-lr1e-3": {"hidden": (128, 128), "num_envs": 16, "learning_rate": 1e-3},
    "envs32-128": {"hidden": (128, 128), "num_envs": 32},
    # the learning rate and the exploration's length swept at once (a grid point per pair)
    "lr-256": {"sweep": ("learning_rate=2.5e-4,5e-4,1e-3",)},
    "lr-128": {"hidden": (128, 128), "sweep": ("learning_rate=2.5e-4,5e-4,1e-3",)},
    "lr-128-t500": {
        "hidden": (128, 128),
        "target_every": 500,
        "total_steps": 400_000,
        "sweep": ("learning_rate=5e-4,1e-3",),
    },  # fmt: skip
    "explore-128": {"hidden": (128, 128), "sweep": ("exploration_fraction=0.05,0.1,0.2", "eps_end=0.01,0.05")},
    "soft-128": {"hidden": (128, 128), "tau": 0.005, "sweep": ("learning_rate=5e-4,1e-3", "tau=0.005,0.02")},
}


def run(fields: dict, seeds: int) -> list[dict]:
    """One run of ``seeds`` agents per grid point; a row per grid point."""
    from gper.dqn import Config, train
    from gper.dqn.sweep import agent_configs, label, parse_sweeps

    sweeps = parse_sweeps(fields.get("sweep", ()))
    with tempfile.TemporaryDirectory(prefix="gper-presets-") as run_dir:
        t0 = time.perf_counter()
        cfg = Config(**fields, population=seeds, run_dir=run_dir)
        res = train(cfg, log=lambda *a, **k: None)
        call_s = time.perf_counter() - t0
    if res.population:
        agents = res.population["per_agent"]
    else:  # one seed and no sweep: the single agent's run
        agents = [{"solved_at_step": res.solved_at_step, "solved_at_s": res.solved_at_s, "mean_return_last100": None}]
    grid = max(1, len(agents) // seeds)
    cfgs = agent_configs(cfg, seeds, sweeps)
    rows = []
    for point in range(grid):
        mine = agents[point * seeds : (point + 1) * seeds]
        steps = [a["solved_at_step"] for a in mine if a["solved_at_step"] is not None]
        times = [a["solved_at_s"] for a in mine if a["solved_at_s"] is not None]
        rows.append(
            {
                "point": label(cfgs[point * seeds], sweeps) or "-",
                "setup_s": max(0.0, call_s - res.wall_s),
                "run_s": res.wall_s,
                "env_steps_per_s": res.env_steps * len(agents) / res.wall_s,
                "reached": len(steps),
                "median_step": statistics.median(steps) if steps else None,
                "median_s": statistics.median(times) if times else None,
                "all_s": max(times) if len(times) == seeds else None,
                "final_means": [a["mean_return_last100"] for a in mine],
                "solve_steps": [a["solved_at_step"] for a in mine],
            }
        )
    return rows


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
            for res in run({**fields, **CANDIDATES[name]}, seeds):
                raw.append({"candidate": name, "seeds": seeds, **res})
                cells = [name, res["point"], str(seeds), f"{res['setup_s']:.1f}", f"{res['run_s']:.1f}"]
                cells += [f"{res['env_steps_per_s']:,.0f}", f"{res['reached']}/{seeds}"]
                cells += [f"{res['median_step']:,.0f}" if res["median_step"] else "-"]
                cells += [f"{res['median_s']:.1f}" if res["median_s"] else "-"]
                cells += [f"{res['all_s']:.1f}" if res["all_s"] else "-"]
                rows.append(cells)
                print(*cells, flush=True)
    headers = ["candidate", "grid point", "seeds", "setup s", "run s", "env steps/s", "reached 475", "median step",
               "median s", "all s"]  # fmt: skip
    md = ["# Cartpole preset candidates", "", header_line(env, "cartpole_presets"), ""]
    md += [f"- {k}: {CANDIDATES[k]}" for k in args.candidates] + [""]
    md += ["Each candidate is one run: `seeds` agents per grid point, all grid points in one population.", ""]
    md += [format_markdown(headers, rows, [False, False] + [True] * 8), ""]
    files = ResultFiles(args.out, env, None, prefix="cartpole-presets")
    files.write_markdown("\n".join(md))
    files.path(".json").write_text(json.dumps(raw, indent=1, default=str))
    print(f"wrote {files.md_path}")


if __name__ == "__main__":
    main()
