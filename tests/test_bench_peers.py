"""Smoke tests of ``benchmarks/bench_peers.py`` and ``benchmarks/peer_exactness.py`` on the CPU, at tiny sizes.

Timings are not checked (benchmarks are not tests); the rows, columns and files are. Peers that
are not installed here (TorchRL, cpprb, flashbax are optional) are skipped, and the report must
say why.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_peers  # noqa: E402
import peer_exactness  # noqa: E402

CPU = torch.device("cpu")


def _config(tmp_path: Path, peers: list[str], **kw) -> bench_peers.PeersConfig:
    settings = {"repeats": 1, "warmup": 1, "target_ms": 0.5, "out": tmp_path, **kw}
    return bench_peers.PeersConfig(capacities=[2**8], batches=[32], device=CPU, peers=peers, **settings)


def test_in_process_peers_rows_and_files(tmp_path, capsys):
    """gper, the seeds and whichever in-process peers are installed: every op, one row each, files written."""
    wanted = ["gper", "seeds", "multinomial", "torchrl", "torchrl-td", "cpprb"]
    here = [p for p in wanted if bench_peers.peer_status(p, CPU)[0]]
    rows, info = bench_peers.run(_config(tmp_path, wanted))

    (csv_path,) = tmp_path.glob("peers-cpu-*.csv")
    (md_path,) = tmp_path.glob("peers-cpu-*.md")
    assert csv_path.stem == md_path.stem
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(bench_peers.COLUMNS)
        got = list(reader)
    impls = {"gper": "gper-torch", "seeds": "seeds-cumsum", "multinomial": "torch-multinomial"}
    expected = set()
    for p in here:
        impl = impls.get(p, p)
        ops = ("sample", "step") if p == "multinomial" else bench_peers.OPS
        expected |= {(impl, op) for op in ops}
    assert {(r["impl"], r["op"]) for r in got} == expected
    assert len(got) == len(expected) == len(rows)
    for r in got:
        assert (r["capacity"], r["batch"], r["status"], r["mode"]) == ("256", "32", "ok", "eager"), r
        assert float(r["median_us"]) > 0 and r["x_gper_eager"] != ""
        if r["impl"] == "gper-torch":
            assert float(r["x_gper_eager"]) == 1.0

    md = md_path.read_text()
    out = capsys.readouterr().out
    for text in (md, out):
        assert "gper 0.1.0 peers | CPU: " in text
        assert "step = sample + update_priorities" in text
    for p, why in info["absent"].items():
        assert p in md and why in md
    if importlib.util.find_spec("matplotlib"):
        assert md_path.with_suffix(".png").stat().st_size > 1000


def test_jax_peer_in_a_subprocess(tmp_path):
    """flashbax runs in a worker process; its rows come back through the JSON file."""
    if not bench_peers.peer_status("flashbax", CPU)[0]:
        pytest.skip("flashbax / jax not installed")
    rows, info = bench_peers.run(_config(tmp_path, ["flashbax"], ops=["step", "step+add"], plot=False))
    # one jitted function, separate jitted calls (whose results must outlive the state they donate), and
    # for the step a jitted loop of SCAN_STEPS steps
    assert [(r.impl, r.op, r.mode, r.status) for r in rows] == [
        ("flashbax", op, mode, "ok")
        for op, modes in (("step", ("jit", "jit-split", "jit-scan")), ("step+add", ("jit", "jit-split")))
        for mode in modes
    ], [r.note for r in rows]
    assert "jax" in info["versions"]["flashbax"]
    assert not list(tmp_path.glob("*.png"))


def test_skips_are_recorded(tmp_path, monkeypatch):
    """A fill that would take too long, or a call over the limit, is recorded as skipped with its reason."""
    cfg = _config(tmp_path, ["gper"], ops=["sample"], out=None)

    def slow(*args, **kwargs):
        raise bench_peers.Skip("filling would take about 999 s (over --max-fill-s 1)")

    monkeypatch.setattr(bench_peers, "GperPeer", slow)
    rows, _ = bench_peers.run(cfg)
    assert [(r.status, r.note) for r in rows] == [("skipped", "filling would take about 999 s (over --max-fill-s 1)")]
    assert rows[0].mode == "eager" and bench_peers._plain_mode("flashbax-x64") == "jit"  # JAX peers are jitted


def test_deadline_skips_the_rest(tmp_path):
    """Past --deadline-s nothing more starts, and the report is still written."""
    cfg = _config(tmp_path, ["gper", "seeds"], ops=["step"], deadline=time.monotonic() - 1, plot=False)
    rows, _ = bench_peers.run(cfg)
    assert {(r.impl, r.status, r.note) for r in rows} == {
        (impl, "skipped", "not started: past --deadline-s") for impl in ("gper-torch", "seeds-cumsum")
    }
    assert len(list(tmp_path.glob("peers-cpu-*.md"))) == 1


def test_headline_and_targets():
    rows = [
        bench_peers.Row("gper-triton", "step", 2**24, 16384, "graph", median_us=30.0),
        bench_peers.Row("gper-triton", "step", 2**24, 16384, "eager", median_us=40.0),
        bench_peers.Row("torchrl", "step", 2**24, 16384, "eager", median_us=12000.0),
        bench_peers.Row("flashbax", "step", 2**24, 16384, "jit", median_us=900.0),
    ]
    title, (headers, lines, _) = bench_peers.headline(rows, torch.device("cuda"))
    assert "2^24" in title
    by = {line[0]: line for line in lines}
    assert by["torchrl"][4] == "400x" and by["torchrl"][6] == "300x"
    assert by["torchrl"][-1] == "300x met / 100x met"
    assert by["flashbax"][-1] == "50x NOT met / 25x NOT met"


@pytest.mark.parametrize("kind", ["iid", "stratified"])
def test_exact_coverage_formula_matches_a_simulation(kind):
    """The reach check's expectation is what exact sampling gives (checked against numpy's own draws)."""
    rng = np.random.default_rng(3)
    n, k, calls = 4096, 512, 8
    p = rng.uniform(0.5, 1.5, n)
    q = p / p.sum()
    expected = peer_exactness._hit_probability(q, k * calls, kind, k).mean()
    covered = []
    for _ in range(20):
        hit = np.zeros(n, bool)
        for _ in range(calls):
            u = rng.random(k) if kind == "iid" else (np.arange(k) + rng.random(k)) / k
            hit[np.minimum(np.searchsorted(np.cumsum(q), u, side="right"), n - 1)] = True
        covered.append(hit.mean())
    assert abs(np.mean(covered) - expected) < 0.004


def test_exactness_checks_run(tmp_path):
    """Every check on gper and the seeds (and on cpprb / TorchRL when installed), with the report written."""
    optional = ("cpprb", "torchrl", "torchrl-fp64")
    status = peer_exactness.STATUS_PEER
    peers = ["gper", "seeds"] + [p for p in optional if peer_exactness.peer_status(status.get(p, p), CPU)[0]]
    cfg = peer_exactness.ExactConfig(
        device=CPU,
        peers=peers,
        reach_log2=10,
        reach_per_slot=1.0,
        tiny_draws=2**16,
        distinct_draws=2**14,
        batch=2**12,
        budget_s=5.0,
        out=tmp_path,
    )
    results = peer_exactness.run(cfg)
    assert [(r.peer, r.check) for r in results] == [(p, c) for p in peers for c in ("reach", "tiny leaf", "distinct")]
    for r in results:
        assert not r.verdict.startswith("error"), r
        if r.check in ("reach", "distinct"):
            assert r.verdict == "ok", r
    (md,) = tmp_path.glob("peer-exactness-cpu-*.md")
    assert "## reach" in md.read_text()
