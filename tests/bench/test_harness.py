"""The sweep engine (:mod:`gper.bench.harness`) with fake peers: what each way of failing records, and the timers."""

from __future__ import annotations

import time

import pytest
import torch

from gper.bench import harness
from gper.bench.harness import Calibrated, Group, Probed, Row, Sweep, chunks, fill, first_line, is_oom
from gper.bench.peers.base import Peer, Setting, Skip
from gper.bench.report import ResultFiles
from gper.bench.timing import Timing, time_steps, time_sync

CPU = torch.device("cpu")
OURS, OTHER = "gper-fake", "other"
QUIET = dict(log=lambda msg: None)


class FakePeer(Peer):
    """Two implementations; ``behaviour[(impl, op)]`` is what making the call does (default: a no-op call)."""

    def __init__(self, capacity: int, behaviour: dict | None = None, prepare_fails: dict | None = None, **kw) -> None:
        super().__init__(capacity, Setting(CPU))
        self.impls = kw.get("impls", (OURS, OTHER))
        self.modes = kw.get("modes", ("eager",))
        self.behaviour = behaviour or {}
        self.prepare_fails = prepare_fails or {}
        self.made: list[tuple] = []
        self.k = kw.get("steps", 1)

    def prepare(self, b: int, first: bool) -> None:
        if b in self.prepare_fails:
            raise self.prepare_fails[b]

    def randomize_priorities(self) -> None:
        pass

    def op(self, impl, name, b, mode="eager"):
        self.made.append((impl, name, b, mode))
        what = self.behaviour.get((impl, name))
        if isinstance(what, BaseException):
            raise what
        return what or (lambda: None)

    def steps_per_call(self, mode: str) -> int:
        return self.k

    def close(self) -> None:  # keep what the test inspects
        pass


def _sweep(**kw) -> Sweep:
    settings = dict(timer=Calibrated(warmup=0, iters=2, repeats=1), ops=("sample", "step"), batches=(8, 16))
    return Sweep(CPU, **{**settings, **QUIET, **kw})


def _group(peer: Peer, **kw) -> Group:
    return Group(peer.capacity, peer.impls, lambda: peer, **kw)


def _status(rows: list[Row]) -> dict:
    return {(r.impl, r.op, r.batch, r.mode): (r.status, r.note) for r in rows}


def test_every_cell_is_timed():
    peer = FakePeer(64)
    rows = _sweep().group(_group(peer))
    assert [(r.impl, r.op, r.batch, r.status, r.iters, r.repeats) for r in rows] == [
        (impl, op, b, "ok", 2, 1) for b in (8, 16) for impl in (OURS, OTHER) for op in ("sample", "step")
    ]
    assert all(r.median_us > 0 for r in rows)


def test_batches_above_the_capacity_are_left_out():
    rows = _sweep().group(_group(FakePeer(8)))
    assert {r.batch for r in rows} == {8}


def test_skip_oom_and_error_in_cells():
    behaviour = {
        (OURS, "sample"): Skip("one call took 9 s"),
        (OURS, "step"): torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"),
        (OTHER, "sample"): RuntimeError("boom\nsecond line"),
        (OTHER, "step"): MemoryError(),
    }
    status = _status(_sweep(batches=(8,)).group(_group(FakePeer(64, behaviour))))
    assert status == {
        (OURS, "sample", 8, "eager"): ("skipped", "one call took 9 s"),
        (OURS, "step", 8, "eager"): ("oom", "OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB"),
        (OTHER, "sample", 8, "eager"): ("error", "RuntimeError: boom"),
        (OTHER, "step", 8, "eager"): ("oom", "MemoryError: MemoryError"),
    }


