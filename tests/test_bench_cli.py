"""Smoke test of ``gper bench`` on the CPU: the command runs and writes its result files.

Timings are not checked (benchmarks are not tests); the rows and columns are.
"""

from __future__ import annotations

import csv

import pytest
import torch

import gper
from gper.bench.command import parse_sizes
from gper.bench.replay import COLUMNS
from gper.bench.workload import OPS
from gper.cli import main


def test_bench_cpu_tiny(tmp_path, capsys):
    argv = ["bench", "--device", "cpu", "--capacities", "8", "--batches", "32", "--repeats", "1", "--iters", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0

    (csv_path,) = tmp_path.glob("bench-cpu-*.csv")
    (md_path,) = tmp_path.glob("bench-cpu-*.md")
    assert csv_path.stem == md_path.stem
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(COLUMNS)
        rows = list(reader)
    got = sorted((r["impl"], r["op"], r["mode"]) for r in rows)
    expected = [("gper-torch", op, "eager") for op in OPS] + [("seeds-cumsum", op, "eager") for op in OPS]
    expected += [("torch-multinomial", op, "eager") for op in ("sample", "step")]
    assert got == sorted(expected)
    for r in rows:
        assert (r["capacity"], r["batch"], r["status"], r["repeats"], r["iters"]) == ("256", "32", "ok", "1", "2")
        assert float(r["median_us"]) > 0
        assert r["speedup_vs_seeds"] != ""
        if r["impl"] == "seeds-cumsum":
            assert float(r["speedup_vs_seeds"]) == 1.0

    md = md_path.read_text()
    out = capsys.readouterr().out
    for text in (md, out):
        assert f"gper {gper.__version__} bench | CPU: " in text
        assert "ran on the cpu" in text.lower()
        assert "gper-torch" in text and "torch-multinomial" in text
    assert "| impl | op | capacity | batch | mode | median_us | vs_seeds |" in md


def test_parse_sizes():
    assert parse_sizes(["16,18", "2^20", "2**21", "1000"], 40) == [2**16, 2**18, 2**20, 2**21, 1000]
    assert parse_sizes(["32", "256"], None) == [32, 256]
    with pytest.raises(Exception, match="not a size"):
        parse_sizes(["lots"], 40)


def test_bench_records_oom_and_refusals(tmp_path, monkeypatch):
    """Running out of memory at one size, or a baseline torch refuses, is recorded and the sweep goes on."""
    from gper.bench import workload
    from gper.bench.replay import BenchConfig, run

    real_init = workload.GperWorkload.__init__

    def init(self, capacity, *args, **kwargs):
        if capacity == 2**9:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        real_init(self, capacity, *args, **kwargs)

    def refuse(self, b):
        raise RuntimeError("number of categories cannot exceed 2^24 (simulated)")

    monkeypatch.setattr(workload.GperWorkload, "__init__", init)
    monkeypatch.setattr(workload.SeedsBaseline, "sample_multinomial", refuse)
    cfg = BenchConfig([2**8, 2**9], [32], torch.device("cpu"), graph=False, repeats=1, iters=1, out=tmp_path)
    rows = run(cfg).rows
    status = {(r.impl, r.op, r.capacity): r.status for r in rows}
    assert len(status) == len(rows) == 20
    assert status[("gper-torch", "sample", 2**8)] == "ok"
    assert all(status[("gper-torch", op, 2**9)] == "oom" for op in OPS)
    assert all(status[("seeds-cumsum", op, c)] == "ok" for op in OPS for c in (2**8, 2**9))
    assert all(s == "n/a" for (impl, _, _), s in status.items() if impl == "torch-multinomial")
    (csv_path,) = tmp_path.glob("*.csv")
    assert len(csv_path.read_text().splitlines()) == 1 + len(rows)
