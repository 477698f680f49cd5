"""``gper bench replay``: time the replay buffer's calls against the O(N) cumsum baseline, over a sweep of sizes.

For every capacity the buffer is filled with random transitions and random priorities, then
``sample`` (gather of every field + IS weights), ``update_priorities``, ``add`` and ``step``
(sample then update) are timed at every batch size, eagerly and as one captured CUDA graph. The
baselines (:mod:`gper.bench.peers.baselines`) are timed the same way on the same workload, so
every row carries its speedup over the cumsum baseline. Each capacity's buffers are freed before
the next, and running out of memory at one size is recorded and the sweep goes on
(:mod:`gper.bench.harness`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from gper.bench.harness import Calibrated, Group, Row, Sweep, TimedSweep, add_capacity, make_log
from gper.bench.peers import baselines, canonical_name
from gper.bench.peers import gper as gper_peer
from gper.bench.peers.base import Setting
from gper.bench.report import DEFAULT_OUT, ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.workload import format_capacity

GPER, CUMSUM, MULTINOMIAL = "gper", baselines.CUMSUM, baselines.MULTINOMIAL
#: ``--impls`` name -> implementation id in the rows (gper's gets its back end: ``gper-triton``)
IMPLS = {"gper": GPER, "cumsum": CUMSUM, "multinomial": MULTINOMIAL}
OPS = ("sample", "update", "step", "add")
MODES = ("eager", "graph")
SPEEDUP = "speedup_vs_cumsum"
COLUMNS = ("impl", "op", "capacity", "batch", "mode", "median_us", SPEEDUP)
COLUMNS += ("min_us", "max_us", "iters", "repeats", "status", "note")

_log = make_log("gper bench")


@dataclass
class BenchConfig(TimedSweep):
    """What to sweep and how to time it (``gper bench replay --help`` documents each field)."""

    impls: list[str] = field(default_factory=lambda: list(IMPLS))
    ops: list[str] = field(default_factory=lambda: list(OPS))
    out: Path | None = DEFAULT_OUT
    seed: int = 0
    command: str = ""


@dataclass
class BenchResult:
    rows: list[Row]
    env: dict[str, str]
    csv_path: Path | None
    md_path: Path | None


def row_key(r: Row) -> tuple:
    """Rows by size, op and mode; gper first, then the baselines."""
    impl = (0, r.impl) if r.impl.startswith(GPER) else (1 + (CUMSUM, MULTINOMIAL).index(r.impl), r.impl)
    return (r.capacity, r.batch, OPS.index(r.op), MODES.index(r.mode), impl)


def add_speedups(rows: list[Row]) -> None:
    """Set each row's ``speedup_vs_cumsum``: the cumsum median for the same op, size and mode over its own."""
    base = {(r.op, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.impl == CUMSUM and r.median_us}
    for r in rows:
        b = base.get((r.op, r.capacity, r.batch, r.mode))
        if b and r.median_us:
            r.ratios[SPEEDUP] = b / r.median_us


def run(cfg: BenchConfig) -> BenchResult:
    """Run the sweep, print the table, write the result files (unless ``cfg.out`` is None)."""
    if cfg.device.type == "cuda":
        torch.cuda.set_device(cfg.device)
    # resolve the back end once (and fail now, not at the first size, if it cannot run here)
    ours = gper_peer.impl_name(cfg.device, cfg.backend)
    env = environment(cfg.device)
    files = ResultFiles(cfg.out, env, COLUMNS) if cfg.out is not None else None
    impls = [canonical_name(i) for i in cfg.impls]
    others = tuple(IMPLS[i] for i in impls if i != "gper")
    modes = ("eager", "graph") if cfg.graph else ("eager",)
    setting = Setting(cfg.device, cfg.seed, tuple(cfg.batches), backend=cfg.backend, modes=modes)
    timer = Calibrated(warmup=cfg.warmup, iters=cfg.iters, repeats=cfg.repeats, target_ms=cfg.target_ms)
    sweep = Sweep(cfg.device, timer, cfg.ops, cfg.batches, refusals=True, log=_log)
    rows: list[Row] = []
    _log(header_line(env))
    for cap in cfg.capacities:
        skipped = [b for b in cfg.batches if b > cap]
        _log(
            f"capacity {format_capacity(cap)} ({cap:,})"
            + (f"; skipping batches {skipped} > capacity" if skipped else "")
        )
        cap_rows: list[Row] = []
        if "gper" in impls:
            build = partial(gper_peer.build, (ours,), cap, setting)
            cap_rows += sweep.group(Group(cap, (ours,), build, unbuilt_modes=lambda impl: modes))
        if others:
            build = partial(baselines.build, others, cap, setting)
            group = Group(cap, others, build, ops_of=baselines.ops_of, unbuilt_modes=lambda impl: modes)
            cap_rows += sweep.group(group)
        add_speedups(cap_rows)
        add_capacity(rows, cap_rows, row_key, files)
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


def _speedup(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _cells(rows: list[Row]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["impl", "op", "capacity", "batch", "mode", "median_us", "vs_cumsum"]
    cells = [
        [
            r.impl,
            r.op,
            format_capacity(r.capacity),
            str(r.batch),
            r.mode,
            f"{r.median_us:.1f}" if r.median_us is not None else r.status,
            _speedup(r.ratios.get(SPEEDUP)),
        ]
        for r in rows
    ]
    return headers, cells, [False, False, True, True, False, True, True]


def _summary(rows: list[Row], op: str) -> tuple[list[str], list[list[str]], list[bool]] | None:
    """One line per (capacity, batch): ``op``'s median for gper and the cumsum baseline, eager and graphed."""
    by = {
        (r.impl.split("-")[0] if r.impl.startswith(GPER) else r.impl, r.capacity, r.batch, r.mode): r
        for r in rows
        if r.op == op
    }
    keys = sorted({(r.capacity, r.batch) for r in rows if r.op == op})
    if not keys:
        return None
    modes = sorted({r.mode for r in rows}, key=MODES.index)
    headers = ["capacity", "batch"] + [f"{i} {m} us" for i in (GPER, CUMSUM) for m in modes]
    headers += [f"speedup {m}" for m in modes]
    cells = []
    for cap, b in keys:
        line = [format_capacity(cap), str(b)]
        for impl in (GPER, CUMSUM):
            for m in modes:
                r = by.get((impl, cap, b, m))
                line.append("" if r is None else f"{r.median_us:.1f}" if r.median_us is not None else r.status)
        for m in modes:
            r = by.get((GPER, cap, b, m))
            line.append(_speedup(r.ratios.get(SPEEDUP)) if r is not None else "")
        cells.append(line)
    return headers, cells, [False] + [True] * (len(headers) - 1)


def _report(cfg: BenchConfig, env: dict[str, str], rows: list[Row]) -> dict:
    iters = f"{cfg.iters} calls" if cfg.iters else f"about {cfg.target_ms:g} ms of calls"
    clock = "CUDA events" if cfg.device.type == "cuda" else "perf_counter"
    settings = (
        f"median of {cfg.repeats} repeats of {iters} ({clock}), after {cfg.warmup} warm-up calls; "
        "eager = plain Python calls, graph = replays of one captured CUDA graph; "
        "vs_cumsum = cumsum median / this median (same op, size, mode). "
        "Spec obs (51,) f32, action () i64, reward () f32, next_obs (51,) f32, done () bool; alpha 0.6, beta 0.4."
    )
    if cfg.device.type != "cuda":
        settings += " Ran on the CPU, not a GPU: small sizes, no CUDA graphs."
    table = _cells(rows)
    op = "step" if "step" in cfg.ops else cfg.ops[0]
    summary = _summary(rows, op)
    title = f"{op}{' (sample + update_priorities)' if op == 'step' else ''}: gper vs the O(N) cumsum baseline"
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
