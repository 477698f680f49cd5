"""The sweep engine every gper benchmark runs on: result rows, the cell runner, the group runner.

A *group* is one peer's buffer at one capacity (:class:`gper.bench.peers.base.Peer`), built
and filled once; a *cell* is one implementation's op at one batch size, called one way
(``eager``, ``graph``, ``jit``...), timed on it. :class:`Sweep` runs groups and cells and turns
whatever goes wrong into a row instead of an abort:

* a build, a batch's preparation or a cell that runs out of memory: ``oom``;
* one left out on purpose (:class:`~gper.bench.peers.base.Skip`: too slow, past the deadline):
  ``skipped``;
* one that raises anything else: ``error``, or, for a baseline where the sweep allows refusals,
  ``n/a``, remembered for the rest of the group (``torch.multinomial`` above 2^24, a call that
  cannot be captured);
* a lost CUDA context (a sticky error after a failure) stops the sweep: every later call would fail.

How a cell is timed is the sweep's choice: :class:`Calibrated` (``gper bench replay``) or
:class:`Probed` (``gper bench peers``).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from gper.bench.peers.base import Peer, Skip
from gper.bench.timing import Timing, capture_graph, synchronize, time_fn, time_graph
from gper.bench.workload import FILL_CHUNK, format_capacity

#: implementations whose failures are errors of this project (the exit status says so)
OURS = "gper"


@dataclass
class TimedSweep:
    """What every timed sweep of buffer calls is given: the sizes, the device and back end, and how
    to time each call (graphs or not, repeats, calls per repeat, warm-up calls, ms per repeat)."""

    capacities: list[int]
    batches: list[int]
    device: torch.device
    backend: str = "auto"
    graph: bool = True
    repeats: int = 5
    iters: int | None = None
    warmup: int = 5
    target_ms: float = 20.0


@dataclass
class Row:
    """One timing, or why there is none (``status``: ``skipped``, ``oom``, ``n/a`` or ``error``, with a ``note``).

    ``ratios`` holds the sweep's comparison columns (``speedup_vs_cumsum``; ``x_gper_eager``...).
    """

    impl: str
    op: str
    capacity: int
    batch: int
    mode: str
    median_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    iters: int | None = None
    repeats: int | None = None
    status: str = "ok"
    note: str = ""
    ratios: dict[str, float | None] = field(default_factory=dict)

    def record(self, t: Timing) -> None:
        self.median_us, self.min_us, self.max_us = t.median_us, t.min_us, t.max_us
        self.iters, self.repeats = t.iters, t.repeats

    def csv(self) -> dict[str, object]:
        """The row as CSV cells: times and ratios rounded to 3 decimals, the ratios as columns."""
        d = {k: v for k, v in asdict(self).items() if k != "ratios"}
        for k in ("median_us", "min_us", "max_us"):
            d[k] = None if d[k] is None else round(d[k], 3)
        d.update({k: None if v is None else round(v, 3) for k, v in self.ratios.items()})
        return d


# ----------------------------------------------------------------------------------------------
# small helpers


def add_capacity(rows: list[Row], cap_rows: list[Row], key: Callable[[Row], tuple], files: object) -> None:
    """One capacity's rows, sorted by ``key``, onto a sweep's ``rows`` and (with ``files``, a
    :class:`~gper.bench.report.ResultFiles`) into its CSV at once, so a sweep cut short keeps them."""
    cap_rows.sort(key=key)
    rows += cap_rows
    if files:
        files.append([r.csv() for r in cap_rows])


def make_log(prefix: str) -> Callable[[str], None]:
    """A progress logger to stderr: ``[prefix] message``."""

    def log(msg: str) -> None:
        print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)

    return log


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), at most 200 characters."""
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def is_oom(e: BaseException) -> bool:
    """Out of memory: torch's OutOfMemoryError, numpy's MemoryError, or JAX's RESOURCE_EXHAUSTED."""
    return isinstance(e, torch.OutOfMemoryError | MemoryError) or "RESOURCE_EXHAUSTED" in str(e)


def failure(e: BaseException) -> tuple[str, str]:
    """(status, note) of a row whose work raised ``e``."""
    return ("oom" if is_oom(e) else "error"), f"{type(e).__name__}: {first_line(e)}"


