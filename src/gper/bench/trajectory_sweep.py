"""``gper bench trajectory``: time the trajectory buffer's calls beside the flat buffer's, over a sweep of capacities.

For every capacity, :class:`gper.TrajectoryReplayBuffer` is filled with ``num_envs`` streams of
random episodes (:mod:`gper.bench.peers.gper_traj`) and :class:`gper.PrioritizedReplayBuffer`
with the reference transitions (:mod:`gper.bench.peers.gper`), both given random priorities,
and timed on the same batch sizes, eagerly and as one captured CUDA graph:

| trajectory op | call | beside the flat buffer's |
| --- | --- | --- |
| ``sample-n1`` | ``rb.sample(B)`` | ``sample`` |
| ``sample-n3`` | ``rb.sample(B, n_step=3, gamma=0.99)`` | ``sample`` (1-step) |
| ``step-n1`` / ``step-n3`` | that sample, then ``update_priorities`` | ``step`` |
| ``add-envs`` | one step of every stream (batch ``num_envs``) | ``add`` of ``num_envs`` transitions |
| ``sequences`` | ``rb.sample_sequences(seq_batch, seq_length, burn_in)`` | (none) |

Every trajectory row carries ``x_flat``: its median over the flat row beside it (same capacity,
batch and mode). The report gives the targets at 2^24 slots and B = 16384 in a graph, and each
op's time against capacity. Each capacity's buffers are freed before the next; running out of
memory at one size is recorded and the sweep goes on (:mod:`gper.bench.harness`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from gper.bench.harness import Calibrated, Group, Row, Sweep, TimedSweep, add_capacity, make_log
from gper.bench.peers import gper as gper_peer
from gper.bench.peers import gper_traj
from gper.bench.peers.base import TRAJ_OPS, Setting
from gper.bench.peers.base import trajectory_ops_at as _ops_at
from gper.bench.report import DEFAULT_OUT, ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.workload import TrajectoryWorkload, format_capacity

#: trajectory op -> the flat buffer's op it is compared with
FLAT_OF = {"sample-n1": "sample", "sample-n3": "sample", "step-n1": "step", "step-n3": "step", "add-envs": "add"}
FLAT_OPS = ("sample", "step", "add")
MODES = ("eager", "graph")
RATIO = "x_flat"
COLUMNS = ("impl", "op", "capacity", "batch", "mode", "median_us", RATIO)
COLUMNS += ("min_us", "max_us", "iters", "repeats", "status", "note")
#: where the targets are read: capacity, batch, mode
TARGET_AT = (2**24, 16384, "graph")

_log = make_log("gper bench trajectory")


@dataclass
class TrajectoryBenchConfig(TimedSweep):
    """What to sweep and how to time it (``gper bench trajectory --help`` documents each field)."""

    ops: list[str] = field(default_factory=lambda: list(TRAJ_OPS))
    flat: bool = True
    traj: TrajectoryWorkload = field(default_factory=TrajectoryWorkload)
    max_fill_s: float = 300.0
    deadline: float | None = None
    out: Path | None = DEFAULT_OUT
    seed: int = 0
    command: str = ""


class FlatPeer(gper_peer.GperPeer):
    """The flat buffer of ``gper bench replay``, timed on the batches of the trajectory ops it is compared with."""

    def __init__(self, capacity: int, setting: Setting) -> None:
        super().__init__(capacity, setting)
        self.setting = setting

    def ops_at(self, impl: str, b: int) -> tuple[str, ...]:
        return _ops_at(FLAT_OPS, b, self.setting, add_op="add")


def add_ratios(rows: list[Row]) -> None:
    """Each trajectory row's ``x_flat``: its median over the flat buffer's row beside it (:data:`FLAT_OF`)."""
    flat = {(r.op, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.op in FLAT_OPS and r.median_us}
    for r in rows:
        base = flat.get((FLAT_OF.get(r.op), r.capacity, r.batch, r.mode))
        if base and r.median_us:
            r.ratios[RATIO] = r.median_us / base


def row_key(r: Row) -> tuple:
    """By size; per batch the trajectory ops in order, each followed by the flat op it is compared with."""
    if r.op in FLAT_OPS:
        after = [op for op in TRAJ_OPS if FLAT_OF.get(op) == r.op][-1]
        order = (TRAJ_OPS.index(after), 1)
    else:
        order = (TRAJ_OPS.index(r.op), 0)
    return (r.capacity, r.batch, order, MODES.index(r.mode))


def run(cfg: TrajectoryBenchConfig) -> list[Row]:
    """Run the sweep, print the tables, write the result files (unless ``cfg.out`` is None)."""
    if cfg.device.type == "cuda":
        torch.cuda.set_device(cfg.device)
    flat_impl = gper_peer.impl_name(cfg.device, cfg.backend)  # resolves the back end, fails now if it cannot run
    traj_impl = gper_traj.impl_name(flat_impl.removeprefix("gper-"))
    env = environment(cfg.device)
    files = ResultFiles(cfg.out, env, COLUMNS, prefix="trajectory") if cfg.out is not None else None
    modes = MODES if cfg.graph else ("eager",)
    w = cfg.traj
    setting = Setting(
        cfg.device, cfg.seed, tuple(cfg.batches), cfg.max_fill_s, cfg.deadline, cfg.backend, modes, traj=w
    )
    timer = Calibrated(warmup=cfg.warmup, iters=cfg.iters, repeats=cfg.repeats, target_ms=cfg.target_ms)
    flat_ops = tuple(op for op in FLAT_OPS if cfg.flat and op in {FLAT_OF.get(o) for o in cfg.ops})
    # add-envs and sequences are timed at their own batch sizes
    batches = sorted(set(cfg.batches) | {w.num_envs, w.seq_batch})
    sweep = Sweep(cfg.device, timer, [*cfg.ops, *flat_ops], batches, deadline=cfg.deadline, log=_log)
    _log(header_line(env, "trajectory"))
    rows: list[Row] = []
    for cap in cfg.capacities:
        _log(f"capacity {format_capacity(cap)} ({cap:,})")
        cap_rows = []
        traj_build = partial(gper_traj.build, (traj_impl,), cap, setting)
        traj_at = partial(gper_traj.ops_at, setting=setting)
        group = Group(cap, (traj_impl,), traj_build, gper_traj.ops_of, traj_at, unbuilt_modes=lambda impl: modes)
        cap_rows += sweep.group(group)
        if flat_ops:
            group = Group(
                cap,
                (flat_impl,),
                partial(FlatPeer, cap, setting),
                ops_of=lambda impl: FLAT_OPS,
                ops_at=lambda impl, b: _ops_at(FLAT_OPS, b, setting, add_op="add"),
                unbuilt_modes=lambda impl: modes,
            )
            cap_rows += sweep.group(group)
        add_ratios(cap_rows)
        add_capacity(rows, cap_rows, row_key, files)
    text, tables, markdown = _report(cfg, env, rows)
    print(text)
    for title, table in tables:
        print()
        print_table(*table, title=title)
    if files:
        files.write_markdown(markdown)
        _log(f"wrote {files.csv_path} and {files.md_path}")
    return rows


# ----------------------------------------------------------------------------------------------
# the report


def _us(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def _cell(r: Row | None) -> str:
    return "" if r is None else _us(r.median_us) if r.median_us is not None else r.status


def _times(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


def _targets(cfg: TrajectoryBenchConfig, rows: list[Row]) -> tuple[str, tuple] | None:
    """The targets' table: trajectory against flat at 2^24, B = 16384, in a graph (or the nearest measured)."""
    by = {(r.op, r.capacity, r.batch, r.mode): r for r in rows}
    measured = [r for r in rows if r.median_us is not None and r.op in TRAJ_OPS]
    if not measured:
        return None
    caps = {r.capacity for r in measured}
    cap = TARGET_AT[0] if TARGET_AT[0] in caps else max(caps)
    sample_batches = {r.batch for r in measured if r.capacity == cap and r.op.startswith(("sample", "step"))}
    b = TARGET_AT[1] if TARGET_AT[1] in sample_batches else max(sample_batches, default=cfg.batches[-1])
    mode = TARGET_AT[2] if any(r.mode == "graph" for r in measured) else "eager"
    w, cuda = cfg.traj, cfg.device.type == "cuda"
    lines = []
    for op, what, batch, target in (
        ("sample-n1", "sample, 1-step: every field and the IS weights", b, 1.2),
        ("sample-n3", "sample, 3-step (gamma 0.99), against the flat 1-step sample", b, 1.5),
        ("step-n1", "PER step (sample + update), 1-step", b, None),
        ("step-n3", "PER step (sample + update), 3-step, against the flat 1-step step", b, None),
        ("add-envs", f"add: one step of {w.num_envs} streams (target in us)", w.num_envs, 10.0),
        ("sequences", f"sample_sequences(B, length={w.seq_length}, burn_in={w.burn_in})", w.seq_batch, None),
    ):
        if op not in cfg.ops:
            continue
        t, f = by.get((op, cap, batch, mode)), by.get((FLAT_OF.get(op), cap, batch, mode))
        ratio = t.ratios.get(RATIO) if t else None
        goal, met = "", ""
        if target is not None and cuda and op == "add-envs":
            us = t.median_us if t else None
            goal, met = f"< {target:g} us", "?" if us is None else "yes" if us < target else "NO"
        elif target is not None and cuda:
            goal, met = f"<= {target:g}x", "?" if ratio is None else "yes" if ratio <= target else "NO"
        lines.append([what, str(batch), _cell(t), _cell(f), _times(ratio), goal, met])
    headers = ["what", "batch", "trajectory us", "flat us", "trajectory / flat", "target", "met"]
    title = f"targets at {format_capacity(cap)} slots, B = {b}, {mode}" + ("" if cuda else " (targets are for CUDA)")
    return title, (headers, lines, [False, True, True, True, True, True, False])


