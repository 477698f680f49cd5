"""``gper bench``: time the replay buffer's calls against the seeds' O(N) design, over a sweep of sizes.

For every capacity the buffer is filled with random transitions and random priorities, then
``sample`` (gather of every field + IS weights), ``update_priorities``, ``add`` and ``step``
(sample then update) are timed at every batch size, eagerly and as one captured CUDA graph. The
baselines (:mod:`gper.bench.workload`) are timed the same way on the same workload, so every row
carries its speedup over the seeds' design. Each capacity's buffers are freed before the next,
and running out of memory at one size is recorded and the sweep goes on.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from gper import PrioritizedReplayBuffer
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import synchronize, time_fn, time_graph
from gper.bench.workload import (
    GPER,
    MULTINOMIAL,
    OPS,
    SEEDS,
    SPEC,
    GperWorkload,
    SeedsBaseline,
    format_capacity,
    ops_of,
    random_td,
    random_transitions,
)

IMPLS = {"gper": GPER, "seeds": SEEDS, "multinomial": MULTINOMIAL}
MODES = ("eager", "graph")
COLUMNS = ("impl", "op", "capacity", "batch", "mode", "median_us", "speedup_vs_seeds")
COLUMNS += ("min_us", "max_us", "iters", "repeats", "status", "note")


@dataclass
class Row:
    """One timing (or why there is none: ``status`` "n/a", "oom" or "error", with a ``note``)."""

    impl: str
    op: str
    capacity: int
    batch: int
    mode: str
    median_us: float | None = None
    speedup_vs_seeds: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    iters: int | None = None
    repeats: int | None = None
    status: str = "ok"
    note: str = ""

    def key(self) -> tuple:
        return (self.capacity, self.batch, OPS.index(self.op), MODES.index(self.mode), self.impl)


@dataclass
class BenchConfig:
    """What to sweep and how to time it (``gper bench --help`` documents each field)."""

    capacities: list[int]
    batches: list[int]
    device: torch.device
    backend: str = "auto"
    graph: bool = True
    repeats: int = 5
    iters: int | None = None
    warmup: int = 5
    target_ms: float = 20.0
    impls: list[str] = field(default_factory=lambda: list(IMPLS))
    ops: list[str] = field(default_factory=lambda: list(OPS))
    out: Path | None = Path("benchmarks/results")
    seed: int = 0
    command: str = ""


@dataclass
class BenchResult:
    rows: list[Row]
    env: dict[str, str]
    csv_path: Path | None
    md_path: Path | None


def _log(msg: str) -> None:
    print(f"[gper bench] {msg}", file=sys.stderr, flush=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _measure(cfg: BenchConfig, wl, impl: str, op: str, b: int, mode: str, td, new, failed: dict) -> Row:
    row = Row(impl, op, wl.capacity, b, mode)
    # an earlier call showed that this impl cannot run at this capacity, or cannot be captured
    known = failed.get(impl) or failed.get((impl, mode))
    if known:
        row.status, row.note = "n/a", known
        return row
    timer = time_fn if mode == "eager" else time_graph
    kw = {"device": cfg.device} if mode == "eager" else {}
    try:
        t = timer(
            wl.op(impl, op, b, td, new),
            warmup=cfg.warmup,
            iters=cfg.iters,
            repeats=cfg.repeats,
            target_ms=cfg.target_ms,
            **kw,
        )
    except torch.cuda.OutOfMemoryError as e:
        row.status, row.note = "oom", _first_line(e)
    except Exception as e:  # a baseline that torch refuses (multinomial > 2^24, not capturable), or a bug
        ours = impl.startswith(GPER)
        row.status, row.note = ("error" if ours else "n/a"), f"{type(e).__name__}: {_first_line(e)}"
        if not ours:
            failed[impl if mode == "eager" else (impl, mode)] = row.note
        _log(f"{'ERROR' if ours else 'n/a'}: {impl} {op} capacity={wl.capacity} batch={b} {mode}: {row.note}")
    else:
        row.median_us, row.min_us, row.max_us = t.median_us, t.min_us, t.max_us
        row.iters, row.repeats = t.iters, t.repeats
        return row
    _free(cfg.device)
    try:
        synchronize(cfg.device)
    except RuntimeError:
        # a sticky CUDA error (illegal address...) poisons every later call: stop with what we have
        _log(f"the CUDA context is lost after {impl} {op} capacity={wl.capacity} batch={b} {mode}; stopping")
        raise
    return row


def _run_group(cfg: BenchConfig, cap: int, batches: list[int], impls: list[str], build: Callable) -> list[Row]:
    """Build one workload at capacity ``cap`` and time ``impls`` on it at every batch size."""
    modes = ["eager", "graph"] if cfg.graph else ["eager"]
    plan = [(b, i, op, m) for b in batches for i in impls for op in cfg.ops if op in ops_of(i) for m in modes]
    t0 = time.perf_counter()
    wl, oom = None, ""
    try:
        wl = build()
        synchronize(cfg.device)
    except torch.cuda.OutOfMemoryError as e:
        oom = _first_line(e)
    if wl is None:  # freed only here, once the exception no longer holds the half-built workload
        _free(cfg.device)
        _log(f"  {', '.join(impls)}: out of memory at capacity {cap}; recorded as oom")
        return [Row(i, op, cap, b, m, status="oom", note=oom) for b, i, op, m in plan]
    _log(f"  {', '.join(impls)}: filled {cap:,} slots in {time.perf_counter() - t0:.1f} s")
    rows: list[Row] = []
    failed: dict[str, str] = {}
    try:
        for n, b in enumerate(batches):
            t0 = time.perf_counter()
            td = new = None
            try:
                if n:  # adds of the previous batch size replaced many priorities by the max
                    wl.randomize_priorities()
                td = random_td(b, cfg.device, wl.gen)
                new = random_transitions(b, cfg.device, wl.gen)
            except torch.cuda.OutOfMemoryError as e:
                oom = _first_line(e)
            if new is None:
                _free(cfg.device)
                rows += [Row(i, op, cap, b, m, status="oom", note=oom) for bb, i, op, m in plan if bb == b]
                continue
            for impl in impls:
                for op in (op for op in cfg.ops if op in ops_of(impl)):
                    for mode in modes:
                        rows.append(_measure(cfg, wl, impl, op, b, mode, td, new, failed))
            _log(f"    batch {b}: {len(rows)} timings so far, {time.perf_counter() - t0:.1f} s")
    finally:
        del wl
        _free(cfg.device)
    return rows


def add_speedups(rows: list[Row]) -> None:
    """Set each row's ``speedup_vs_seeds``: the seeds' median for the same op, size and mode over its own."""
    seeds = {(r.op, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.impl == SEEDS and r.median_us}
    for r in rows:
        base = seeds.get((r.op, r.capacity, r.batch, r.mode))
        if base and r.median_us:
            r.speedup_vs_seeds = base / r.median_us


def run(cfg: BenchConfig) -> BenchResult:
    """Run the sweep, print the table, write the result files (unless ``cfg.out`` is None)."""
    if cfg.device.type == "cuda":
        torch.cuda.set_device(cfg.device)
    # resolve the back end once (and fail now, not at the first size, if it cannot run here)
    probe = PrioritizedReplayBuffer(1, SPEC, device=cfg.device, backend=cfg.backend, cpu_fallback=False)
    gper_impl = f"{GPER}-{probe.backend}"
    del probe
    env = environment(cfg.device)
    files = ResultFiles(cfg.out, env, COLUMNS) if cfg.out is not None else None
    baselines = [IMPLS[i] for i in cfg.impls if i != "gper"]
    rows: list[Row] = []
    _log(header_line(env))
    for cap in cfg.capacities:
        batches = [b for b in cfg.batches if b <= cap]
        skipped = [b for b in cfg.batches if b > cap]
        _log(
            f"capacity {format_capacity(cap)} ({cap:,})"
            + (f"; skipping batches {skipped} > capacity" if skipped else "")
        )
        cap_rows: list[Row] = []
        if "gper" in cfg.impls:
            build = partial(GperWorkload, cap, cfg.device, cfg.backend, cfg.seed)
            cap_rows += _run_group(cfg, cap, batches, [gper_impl], build)
        if baselines:
            cap_rows += _run_group(cfg, cap, batches, baselines, partial(SeedsBaseline, cap, cfg.device, cfg.seed))
        add_speedups(cap_rows)
        cap_rows.sort(key=Row.key)
        rows += cap_rows
        if files:
            files.append([_csv_row(r) for r in cap_rows])
    report = _report(cfg, env, rows)
    print(report["text_header"])
    print_table(*report["table"])
    if report["summary"]:
        print()
        print_table(*report["summary"], title=report["summary_title"])
    if files:
        files.write_markdown(report["markdown"])
        _log(f"wrote {files.csv_path} and {files.md_path}")
    return BenchResult(rows, env, files.csv_path if files else None, files.md_path if files else None)


def _csv_row(r: Row) -> dict[str, object]:
    d = asdict(r)
    for k in ("median_us", "min_us", "max_us"):
        d[k] = None if d[k] is None else round(d[k], 3)
    d["speedup_vs_seeds"] = None if r.speedup_vs_seeds is None else round(r.speedup_vs_seeds, 3)
    return d


def _speedup(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _cells(rows: list[Row]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["impl", "op", "capacity", "batch", "mode", "median_us", "vs_seeds"]
    cells = [
        [
            r.impl,
            r.op,
            format_capacity(r.capacity),
            str(r.batch),
            r.mode,
            f"{r.median_us:.1f}" if r.median_us is not None else r.status,
            _speedup(r.speedup_vs_seeds),
        ]
        for r in rows
    ]
    return headers, cells, [False, False, True, True, False, True, True]


def _summary(rows: list[Row], op: str) -> tuple[list[str], list[list[str]], list[bool]] | None:
    """One line per (capacity, batch): ``op``'s median for gper and the seeds, eager and graphed."""
    by = {
        (r.impl.split("-")[0] if r.impl.startswith(GPER) else r.impl, r.capacity, r.batch, r.mode): r
        for r in rows
        if r.op == op
    }
    keys = sorted({(r.capacity, r.batch) for r in rows if r.op == op})
    if not keys:
        return None
    modes = sorted({r.mode for r in rows}, key=MODES.index)
    headers = ["capacity", "batch"] + [f"{i} {m} us" for i in ("gper", "seeds") for m in modes]
    headers += [f"speedup {m}" for m in modes]
    cells = []
    for cap, b in keys:
        line = [format_capacity(cap), str(b)]
        for impl in (GPER, SEEDS):
            for m in modes:
                r = by.get((impl, cap, b, m))
                line.append("" if r is None else f"{r.median_us:.1f}" if r.median_us is not None else r.status)
        for m in modes:
            r = by.get((GPER, cap, b, m))
            line.append(_speedup(r.speedup_vs_seeds) if r is not None else "")
        cells.append(line)
    return headers, cells, [False] + [True] * (len(headers) - 1)


