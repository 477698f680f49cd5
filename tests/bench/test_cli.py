"""``gper bench`` on the CPU: the subcommands and their aliases parse, ``--help`` works, and a run writes its files.

Timings are not checked (benchmarks are not tests); the rows, columns and files are.
"""

from __future__ import annotations

import csv
import re
import time

import pytest
import torch

import gper
from gper.bench import command
from gper.bench.buffer_sweep import COLUMNS, OPS
from gper.bench.commands import exactness as exactness_cmd
from gper.bench.commands import peers as peers_cmd
from gper.bench.commands import replay as replay_cmd
from gper.bench.commands import train_step as train_step_cmd
from gper.bench.flags import parse_sizes
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
    expected = [("gper-torch", op, "eager") for op in OPS] + [("cumsum", op, "eager") for op in OPS]
    expected += [("torch-multinomial", op, "eager") for op in ("sample", "step")]
    assert got == sorted(expected)
    for r in rows:
        assert (r["capacity"], r["batch"], r["status"], r["repeats"], r["iters"]) == ("256", "32", "ok", "1", "2")
        assert float(r["median_us"]) > 0
        assert r["speedup_vs_cumsum"] != ""
        if r["impl"] == "cumsum":
            assert float(r["speedup_vs_cumsum"]) == 1.0

    md = md_path.read_text()
    out = capsys.readouterr().out
    for text in (md, out):
        assert f"gper {gper.__version__} bench | CPU: " in text
        assert "ran on the cpu" in text.lower()
        assert "gper-torch" in text and "torch-multinomial" in text
    assert "| impl | op | capacity | batch | mode | median_us | vs_cumsum |" in md
    assert out.startswith(f"gper bench: result files go to {tmp_path.resolve()} (--out DIR to change)\n")


def test_parse_sizes():
    assert parse_sizes(["16,18", "2^20", "2**21", "1000"], 40) == [2**16, 2**18, 2**20, 2**21, 1000]
    assert parse_sizes(["32", "256"], None) == [32, 256]
    with pytest.raises(Exception, match="not a size"):
        parse_sizes(["lots"], 40)


def test_bench_records_oom_and_refusals(tmp_path, monkeypatch):
    """Running out of memory at one size, or a baseline torch refuses, is recorded and the sweep goes on."""
    from gper.bench.buffer_sweep import BenchConfig, run
    from gper.bench.peers import baselines
    from gper.bench.peers import gper as gper_peer

    real_init = gper_peer.GperPeer.__init__

    def init(self, capacity, *args, **kwargs):
        if capacity == 2**9:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        real_init(self, capacity, *args, **kwargs)

    def refuse(self, b):
        raise RuntimeError("number of categories cannot exceed 2^24 (simulated)")

    monkeypatch.setattr(gper_peer.GperPeer, "__init__", init)
    monkeypatch.setattr(baselines.CumsumBaseline, "sample_multinomial", refuse)
    cfg = BenchConfig([2**8, 2**9], [32], torch.device("cpu"), graph=False, repeats=1, iters=1, out=tmp_path)
    rows = run(cfg).rows
    status = {(r.impl, r.op, r.capacity): r.status for r in rows}
    assert len(status) == len(rows) == 20
    assert status[("gper-torch", "sample", 2**8)] == "ok"
    assert all(status[("gper-torch", op, 2**9)] == "oom" for op in OPS)
    assert all(status[("cumsum", op, c)] == "ok" for op in OPS for c in (2**8, 2**9))
    assert all(s == "n/a" for (impl, _, _), s in status.items() if impl == "torch-multinomial")
    (csv_path,) = tmp_path.glob("*.csv")
    assert len(csv_path.read_text().splitlines()) == 1 + len(rows)


# ----------------------------------------------------------------------------------------------
# subcommands and aliases


def _parse(argv: list[str]):
    return command.build_parser().parse_args(command.resolve_aliases(argv))