def _against_capacity(rows: list[Row], mode: str, b: int, w: TrajectoryWorkload) -> tuple[str, tuple] | None:
    """Each op's median at every capacity (in ``mode``, at batch ``b``; add and sequences at their own), and
    the largest capacity's over the smallest's."""
    at = {op: b for op in (*TRAJ_OPS, *FLAT_OPS)} | {"add-envs": w.num_envs, "add": w.num_envs}
    at["sequences"] = w.seq_batch
    by = {(r.impl, r.op, r.capacity): r for r in rows if r.mode == mode and r.batch == at.get(r.op)}
    caps = sorted({c for _, _, c in by})
    if len(caps) < 2:
        return None
    lines = []
    for impl, op in sorted({(i, o) for i, o, _ in by}, key=lambda k: row_key(Row(k[0], k[1], 0, 0, mode))):
        line = [impl, op, str(at[op])] + [_cell(by.get((impl, op, c))) for c in caps]
        lo, hi = by.get((impl, op, caps[0])), by.get((impl, op, caps[-1]))
        flatness = hi.median_us / lo.median_us if lo and hi and lo.median_us and hi.median_us else None
        lines.append(line + [_times(flatness)])
    headers = ["impl", "op", "batch"] + [format_capacity(c) for c in caps] + [f"{format_capacity(caps[-1])} / smallest"]
    title = f"time against capacity, us ({mode})"
    return title, (headers, lines, [False, False] + [True] * (len(headers) - 2))


