"""Smoke tests of ``gper bench peers`` and ``gper bench exactness`` on the CPU, at tiny sizes, and of the peer modules.

Timings are not checked (benchmarks are not tests); the rows, columns and files are. Peers that
are not installed here (TorchRL, cpprb, flashbax are optional) are skipped, and the report must
say why.
"""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gper.bench import exactness, peers
from gper.bench.checks import ExactConfig, hit_probability
from gper.bench.harness import Row
from gper.bench.peers import gper as gper_peer
from gper.bench.peers.base import Setting, Skip
from gper.bench.peers_report import headline
from gper.bench.peers_sweep import COLUMNS, OPS, PeersConfig, plain_mode, run

CPU = torch.device("cpu")
#: the libraries each optional peer module needs
LIBRARIES = {"torchrl": ("torchrl", "tensordict"), "cpprb": ("cpprb",), "flashbax": ("jax", "flashbax")}


def _config(tmp_path: Path, peers: list[str], **kw) -> PeersConfig:
    settings = {"repeats": 1, "warmup": 1, "target_ms": 0.5, "out": tmp_path, **kw}
    return PeersConfig(capacities=[2**8], batches=[32], device=CPU, peers=peers, **settings)


def test_in_process_peers_rows_and_files(tmp_path, capsys):
    """gper, the baselines and whichever in-process peers are installed: every op, one row each, files written."""
    wanted = ["gper", "cumsum", "multinomial", "torchrl", "torchrl-td", "cpprb"]
    here = [p for p in wanted if peers.status(p, CPU)[0]]
    rows, info = run(_config(tmp_path, wanted))

    (csv_path,) = tmp_path.glob("peers-cpu-*.csv")
    (md_path,) = tmp_path.glob("peers-cpu-*.md")
    assert csv_path.stem == md_path.stem
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(COLUMNS)
        got = list(reader)
    impls = {"gper": "gper-torch", "cumsum": "cumsum", "multinomial": "torch-multinomial"}
    expected = set()
    for p in here:
        impl = impls.get(p, p)
        ops = ("sample", "step") if p == "multinomial" else OPS
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
    png = md_path.with_suffix(".png")
    if importlib.util.find_spec("matplotlib"):
        assert png.stat().st_size > 1000
    assert (f"![time per PER step]({png.name})" in md) == png.exists()


@pytest.mark.parametrize(
    "settings", [{"ops": ["sample"]}, {"ops": ["step"], "plot": False}], ids=["no-step-rows", "no-plot"]
)
def test_the_markdown_shows_no_plot_where_none_was_drawn(tmp_path, settings):
    """Without step rows there is nothing to plot, and --plot False draws none: no PNG is written,
    and the Markdown links none."""
    run(_config(tmp_path, ["gper"], **settings))
    (md_path,) = tmp_path.glob("peers-cpu-*.md")
    assert not list(tmp_path.glob("*.png"))
    assert "![" not in md_path.read_text() and "## All rows" in md_path.read_text()


def test_jax_peer_in_a_subprocess(tmp_path):
    """flashbax runs in a worker process; its rows come back through the JSON file."""
    if not peers.status("flashbax", CPU)[0]:
        pytest.skip("flashbax / jax not installed")
    rows, info = run(_config(tmp_path, ["flashbax"], ops=["step", "step+add"], plot=False))
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
        raise Skip("filling would take about 999 s (over --max-fill-s 1)")

    monkeypatch.setattr(gper_peer, "GperPeer", slow)
    rows, _ = run(cfg)
    assert [(r.status, r.note) for r in rows] == [("skipped", "filling would take about 999 s (over --max-fill-s 1)")]
    assert rows[0].mode == "eager" and plain_mode("flashbax-x64") == "jit"  # JAX peers are jitted


def test_deadline_skips_the_rest(tmp_path):
    """Past --deadline-s nothing more starts, and the report is still written."""
    cfg = _config(tmp_path, ["gper", "cumsum"], ops=["step"], deadline=time.monotonic() - 1, plot=False)
    rows, _ = run(cfg)
    assert {(r.impl, r.status, r.note) for r in rows} == {
        (impl, "skipped", "not started: past --deadline-s") for impl in ("gper-torch", "cumsum")
    }
    assert len(list(tmp_path.glob("peers-cpu-*.md"))) == 1