def test_refusals_are_remembered_for_the_group():
    """With refusals on, a baseline's failure is n/a and its other cells are not tried; gper's stay errors."""
    behaviour = {(OTHER, "sample"): RuntimeError("categories > 2^24"), (OURS, "sample"): ValueError("bug")}
    peer = FakePeer(64, behaviour)
    status = _status(_sweep(refusals=True).group(_group(peer)))
    assert status[(OURS, "sample", 8, "eager")] == ("error", "ValueError: bug")
    assert status[(OURS, "step", 8, "eager")] == ("ok", "")
    for b in (8, 16):
        for op in ("sample", "step"):
            assert status[(OTHER, op, b, "eager")] == ("n/a", "RuntimeError: categories > 2^24")
    assert [m for m in peer.made if m[0] == OTHER] == [(OTHER, "sample", 8, "eager")]  # tried once only


def test_a_graph_refusal_leaves_eager_calls_alone():
    """Without CUDA a graph cannot be captured: the baseline's graph cells are n/a, its eager cells run."""
    peer = FakePeer(64, impls=(OTHER,), modes=("eager", "graph"))
    status = _status(_sweep(refusals=True, batches=(8,)).group(_group(peer)))
    assert status[(OTHER, "sample", 8, "eager")] == ("ok", "")
    assert status[(OTHER, "step", 8, "eager")] == ("ok", "")
    assert status[(OTHER, "sample", 8, "graph")][0] == status[(OTHER, "step", 8, "graph")][0] == "n/a"
    assert "CUDA" in status[(OTHER, "step", 8, "graph")][1]
    assert peer.made.count((OTHER, "step", 8, "graph")) == 0


def test_refusals_off_means_errors():
    behaviour = {(OTHER, "sample"): RuntimeError("no")}
    status = _status(_sweep(batches=(8,)).group(_group(FakePeer(64, behaviour))))
    assert status[(OTHER, "sample", 8, "eager")] == ("error", "RuntimeError: no")
    assert status[(OTHER, "step", 8, "eager")] == ("ok", "")


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (Skip("filling would take about 999 s"), "skipped"),
        (torch.OutOfMemoryError("out of memory"), "oom"),
        (RuntimeError("RESOURCE_EXHAUSTED: while allocating"), "oom"),
        (ImportError("no module"), "error"),
    ],
)
def test_a_build_that_fails_files_every_planned_cell(exc, status):
    def build():
        raise exc

    g = Group(64, (OURS, OTHER), build, ops_of=lambda impl: ("step",) if impl == OTHER else ("sample", "step"))
    g.unbuilt_modes = lambda impl: ("eager", "graph") if impl == OURS else ("jit",)
    rows = _sweep().group(g)
    assert {(r.impl, r.op, r.batch, r.mode) for r in rows} == {
        (OURS, op, b, m) for op in ("sample", "step") for b in (8, 16) for m in ("eager", "graph")
    } | {(OTHER, "step", b, "jit") for b in (8, 16)}
    assert {r.status for r in rows} == {status}
    assert all(str(exc).split(":")[0] in r.note for r in rows)


def test_a_batch_that_cannot_be_prepared_is_recorded_and_the_next_runs():
    peer = FakePeer(64, prepare_fails={8: torch.OutOfMemoryError("no room for the batch")})
    status = _status(_sweep().group(_group(peer)))
    assert {v for k, v in status.items() if k[2] == 8} == {("oom", "OutOfMemoryError: no room for the batch")}
    assert {v for k, v in status.items() if k[2] == 16} == {("ok", "")}


def test_deadline_before_the_build():
    built = []
    g = Group(64, (OURS,), lambda: built.append(1) or FakePeer(64))
    rows = _sweep(deadline=time.monotonic() - 1).group(g)
    assert built == [] and {(r.status, r.note) for r in rows} == {("skipped", "not started: past --deadline-s")}


def test_deadline_between_cells():
    """A deadline that passes mid-group skips the cells after it; what ran before is kept."""
    sweep = _sweep(batches=(8,))
    real = sweep.timer

    def timer(peer, fn, mode):
        sweep.deadline = time.monotonic() - 1  # the deadline passes during the first cell
        return real(peer, fn, mode)

    sweep.timer = timer
    rows = sweep.group(_group(FakePeer(64)))
    assert [r.status for r in rows] == ["ok", "skipped", "skipped", "skipped"]