def _all_rows(rows: list[Row]) -> tuple:
    headers = ["impl", "op", "capacity", "batch", "mode", "median_us", "x_flat", "note"]
    lines = [
        [r.impl, r.op, format_capacity(r.capacity), str(r.batch), r.mode, _cell(r), _times(r.ratios.get(RATIO)), r.note]
        for r in rows
    ]
    return headers, lines, [False, False, True, True, False, True, True, False]


def _report(cfg: TrajectoryBenchConfig, env: dict, rows: list[Row]) -> tuple[str, list, str]:
    """(text printed first, [(title, table)] printed after it, the Markdown written)."""
    w = cfg.traj
    iters = f"{cfg.iters} calls" if cfg.iters else f"about {cfg.target_ms:g} ms of calls"
    clock = "CUDA events" if cfg.device.type == "cuda" else "perf_counter"
    settings = (
        f"Median of {cfg.repeats} repeats of {iters} ({clock}), after {cfg.warmup} warm-up calls; eager = plain "
        "Python calls, graph = replays of one captured CUDA graph. Trajectory buffer: obs (51,) f32, action () i64, "
        f"reward () f32 a step, {w.num_envs} streams of random episodes (a step ends one with probability "
        f"{w.end_prob:g}, half terminated, half truncated), window {w.window}, filled to capacity; add-envs adds one "
        "step of every stream, continuing its episode. Flat buffer: the reference transition of `gper bench replay` "
        "(obs and next_obs (51,) f32, action, reward, done). Both: alpha 0.6, beta 0.4, eps 1e-6, priorities of "
        "random TD errors (log-uniform 1e-3..1e2). x_flat = trajectory median / flat median beside it "
        "(sample-n1 and sample-n3 / sample, step-n1 and step-n3 / step, add-envs / add of as many transitions)."
    )
    if cfg.device.type != "cuda":
        settings += " Ran on the CPU, not a GPU: small sizes, no CUDA graphs."
    head = header_line(env, "trajectory")
    tables = []
    targets = _targets(cfg, rows)
    if targets:
        tables.append(targets)
    mode = "graph" if cfg.graph and any(r.mode == "graph" for r in rows) else "eager"
    b = TARGET_AT[1] if TARGET_AT[1] in cfg.batches else max(cfg.batches)
    curve = _against_capacity(rows, mode, b, w)
    if curve:
        tables.append(curve)
    full = ("all rows", _all_rows(rows))
    command = cfg.command or " ".join(sys.argv)
    md = [f"# {head}", "", settings, "", f"Command: `{command}`", ""]
    for title, table in tables:
        md += [f"## {title}", "", format_markdown(*table), ""]
    md += ["## All rows", "", format_markdown(*full[1]), ""]
    return f"{head}\n{settings}", [full, *tables], "\n".join(md)