@pytest.mark.parametrize(
    ("argv", "resolved"),
    [
        ([], ["replay"]),
        (["--quick", "--device", "cpu"], ["replay", "--quick", "--device", "cpu"]),
        (["--train", "--steps", "3"], ["train-step", "--steps", "3"]),
        (["--steps", "3", "--train"], ["train-step", "--steps", "3"]),
        (["replay", "--quick"], ["replay", "--quick"]),
        (["peers", "--quick"], ["peers", "--quick"]),
        (["exactness"], ["exactness"]),
        (["train-step"], ["train-step"]),
        (["--help"], ["--help"]),
    ],
)
def test_aliases(argv, resolved):
    assert command.resolve_aliases(argv) == resolved


def test_bench_is_bench_replay():
    """``gper bench [flags]`` and ``gper bench replay [flags]`` make the same sweep."""
    flags = ["--device", "cpu", "--capacities", "10,12", "--batches", "32", "--impls", "gper", "seeds", "--quick"]
    a, b = replay_cmd.replay_config(_parse(flags)), replay_cmd.replay_config(_parse(["replay", *flags]))
    assert a == b
    assert (a.capacities, a.batches, a.impls) == ([2**10, 2**12], [32], ["gper", "cumsum"])
    assert (a.repeats, a.graph) == (2, False)


def test_replay_defaults_on_the_cpu():
    cfg = replay_cmd.replay_config(_parse(["--device", "cpu"]))
    assert (cfg.capacities, cfg.batches, cfg.repeats, cfg.target_ms) == ([2**10, 2**14, 2**16], [256, 4096], 5, 10.0)
    assert (cfg.impls, cfg.ops, cfg.backend, str(cfg.out)) == (
        ["gper", "cumsum", "multinomial"],
        list(OPS),
        "auto",
        "benchmarks/results",
    )


def test_train_alias_builds_the_same_config(monkeypatch):
    """``gper bench --train`` is ``gper bench train-step``: same TrainBenchConfig, handed to run_train_bench."""
    from gper.bench import train_step

    seen = []
    monkeypatch.setattr(train_step, "run_train_bench", lambda cfg: seen.append(cfg))
    flags = ["--device", "cpu", "--capacities", "12", "--batches", "64", "--hidden", "8", "8", "--steps", "3"]
    assert main(["bench", "--train", *flags, "--out", "x"]) == 0
    assert main(["bench", "train-step", *flags, "--out", "x"]) == 0
    assert main(["bench", "train-step", *flags, "--quick", "--out", "x"]) == 0
    a, b, quick = seen
    assert a == b
    assert (a.capacity, a.batch, a.hidden, a.steps, a.repeats) == (2**12, 64, (8, 8), 3, 3)
    # --quick: fewer repeats and the first precision only; explicit --steps still win
    assert (quick.steps, quick.repeats, quick.precisions) == (3, 2, ("fp32",))
    assert (a.precisions, a.device.type, str(a.out)) == (("fp32",), "cpu", "x")
    cpu = train_step_cmd.train_config(_parse(["--train", "--device", "cpu"]))
    assert (cpu.capacity, cpu.batch, cpu.hidden, cpu.steps, cpu.repeats) == (2**14, 256, (64, 64), 10, 3)
    assert (
        cpu.fused_step
        and not train_step_cmd.train_config(_parse(["train-step", "--device", "cpu", "--no-fused-step"])).fused_step
    )
    with pytest.raises(SystemExit, match="need CUDA"):
        train_step_cmd.train_config(_parse(["train-step", "--device", "cpu", "--precisions", "tf32"]))
    with pytest.raises(SystemExit, match="larger than the replay"):
        train_step_cmd.train_config(_parse(["train-step", "--device", "cpu", "--capacities", "5", "--batches", "64"]))


