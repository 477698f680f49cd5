"""``gper bench --train`` on the CPU: the trainer's learn step with replay, from a fixed batch, by phase."""

from __future__ import annotations

import torch

from gper.bench.train_step import TrainBenchConfig, run_train_bench, step_flops

CPU = torch.device("cpu")


def test_bench_train_on_cpu(tmp_path):
    rows = run_train_bench(
        TrainBenchConfig(
            device=CPU, capacity=1024, batch=64, hidden=(16,), precisions=("fp32",), steps=3, repeats=1, out=tmp_path
        ),
        log=lambda _: None,
    )
    modes = [r["mode"] for r in rows]
    # on the CPU nothing runs from a graph, so no row says so; and no GPU datasheet floor
    assert modes == ["replay", "fixed batch", "replay, by phase"]
    assert all(r["ms_per_step"] > 0 for r in rows)
    assert all(r["x_floor"] is None and r["floor_ms"] is None for r in rows)
    md = next(tmp_path.glob("train-step-cpu-*.md")).read_text()
    assert "GPU" not in md.replace("not a GPU", "") and "graph" not in md.split("| ---")[1]
    assert (
        len(list(tmp_path.glob("train-step-cpu-*.csv"))) == 1 and len(list(tmp_path.glob("train-step-cpu-*.md"))) == 1
    )
    # 51 -> 512 -> 512 -> 45 at 16384: 3 forwards + a backward of about 2 forwards, 2 FLOPs per MAC
    macs = 51 * 512 + 512 * 512 + 512 * 45
    assert step_flops(51, (512, 512), 45, 16384) == 2 * 16384 * (3 * macs + 2 * macs - 51 * 512)


def test_bench_train_runs_the_fused_step(tmp_path):
    cfg = TrainBenchConfig(
        device=CPU, capacity=1024, batch=64, hidden=(16,), precisions=("fp32",), steps=2, repeats=1, out=tmp_path
    )
    cfg.fused_step = True
    rows = run_train_bench(cfg, log=lambda _: None)
    assert all(r["ms_per_step"] > 0 for r in rows)
    assert "fused_step: hidden layers with a ReLU epilogue" in next(tmp_path.glob("train-step-cpu-*.md")).read_text()
