"""``gper bench train-step --population`` on the CPU: the table and files (launch counts need CUDA)."""

from __future__ import annotations

import csv

import pytest
import torch

from gper.bench import command
from gper.bench.commands import train_step as train_step_cmd
from gper.bench.population_step import COLUMNS, PopulationBenchConfig, run_population_bench

SMALL = {"hidden": (16,), "batch_size": 32, "buffer_size": 2048}


def test_population_bench_on_cpu(tmp_path):
    cfg = PopulationBenchConfig(torch.device("cpu"), agents=(1, 3), steps=2, repeats=1, out=tmp_path, overrides=SMALL)
    lines = []
    rows = run_population_bench(cfg, log=lines.append)
    assert [(r["learner"], r["agents"]) for r in rows] == [("single agent", 1), ("population", 1), ("population", 3)]
    assert all(r["wall_us"] > 0 and r["device_us"] > 0 and r["env_steps_per_s"] > 0 for r in rows)
    assert rows[0]["x_single"] == 1.0 and "launches" not in rows[0]  # no launch counts without CUDA
    assert rows[2]["env_steps_per_s"] == 3 * 4 / (rows[2]["wall_us"] * 1e-6)  # 4 envs an agent
    (csv_path,) = tmp_path.glob("train-step-population-cpu-*.csv")
    with open(csv_path, newline="") as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == COLUMNS and [r["agents"] for r in got] == ["1", "1", "3"]
    md = next(tmp_path.glob("train-step-population-cpu-*.md")).read_text()
    assert "| population | 3 |" in md and "on the CPU: host times, no launch counts" in md
    assert any("bench train-step --population" in line for line in lines)


def test_population_flags():
    parse = command.build_parser().parse_args
    cfg = train_step_cmd.population_config(parse(["train-step", "--population", "1", "16", "--device", "cpu"]))
    assert cfg.agents == (1, 16) and (cfg.steps, cfg.repeats) == (5, 2)
    quick = train_step_cmd.population_config(parse(["train-step", "--population", "2", "--device", "cpu", "--quick"]))
    assert (quick.steps, quick.repeats) == (2, 2)
    given = parse(["train-step", "--population", "2", "--device", "cpu", "--hidden", "8", "--no-fused-step"])
    assert train_step_cmd.population_config(given).overrides == {"fused_step": False, "hidden": (8,)}
    two = ["train-step", "--population", "2", "--device", "cpu", "--precisions", "fp32", "fp32"]
    with pytest.raises(SystemExit, match="one precision"):
        train_step_cmd.population_config(parse(two))
    with pytest.raises(SystemExit, match="every N must be >= 1"):
        train_step_cmd.population_config(parse(["train-step", "--population", "0", "--device", "cpu"]))


def test_the_report_lists_the_costliest_kernels(tmp_path):
    from gper.bench import population_step as ps
    from gper.bench.report import environment

    cfg = PopulationBenchConfig(torch.device("cpu"), agents=(2,), out=tmp_path)
    row = {"learner": "population", "agents": 2, "device_us": 10.0, "wall_us": 11.0, "x_single": 1.0}
    row |= {"env_steps_per_s": 5.0, "launches": 7, "kernel_us": 9.0, "busy_pct": 90.0}
    row |= {f"{p}_launches": 1 for p in ps.PHASES} | {f"{p}_us": 1.5 for p in ps.PHASES}
    resolved = type("R", (), {"num_envs": 4, "hidden": (8,), "batch_size": 16, "sampling": "proportional"})
    resolved.loss = "mse"
    ps.report(cfg, environment(cfg.device), [row], {2: [("gemm|kernel", 4.25)]}, resolved, log=lambda *a: None)
    md = next(tmp_path.glob("train-step-population-cpu-*.md")).read_text()
    assert "cartpole preset (4 envs an agent, (8,), batch 16, proportional, mse loss)" in md
    assert "The costliest kernels of an iteration, 2 agents" in md and "| gemm/kernel | 4.2 |" in md
    assert "| population | 2 | 10 | 11 | 1.00 | 5 | 7 | 9 | 90 | 1 / 2 |" in md