def free(device: torch.device) -> None:
    """Collect garbage and give the CUDA cache back, so the next buffer has the whole device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def chunks(n: int, size: int = FILL_CHUNK) -> list[tuple[int, int]]:
    """``[(0, size), (size, 2 size), ..., (., n)]``: the slices a fill of ``n`` slots is made in."""
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def fill(n: int, add: Callable[[int, int], None], max_s: float, what: str) -> None:
    """Call ``add(lo, hi)`` over :func:`chunks` of ``n`` slots; give up early if the whole would exceed ``max_s``.

    ``max_s`` is ``--max-fill-s``, or what is left before ``--deadline-s`` if that is less.
    """
    parts = chunks(n)
    t0 = time.perf_counter()
    for i, (lo, hi) in enumerate(parts):
        add(lo, hi)
        spent = time.perf_counter() - t0
        projected = spent / (i + 1) * len(parts)
        if projected > max_s:
            raise Skip(f"{what} would take about {projected:.0f} s, over the {max_s:.0f} s left for it")


def per_step(t: Timing, k: int) -> Timing:
    """``t`` of calls that each make ``k`` steps, as the time of one step."""
    if k == 1:
        return t
    return dataclasses.replace(
        t,
        median_us=t.median_us / k,
        min_us=t.min_us / k,
        max_us=t.max_us / k,
        samples_us=tuple(x / k for x in t.samples_us),
    )


# ----------------------------------------------------------------------------------------------
# how a cell is timed


@dataclass(frozen=True)
class Calibrated:
    """:func:`~gper.bench.timing.time_fn` or :func:`~gper.bench.timing.time_graph`: ``iters`` calls per
    repeat (None: enough for ``target_ms``), median of ``repeats``, after ``warmup`` calls."""

    warmup: int = 5
    iters: int | None = None
    repeats: int = 5
    target_ms: float = 20.0

    def __call__(self, peer: Peer, fn: Callable[[], object], mode: str) -> Timing:
        kw = dict(warmup=self.warmup, iters=self.iters, repeats=self.repeats, target_ms=self.target_ms)
        if mode == "graph":
            return time_graph(fn, **kw)
        return time_fn(fn, device=peer.device, **kw)


@dataclass(frozen=True)
class Probed:
    """A probe call first decides how many calls a repeat needs, or skips the cell; then the peer's own timer.

    The probe keeps slow peers from costing minutes per cell: a repeat is ``target_ms`` of calls
    (at least one), and the repeats stop at ``max_cell_s``; a call slower than ``max_call_s``
    is not timed at all. ``graph`` captures the call once and probes and times its replays.
    """

    warmup: int = 3
    repeats: int = 7
    target_ms: float = 20.0
    max_call_s: float = 2.0
    max_cell_s: float = 4.0

    def __call__(self, peer: Peer, fn: Callable[[], object], mode: str) -> Timing:
        if mode == "graph":
            graph = capture_graph(fn, warmup=self.warmup)
            try:
                return self._probed(peer, graph.replay)
            finally:
                graph.reset()
        return self._probed(peer, fn)

    def _probed(self, peer: Peer, fn: Callable[[], object]) -> Timing:
        peer.sync(fn())  # the first call compiles, allocates, fills caches
        t0 = time.perf_counter()
        peer.sync(fn())
        probe = time.perf_counter() - t0
        if probe > self.max_call_s:
            raise Skip(f"one call took {probe:.2f} s (over --max-call-s {self.max_call_s:g})")
        iters = int(min(max(self.target_ms / 1e3 / max(probe, 1e-7), 1), 10_000))
        repeats = max(1, min(self.repeats, int(self.max_cell_s / max(probe * iters, 1e-9))))
        warmup = max(1, min(self.warmup, int(0.5 / max(probe, 1e-9))))
        return peer.time(fn, warmup, iters, repeats)


# ----------------------------------------------------------------------------------------------
# the sweep


@dataclass
class Group:
    """One peer at one capacity: how to build it and what it will be asked for.

    Attributes:
        capacity: slots, filled to capacity by ``build``.
        impls: the implementation ids it serves (as result rows name them).
        build: makes the filled peer (it may raise :class:`Skip`, or run out of memory).
        ops_of: the ops timed for an implementation (the sweep keeps those it asked for).
        ops_at: the ops timed for an implementation at a batch size (default: all of ``ops_of``); the
            built peer's own :meth:`~gper.bench.peers.base.Peer.ops_at` decides for the rows it times.
        unbuilt_modes: the modes a cell is filed under when the peer (or its batch) never got that far.
    """

    capacity: int
    impls: tuple[str, ...]
    build: Callable[[], Peer]
    ops_of: Callable[[str], Sequence[str]] = Peer.ops_of
    ops_at: Callable[[str, int], Sequence[str]] | None = None
    unbuilt_modes: Callable[[str], Sequence[str]] = lambda impl: ("eager",)


@dataclass
class Sweep:
    """Runs groups and their cells, recording what went wrong instead of stopping (see the module docstring).

    Attributes:
        device: where the peers' results live (freed and synchronised after every failure).
        timer: times one cell: ``timer(peer, fn, mode) -> Timing`` (:class:`Calibrated`, :class:`Probed`).
        ops: the ops to time, in order.
        batches: the batch sizes to time (those above a group's capacity are left out there).
        deadline: ``time.monotonic()`` after which no build or cell starts (the rest is skipped).
        refusals: a baseline's failure is a refusal (``n/a``, remembered for the rest of its group),
            not an ``error``.
        log: progress lines.
    """

    device: torch.device
    timer: Callable[[Peer, Callable[[], object], str], Timing]
    ops: Sequence[str]
    batches: Sequence[int]
    deadline: float | None = None
    refusals: bool = False
    log: Callable[[str], None] = make_log("gper bench")

    def left_s(self) -> float:
        """Seconds left before the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def check_deadline(self) -> None:
        if self.left_s() <= 0:
            raise Skip("not started: past --deadline-s")

    def group(self, g: Group) -> list[Row]:
        """Build ``g``'s peer and time every op at every batch size on it; its memory is freed before returning."""
        cap = g.capacity
        ops_at = g.ops_at or (lambda impl, b: g.ops_of(impl))
        plan = [(b, i, op) for b in self.batches if b <= cap for i in g.impls for op in self.ops if op in ops_at(i, b)]
        batches = list(dict.fromkeys(b for b, _, _ in plan))  # those with something to time
        t0 = time.perf_counter()
        peer, status, why = None, "", ""
        try:
            self.check_deadline()
            peer = g.build()
            synchronize(self.device)
        except Skip as e:
            status, why = "skipped", str(e)
        except Exception as e:
            status, why = failure(e)
        if peer is None:  # freed only here, once the exception no longer holds the half-built peer
            free(self.device)
            self.log(f"  {', '.join(g.impls)} at {format_capacity(cap)}: {status}: {why}")
            return [Row(i, op, cap, b, m, status=status, note=why) for b, i, op in plan for m in g.unbuilt_modes(i)]
        self.log(f"  {', '.join(g.impls)}: filled {cap:,} slots in {time.perf_counter() - t0:.1f} s")
        rows: list[Row] = []
        failed: dict[object, str] = {}
        try:
            for n, b in enumerate(batches):
                t0 = time.perf_counter()
                try:
                    peer.prepare(b, first=n == 0)
                except Exception as e:
                    status, note = failure(e)
                    free(self.device)
                    rows += [
                        Row(i, op, cap, b, m, status=status, note=note)
                        for bb, i, op in plan
                        if bb == b
                        for m in g.unbuilt_modes(i)
                    ]
                    continue
                for impl in peer.impls:
                    for op in (op for op in self.ops if op in peer.ops_at(impl, b)):
                        for mode in peer.modes_of(op):
                            rows.append(self.cell(peer, impl, op, b, mode, failed))
                self.log(f"    batch {b}: {len(rows)} timings so far, {time.perf_counter() - t0:.1f} s")
        finally:
            peer.close()
            del peer
            free(self.device)
        return rows

    def cell(self, peer: Peer, impl: str, op: str, b: int, mode: str, failed: dict) -> Row:
        """Time one cell; ``failed`` remembers the group's refusals (impl, or (impl, mode) for a graph)."""
        row = Row(impl, op, peer.capacity, b, mode)
        # an earlier call showed that this impl cannot run at this capacity, or cannot be captured
        known = failed.get(impl) or failed.get((impl, mode))
        if known:
            row.status, row.note = "n/a", known
            return row
        try:
            self.check_deadline()
            t = self.timer(peer, peer.op(impl, op, b, mode), mode)
        except Skip as e:
            row.status, row.note = "skipped", str(e)
        except Exception as e:  # a baseline that torch refuses (multinomial > 2^24, not capturable), or a bug
            row.status, row.note = failure(e)
            if self.refusals and row.status == "error" and not impl.startswith(OURS):
                row.status = "n/a"
                failed[impl if mode == "eager" else (impl, mode)] = row.note
        else:
            row.record(per_step(t, peer.steps_per_call(mode)))
            return row
        self.log(f"    {row.status}: {impl} {op} {format_capacity(peer.capacity)} B={b} {mode}: {row.note}")
        free(self.device)
        try:
            synchronize(self.device)
        except RuntimeError:
            # a sticky CUDA error (illegal address...) poisons every later call: stop with what we have
            self.log(f"the CUDA context is lost after {impl} {op} capacity={peer.capacity} batch={b} {mode}; stopping")
            raise
        return row