def test_peers_flags(tmp_path):
    """The flags of the GPU command (benchmarks/PEERS_DEVICE_CMD.txt) land in PeersConfig."""
    argv = ["peers", "--device", "cpu", "--capacities", "16", "20", "24", "25", "--batches", "256", "16384"]
    argv += ["--repeats", "5", "--target-ms", "10", "--max-cell-s", "3", "--max-fill-s", "125", "--deadline-s", "370"]
    argv += ["--peers", "gper", "seeds", "flashbax", "--no-plot", "--out", str(tmp_path)]
    t0 = time.monotonic()
    cfg = peers_cmd.peers_config(_parse(argv))
    assert cfg.capacities == [2**16, 2**20, 2**24, 2**25] and cfg.batches == [256, 16384]
    assert (cfg.repeats, cfg.target_ms, cfg.max_cell_s, cfg.max_fill_s, cfg.plot) == (5, 10.0, 3.0, 125.0, False)
    assert cfg.peers == ["gper", "cumsum", "flashbax"] and cfg.out == tmp_path
    assert t0 + 369 < cfg.deadline < time.monotonic() + 371
    quick = peers_cmd.peers_config(_parse(["peers", "--device", "cpu", "--quick"]))
    assert (quick.capacities, quick.batches, quick.repeats, quick.deadline) == ([2**12, 2**16], [256], 2, None)
    assert (quick.warmup, quick.max_call_s, quick.worker_timeout_s, quick.seed) == (3, 2.0, 1500.0, 0)


def test_exactness_flags():
    argv = ["exactness", "--device", "cpu", "--peers", "gper", "gper-stratified", "seeds", "multinomial"]
    cfg = exactness_cmd.exactness_config(_parse([*argv, "--budget-s", "6", "--tiny-draws", "2^20", "--checks", "tiny"]))
    assert cfg.peers == ["gper", "gper-stratified", "cumsum", "multinomial"]
    assert (cfg.budget_s, cfg.tiny_draws, cfg.checks, cfg.reach_log2, cfg.batch) == (6.0, 2**20, ("tiny",), 22, 2**20)
    assert (cfg.distinct_draws, cfg.deadline) == (2**24, None)


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["bench", "--help"], ["replay", "peers", "exactness", "train-step", "--train"]),
        (["bench", "replay", "--help"], ["--capacities", "--impls", "--graph", "--quick"]),
        (["bench", "--quick", "--help"], ["--capacities", "--impls"]),
        (["bench", "--train", "--help"], ["--hidden", "--precisions", "--steps"]),
        (["bench", "train-step", "--help"], ["--hidden", "--precisions", "--steps"]),
        (["bench", "peers", "--help"], ["--peers", "--max-fill-s", "--deadline-s", "--threads", "--no-plot"]),
        (["bench", "exactness", "--help"], ["--reach-log2", "--tiny-draws", "--budget-s", "--checks"]),
        (["bench", "checkpoint", "--help"], ["--capacities", "--folder", "--no-torch-save"]),
        (["--help"], ["train", "bench"]),
    ],
)
def test_help(argv, flags, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in flags:
        assert flag in out, flag


def test_gper_help_lists_every_bench_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    (bench_line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("bench ")]
    for name in command.SUBCOMMANDS:
        assert re.search(rf"\b{re.escape(name)}\b", bench_line), name


def test_dispatcher(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and f"gper {gper.__version__}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["nonsense"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["bench", "replay", "--no-such-flag"])
    assert e.value.code == 2


def test_bench_replay_quick_writes_files(tmp_path):
    """``gper bench replay --quick``-style run on the CPU, into a tmp --out."""
    argv = ["bench", "replay", "--device", "cpu", "--quick", "--capacities", "8", "--batches", "32", "--iters", "2"]
    assert main([*argv, "--ops", "step", "--impls", "gper", "cumsum", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("bench-cpu-*.csv")
    rows = list(csv.DictReader(open(csv_path, newline="")))
    assert [(r["impl"], r["op"], r["status"], r["repeats"]) for r in rows] == [
        ("gper-torch", "step", "ok", "2"),
        ("cumsum", "step", "ok", "2"),
    ]
    md = csv_path.with_suffix(".md").read_text()
    assert "Command: `gper bench replay --device cpu --quick" in md


def test_bench_checkpoint_saves_loads_and_writes_its_table(tmp_path, capsys):
    """A small run on the CPU: every row, the files, and the loaded buffer checked against the saved one."""
    argv = ["bench", "checkpoint", "--device", "cpu", "--capacities", "10", "--folder", str(tmp_path / "f")]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    for op in ("save", "load (page cache)", "load (cold)", "torch.save(state_dict)", "torch.load (cold)"):
        assert op in out, op
    (csv,) = (tmp_path / "r").glob("checkpoint-cpu-*.csv")
    assert len(csv.read_text().splitlines()) == 6
    assert not list((tmp_path / "f").iterdir()), "the files are deleted after"