def test_a_lost_cuda_context_stops_the_sweep(monkeypatch):
    def lost(device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    behaviour = {(OURS, "sample"): RuntimeError("illegal address")}
    sweep = _sweep(batches=(8,))
    peer = FakePeer(64, behaviour)
    monkeypatch.setattr(harness, "synchronize", lost)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        sweep.cell(peer, OURS, "sample", 8, "eager", {})


def test_calls_of_several_steps_are_divided():
    fixed = Timing(80.0, 40.0, 120.0, 10, 3, (40.0, 80.0, 120.0))
    rows = _sweep(timer=lambda peer, fn, mode: fixed, batches=(8,)).group(_group(FakePeer(64, steps=4)))
    assert {(r.median_us, r.min_us, r.max_us, r.iters, r.repeats) for r in rows} == {(20.0, 10.0, 30.0, 10, 3)}


def test_probed_timer_skips_slow_calls_and_sizes_fast_ones():
    peer = FakePeer(64)
    with pytest.raises(Skip, match="over --max-call-s"):
        Probed(max_call_s=0.001)(peer, lambda: time.sleep(0.01), "eager")
    t = Probed(warmup=1, repeats=2, target_ms=1.0)(peer, lambda: None, "eager")
    assert t.repeats == 2 and t.iters >= 1 and t.median_us >= 0


def test_fill_gives_up_when_it_would_take_too_long():
    done = []
    fill(3 * 2**20, lambda lo, hi: done.append((lo, hi)), max_s=1e3, what="a fill")
    assert done == chunks(3 * 2**20) == [(0, 2**20), (2**20, 2**21), (2**21, 3 * 2**20)]
    with pytest.raises(Skip, match="a slow fill would take about"):
        fill(3 * 2**20, lambda lo, hi: time.sleep(0.01), max_s=0.001, what="a slow fill")


def test_small_helpers():
    assert first_line(RuntimeError("one\ntwo")) == "one" and first_line(KeyError()) == "KeyError"
    assert len(first_line(RuntimeError("x" * 500))) == 200
    assert is_oom(MemoryError()) and not is_oom(ValueError("no"))
    row = Row("a", "step", 8, 2, "eager", median_us=1.23456, ratios={"x": 2.00049, "y": None})
    assert row.csv() == {
        **{"impl": "a", "op": "step", "capacity": 8, "batch": 2, "mode": "eager", "median_us": 1.235},
        **{"min_us": None, "max_us": None, "iters": None, "repeats": None, "status": "ok", "note": ""},
        **{"x": 2.0, "y": None},
    }


def test_time_sync_and_time_steps():
    synced = []
    t = time_sync(lambda: 7, synced.append, warmup=2, iters=3, repeats=4)
    assert synced == [7] * 5 and (t.iters, t.repeats, len(t.samples_us)) == (3, 4, 4)
    calls = []
    gpu, wall = time_steps(lambda: calls.append(1), steps=5, repeats=2, device=CPU)
    assert len(calls) == 10 and gpu > 0 and wall > 0


def test_result_files(tmp_path):
    env = {"slug": "cpu", "stamp": "20260101-000000"}
    files = ResultFiles(tmp_path / "r", env, ["a", "b"], prefix="peers")
    files.append([{"a": 1, "b": None}])
    files.rewrite([{"a": 2, "b": 3}, {"a": 4}])
    assert files.csv_path.read_text().splitlines() == ["a,b", "2,3", "4,"]
    assert files.path(".png") == tmp_path / "r" / "peers-cpu-20260101-000000.png"
    md_only = ResultFiles(tmp_path / "m", env, None, prefix="peer-exactness")
    md_only.write_markdown("# x\n")
    assert md_only.csv_path is None and [p.name for p in (tmp_path / "m").iterdir()] == [md_only.md_path.name]