def _report(cfg: BenchConfig, env: dict[str, str], rows: list[Row]) -> dict:
    iters = f"{cfg.iters} calls" if cfg.iters else f"about {cfg.target_ms:g} ms of calls"
    clock = "CUDA events" if cfg.device.type == "cuda" else "perf_counter"
    settings = (
        f"median of {cfg.repeats} repeats of {iters} ({clock}), after {cfg.warmup} warm-up calls; "
        "eager = plain Python calls, graph = replays of one captured CUDA graph; "
        "vs_seeds = seeds-cumsum median / this median (same op, size, mode). "
        "Spec obs (51,) f32, action () i64, reward () f32, next_obs (51,) f32, done () bool; alpha 0.6, beta 0.4."
    )
    if cfg.device.type != "cuda":
        settings += " Ran on the CPU, not a GPU: small sizes, no CUDA graphs."
    table = _cells(rows)
    op = "step" if "step" in cfg.ops else cfg.ops[0]
    summary = _summary(rows, op)
    title = f"{op}{' (sample + update_priorities)' if op == 'step' else ''}: gper vs the seeds' O(N) design"
    command = cfg.command or " ".join(sys.argv)
    md = [f"# {header_line(env)}", "", settings, "", f"Command: `{command}`", "", format_markdown(*table)]
    if summary:
        md += ["", f"## {title}", "", format_markdown(*summary)]
    return {
        "text_header": header_line(env) + "\n" + settings,
        "table": table,
        "summary": summary,
        "summary_title": title,
        "markdown": "\n".join(md) + "\n",
    }