def test_headline_and_targets():
    rows = [
        Row("gper-triton", "step", 2**24, 16384, "graph", median_us=30.0),
        Row("gper-triton", "step", 2**24, 16384, "eager", median_us=40.0),
        Row("torchrl", "step", 2**24, 16384, "eager", median_us=12000.0),
        Row("flashbax", "step", 2**24, 16384, "jit", median_us=900.0),
    ]
    title, (headers, lines, _) = headline(rows, torch.device("cuda"))
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
    expected = hit_probability(q, k * calls, kind, k).mean()
    covered = []
    for _ in range(20):
        hit = np.zeros(n, bool)
        for _ in range(calls):
            u = rng.random(k) if kind == "iid" else (np.arange(k) + rng.random(k)) / k
            hit[np.minimum(np.searchsorted(np.cumsum(q), u, side="right"), n - 1)] = True
        covered.append(hit.mean())
    assert abs(np.mean(covered) - expected) < 0.004


def test_exactness_checks_run(tmp_path):
    """Every check on gper and the cumsum baseline (and on cpprb / TorchRL when installed), with the report written."""
    optional = ("cpprb", "torchrl", "torchrl-fp64")
    names = ["gper", "cumsum"] + [p for p in optional if peers.status(p, CPU)[0]]
    cfg = ExactConfig(
        device=CPU,
        peers=names,
        reach_log2=10,
        reach_per_slot=1.0,
        tiny_draws=2**16,
        distinct_draws=2**14,
        batch=2**12,
        budget_s=5.0,
        out=tmp_path,
    )
    results = exactness.run(cfg)
    assert [(r.peer, r.check) for r in results] == [(p, c) for p in names for c in ("reach", "tiny leaf", "distinct")]
    for r in results:
        assert not r.verdict.startswith("error"), r
        if r.check in ("reach", "distinct"):
            assert r.verdict == "ok", r
    (md,) = tmp_path.glob("peer-exactness-cpu-*.md")
    assert "## reach" in md.read_text()


# ----------------------------------------------------------------------------------------------
# the peer modules


def test_registry():
    """Every name loads its module, which serves it; old names still resolve; unknown names are refused.

    The exactness checks' peers have a sampler; the trajectory workload's peers draw from the same trees.
    """
    for name in peers.MODULES:
        module = peers.load(name)
        assert name in module.NAMES
        for attr in ("status", "build", "WHERE_TIME_GOES") + (("sampler",) if name in exactness.PEERS else ()):
            assert hasattr(module, attr), (name, attr)
    assert peers.load("seeds") is peers.load("cumsum") and peers.canonical_name("seeds") == "cumsum"
    assert peers.status("gper", CPU)[0] and peers.status("multinomial", CPU)[0]
    with pytest.raises(ValueError, match="unknown peer"):
        peers.load("nonsense")


def test_peer_modules_import_no_peer_library():
    """Importing the registry and every peer module imports none of TorchRL, tensordict, cpprb, JAX, flashbax."""
    code = (
        "import sys, gper.bench.peers as p\n"
        "for n in p.MODULES: p.load(n)\n"
        "import gper.bench.command, gper.bench.peers_sweep, gper.bench.exactness\n"
        "print([m for m in ('torchrl', 'tensordict', 'cpprb', 'jax', 'flashbax') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("name", ["torchrl", "torchrl-td", "torchrl-fp64", "cpprb", "flashbax", "flashbax-x64"])
def test_missing_library_skips_cleanly(name, monkeypatch):
    """Without its library, a peer says why (naming the peers extra); building it raises Skip, not ImportError."""
    module = peers.load(name)
    libraries = LIBRARIES[module.__name__.rsplit(".", 1)[1]]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in libraries else real(n, *a))
    ok, why = peers.status(name, CPU)
    assert not ok and '".[peers]"' in why and libraries[0] in why
    with pytest.raises(Skip, match=r"\.\[peers\]"):
        module.build((name,), 2**8, Setting(CPU, batches=(32,)))
    with pytest.raises(Skip, match=r"\.\[peers\]"):
        module.sampler(name, CPU)


def test_missing_peer_is_named_in_the_report(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "cpprb" else real(n, *a))
    rows, info = run(_config(tmp_path, ["cpprb"], plot=False))
    assert rows == [] and "cpprb not installed" in info["absent"]["cpprb"]
    (md,) = tmp_path.glob("peers-cpu-*.md")
    assert "Skipped: cpprb (cpprb not installed" in md.read_text()
