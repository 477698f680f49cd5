"""``gper bench trajectory`` and the trajectory workload's peers on the CPU, at tiny sizes.

Timings are not checked (benchmarks are not tests); the rows, their batch sizes, the ratios and
the files are. Peers that are not installed here (flashbax) or whose compiled part does not load
(TorchRL's sum tree) are skipped, and the report must say why.
"""

from __future__ import annotations

import csv
import importlib.util

import pytest
import torch

import gper
from gper.bench import command, peers
from gper.bench.commands import peers as peers_cmd
from gper.bench.commands import trajectory as trajectory_cmd
from gper.bench.peers import gper_traj, torchrl_nstep
from gper.bench.peers.base import TRAJ_OPS, Setting, Skip
from gper.bench.peers_sweep import PeersConfig, run
from gper.bench.trajectory_sweep import COLUMNS, FLAT_OF
from gper.bench.workload import GAMMA, N_STEP, TrajectoryWorkload
from gper.cli import main

CPU = torch.device("cpu")
#: 16 streams of 256 rows: a window of 80 fits, and one sweep runs in seconds on the torch back end
TINY = ["--device", "cpu", "--capacities", "12", "--batches", "64", "--repeats", "1", "--iters", "2"]


def test_trajectory_sweep_rows_ratios_and_files(tmp_path, capsys):
    """Every trajectory op beside the flat op it is compared with; add-envs and sequences at their own batches."""
    assert main(["bench", "trajectory", *TINY, "--seq-length", "8", "--burn-in", "4", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("trajectory-cpu-*.csv")
    (md_path,) = tmp_path.glob("trajectory-cpu-*.md")
    assert csv_path.stem == md_path.stem
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(COLUMNS)
        rows = list(reader)
    got = {(r["impl"], r["op"], r["batch"]) for r in rows}
    traj = {("gper-traj-torch", op, "64") for op in TRAJ_OPS if op not in ("add-envs", "sequences")}
    traj |= {("gper-traj-torch", "add-envs", "16"), ("gper-traj-torch", "sequences", "32")}
    flat = {("gper-torch", "sample", "64"), ("gper-torch", "step", "64"), ("gper-torch", "add", "16")}
    assert got == traj | flat and len(rows) == len(got)
    for r in rows:
        assert (r["capacity"], r["mode"], r["status"], r["iters"]) == ("4096", "eager", "ok", "2"), r
        assert float(r["median_us"]) > 0
        # x_flat: the trajectory median over the flat one beside it
        assert (r["x_flat"] != "") == (r["op"] in FLAT_OF), r
    by = {(r["op"], r["batch"]): float(r["median_us"]) for r in rows}
    x = next(float(r["x_flat"]) for r in rows if r["op"] == "sample-n3")
    # the CSV rounds medians and ratios to 3 decimals: the ratio of the rounded medians is off by up
    # to half a unit of each median's last place relative to it (times the ratio), plus the ratio's own
    num, den = by[("sample-n3", "64")], by[("sample", "64")]
    assert x == pytest.approx(num / den, abs=x * (5e-4 / num + 5e-4 / den) + 5e-4)

    md = md_path.read_text()
    out = capsys.readouterr().out
    for text in (md, out):
        assert f"gper {gper.__version__} trajectory | CPU: " in text
        assert "ran on the cpu" in text.lower()
        assert "targets at 2^12 slots, B = 64, eager" in text
        assert "sample_sequences(B, length=8, burn_in=4)" in text
    assert "| impl | op | capacity | batch | mode | median_us | x_flat | note |" in md


def test_trajectory_flags():
    parse = command.build_parser().parse_args
    cpu = trajectory_cmd.trajectory_config(parse(["trajectory", "--device", "cpu"]))
    assert (cpu.capacities, cpu.batches, cpu.repeats, cpu.graph, cpu.flat) == ([2**12, 2**14], [256], 3, False, True)
    assert cpu.traj == TrajectoryWorkload(num_envs=16, seq_batch=32) and cpu.ops == list(TRAJ_OPS)
    argv = ["trajectory", "--device", "cpu", "--capacities", "16", "--num-envs", "8", "--window", "20"]
    cfg = trajectory_cmd.trajectory_config(
        parse([*argv, "--seq-length", "20", "--ops", "step-n3", "sample-n1", "--no-flat"])
    )
    assert (cfg.capacities, cfg.ops, cfg.flat) == ([2**16], ["sample-n1", "step-n3"], False)
    assert (cfg.traj.num_envs, cfg.traj.window, cfg.traj.seq_length, cfg.traj.burn_in) == (8, 20, 20, 40)
    with pytest.raises(SystemExit, match="longer than --window"):
        trajectory_cmd.trajectory_config(parse(["trajectory", "--device", "cpu", "--window", "10"]))
    peers_cfg = peers_cmd.peers_config(parse(["peers", "--device", "cpu", "--peers", "gper-traj", "--num-envs", "32"]))
    assert peers_cfg.traj.num_envs == 32 and "sample-n3" in peers_cfg.ops and "sequences" not in peers_cfg.ops


def test_too_small_a_capacity_is_skipped(tmp_path):
    """A capacity whose streams cannot hold a window is recorded as skipped, with the sizes it needs."""
    argv = ["bench", "trajectory", "--device", "cpu", "--capacities", "10", "--batches", "64", "--no-flat"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("*.csv")
    rows = list(csv.DictReader(open(csv_path, newline="")))
    assert {r["status"] for r in rows} == {"skipped"} and len(rows) == len(TRAJ_OPS)
    assert "at least 1,312" in rows[0]["note"]


def _setting(**kw) -> Setting:
    return Setting(CPU, 0, (32,), traj=TrajectoryWorkload(num_envs=16, **kw))


def test_gper_traj_peer_streams_and_priorities():
    """The fill reads as episodes (no discontinuity: obs is the previous next_obs unless an episode ended), every
    stream's ring is full, and every drawable start has its own random priority; the timed add continues them."""
    p = gper_traj.build(("gper-traj",), 2**12, _setting())
    st = p.rb.stats()
    assert (st["steps"], st["size"], st["discontinuities"]) == (256, 2**12, 0)
    starts = p.rb.drawable().nonzero().squeeze(1)
    prio = p.rb.priorities(starts)
    assert starts.numel() == st["drawable"] > 2**12 // 2 and prio.unique().numel() == starts.numel()
    assert prio.max() / prio.min() > 100  # TD errors over 1e-3..1e2, alpha 0.6: far from uniform
    p.prepare(16, first=True)
    add = p.op("gper-traj", "add-envs", 16)
    add()  # after the fill's last step: a reset, reported or not
    after_first = p.rb.stats()["discontinuities"]
    add()
    add()
    assert 0 < after_first <= 16 and p.rb.stats()["discontinuities"] == after_first  # the others continue it


def test_torchrl_multistep_transform_writes_nstep_transitions():
    """TorchRL's MultiStepTransform peer: full after the fill, and what it samples is 3-step (gamma 0.99)."""
    if not peers.status("torchrl-nstep-uniform", CPU)[0]:
        pytest.skip("torchrl / tensordict not installed")
    p = torchrl_nstep.build(("torchrl-nstep-uniform",), 2**10, _setting())
    assert len(p.rb) == 2**10
    s = p.rb.sample(256)
    steps = s["steps_to_next_obs"]
    assert steps.max() == N_STEP and steps.min() >= 1  # fewer where an episode ended first
    assert torch.allclose(s["gamma"], GAMMA ** steps.float())
    p.prepare(16, first=True)
    before = len(p.rb)
    p.op("torchrl-nstep-uniform", "add-envs", 16)()
    assert len(p.rb) == before  # full: one step of every stream overwrites 16 transitions


def test_trajectory_peers_rows_and_skips(tmp_path):
    """gper-traj and TorchRL's n-step peers in ``gper bench peers``: their own ops at their own batch sizes;
    TorchRL's prioritized one is skipped with its reason where its compiled sum tree does not load."""
    names = ["gper-traj", "torchrl-nstep", "torchrl-nstep-uniform"]
    cfg = PeersConfig(
        capacities=[2**12],
        batches=[16, 64],
        device=CPU,
        peers=names,
        repeats=1,
        warmup=1,
        target_ms=0.5,
        out=tmp_path,
        plot=False,
        traj=TrajectoryWorkload(num_envs=16),
    )
    here = {p for p in names if peers.status(p, CPU)[0]}
    rows, info = run(cfg)
    assert set(info["versions"]) == here and set(info["absent"]) == set(names) - here
    md = next(tmp_path.glob("peers-cpu-*.md")).read_text()
    for p, why in info["absent"].items():
        assert p in md and why in md
    n_ops = [op for op in TRAJ_OPS if op not in ("add-envs", "sequences")]
    expected = {("gper-traj-torch", op, b) for op in n_ops for b in (16, 64)} | {("gper-traj-torch", "add-envs", 16)}
    for p in here - {"gper-traj"}:
        ops = torchrl_nstep.NSTEP_OPS[p]
        expected |= {(p, op, b) for op in ops if op != "add-envs" for b in (16, 64)} | {(p, "add-envs", 16)}
    assert {(r.impl, r.op, r.batch) for r in rows} == expected
    assert all(r.status == "ok" and r.mode == "eager" for r in rows), [(r.impl, r.op, r.note) for r in rows]
    assert "trajectory workload: sample-n3 = 3-step sample (gamma 0.99), us" in md


def test_flashbax_trajectory_buffer(tmp_path):
    """flashbax's trajectory buffer: skipped with its reason where it is not installed, else timed in its worker."""
    ok, why = peers.status("flashbax-traj", CPU)
    cfg = PeersConfig(
        capacities=[2**12],
        batches=[16],
        device=CPU,
        peers=["flashbax-traj"],
        ops=["sample-n3", "step-n3", "add-envs"],
        repeats=1,
        warmup=1,
        target_ms=0.5,
        out=tmp_path,
        plot=False,
        traj=TrajectoryWorkload(num_envs=16),
    )
    if not ok:
        assert why.endswith('not installed (pip install ".[peers]")')
        rows, info = run(cfg)
        assert rows == [] and info["absent"] == {"flashbax-traj": why}
        with pytest.raises(Skip, match=r"\.\[peers\]"):
            peers.load("flashbax-traj").build(("flashbax-traj",), 2**12, _setting())
        return
    rows, _ = run(cfg)
    assert sorted((r.op, r.mode, r.status) for r in rows) == sorted(
        [("sample-n3", "jit", "ok"), ("add-envs", "jit", "ok")]
        + [("step-n3", m, "ok") for m in ("jit", "jit-split", "jit-scan")]
    ), [r.note for r in rows]


@pytest.mark.parametrize(("name", "library"), [("torchrl-nstep", "torchrl"), ("torchrl-nstep-uniform", "torchrl")])
def test_missing_torchrl_skips_cleanly(name, library, monkeypatch):
    """Without TorchRL, its n-step peers say why (naming the peers extra); building one raises Skip."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == library else real(n, *a))
    ok, why = peers.status(name, CPU)
    assert not ok and why == f'{library} not installed (pip install ".[peers]")'
    with pytest.raises(Skip, match=r"\.\[peers\]"):
        peers.load(name).build((name,), 2**12, _setting())


def test_help_lists_the_trajectory_flags(capsys):
    for argv, flags in (
        (["bench", "--help"], ["trajectory"]),
        (["bench", "trajectory", "--help"], ["--num-envs", "--window", "--seq-length", "--burn-in", "--no-flat"]),
        (["bench", "peers", "--help"], ["--num-envs", "gper-traj", "flashbax-traj", "torchrl-nstep-uniform"]),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        out = capsys.readouterr().out
        assert e.value.code == 0 and all(f in out for f in flags), (argv, out)
