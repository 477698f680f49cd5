"""What ``gper bench peers`` prints and writes: the step summaries, the headline ratios, every row, the plot.

Rows are :class:`gper.bench.harness.Row`; their ``ratios`` hold ``x_gper_eager`` and
``x_gper_graph`` (this median over gper's, same op and size: above 1, slower than gper).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gper.bench import peers
from gper.bench.harness import Row
from gper.bench.peers.base import OPS, TRAJ_OPS
from gper.bench.peers.baselines import CUMSUM, MULTINOMIAL
from gper.bench.report import format_markdown, header_line
from gper.bench.workload import format_capacity

if TYPE_CHECKING:
    from gper.bench.peers_sweep import PeersConfig

MODES = ("graph", "eager", "jit", "jit-split", "jit-scan")
RATIOS = ("x_gper_eager", "x_gper_graph")
#: the order implementations are listed in, in tables and in the plot
IMPL_ORDER = ("gper-triton", "gper-torch", CUMSUM, MULTINOMIAL, "torchrl", "torchrl-td", "cpprb", "flashbax")
IMPL_ORDER += ("flashbax-x64", "gper-traj-triton", "gper-traj-torch", "torchrl-nstep", "torchrl-nstep-uniform")
IMPL_ORDER += ("flashbax-traj",)
#: the trajectory workload's ops that get a summary table of their own: (op, title)
TRAJ_SUMMARIES = (
    ("sample-n1", "trajectory workload: sample-n1 = 1-step sample, us"),
    ("sample-n3", "trajectory workload: sample-n3 = 3-step sample (gamma 0.99), us"),
    ("step-n3", "trajectory workload: step-n3 = 3-step sample + update, us"),
    ("add-envs", "trajectory workload: add-envs = one step of every stream, us"),
)
#: the targets set for gper's step at 2^24 slots on the H200: at least this many times faster than the peer
TARGETS = {
    ("torchrl", 16384, "graph"): 300,
    ("torchrl", 16384, "eager"): 100,
    ("torchrl", 256, "eager"): 15,
    ("flashbax", 16384, "graph"): 50,
    ("flashbax", 16384, "eager"): 25,
    ("flashbax", 256, "eager"): 15,
}


def row_key(r: Row) -> tuple:
    order = IMPL_ORDER.index(r.impl) if r.impl in IMPL_ORDER else len(IMPL_ORDER)
    return (r.capacity, r.batch, (OPS + TRAJ_OPS).index(r.op), order, MODES.index(r.mode))


def add_ratios(rows: list[Row]) -> None:
    """Each row's median over gper's (eager and graph) for the same op and size: how many times slower."""
    ours = {(r.op, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.impl.startswith("gper") and r.median_us}
    for r in rows:
        if r.median_us is None:
            continue
        for mode in ("eager", "graph"):
            base = ours.get((r.op, r.capacity, r.batch, mode))
            r.ratios[f"x_gper_{mode}"] = r.median_us / base if base else None


def _us(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def _times(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}x" if x >= 100 else f"{x:.1f}x" if x >= 0.1 else f"{x:.2g}x"


def _label(impl: str, mode: str) -> str:
    """``impl`` alone where it is called one way only, else with its mode."""
    if mode in ("graph", "jit-split", "jit-scan") or impl.startswith("gper") or impl in (CUMSUM, MULTINOMIAL):
        return f"{impl} {mode}"
    return impl


def summary(rows: list[Row], op: str) -> tuple[list[str], list[list[str]], list[bool]] | None:
    """One line per (capacity, batch) with ``op``'s median for every implementation and mode, in µs."""
    cells = {(r.capacity, r.batch, r.impl, r.mode): r for r in rows if r.op == op}
    if not cells:
        return None
    cols = sorted({(r.impl, r.mode) for r in cells.values()}, key=lambda c: row_key(Row(c[0], op, 0, 0, c[1])))
    headers = ["capacity", "batch"] + [_label(i, m) for i, m in cols]
    lines = []
    for cap, b in sorted({(k[0], k[1]) for k in cells}):
        line = [format_capacity(cap), str(b)]
        for impl, mode in cols:
            r = cells.get((cap, b, impl, mode))
            line.append("" if r is None else _us(r.median_us) if r.median_us is not None else r.status)
        lines.append(line)
    return headers, lines, [False] + [True] * (len(headers) - 1)


def headline(rows: list[Row], device: torch.device) -> tuple[str, tuple] | None:
    """gper's step against each peer's at 2^24 (or the largest capacity measured), at the largest and smallest batch.

    Each peer is taken in its fastest way of calling one step (for flashbax, the better of one
    jitted step and separate jitted calls), and, where it ran, as a compiled loop of steps too
    (flashbax's jit-scan): a line each. Where gper ran as a graph too, both ratios are given, and
    on CUDA the :data:`TARGETS` beside them (they were set for the H200 at 2^24).
    """
    step = {(r.impl, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.op == "step" and r.median_us}
    caps = sorted({c for _, c, _, _ in step})
    if not caps:
        return None
    cap = 2**24 if 2**24 in caps else caps[-1]
    ours = next((i for i, c, _, _ in step if i.startswith("gper") and c == cap), None)
    batches = sorted({b for i, c, b, _ in step if c == cap and i == ours}, reverse=True)
    if ours is None or not batches:
        return None
    batches = list(dict.fromkeys((batches[0], batches[-1])))
    graph = any(m == "graph" for i, c, _, m in step if i == ours and c == cap)
    g = {(b, m): step.get((ours, cap, b, m)) for b in batches for m in ("graph", "eager")}
    others = sorted({i for i, c, _, _ in step if c == cap and not i.startswith("gper")}, key=IMPL_ORDER.index)
    targets = device.type == "cuda" and graph
    headers = ["peer", "batch", "peer us"] + (["gper graph us", "peer / gper graph"] if graph else [])
    headers += ["gper eager us", "peer / gper eager"] + (["target graph / eager"] if targets else [])
    lines = []
    for p in others:
        for b in batches:
            ways = {m: v for (i, c, bb, m), v in step.items() if (i, c, bb) == (p, cap, b) and m != "graph"}
            per_call = {m: v for m, v in ways.items() if m != "jit-scan"}
            best = [min(per_call.items(), key=lambda kv: kv[1])] if per_call else []
            best += [("jit-scan", ways["jit-scan"])] if "jit-scan" in ways else []
            for mode, t in best:
                lines.append(_headline_line(p, b, mode, t, g, graph, targets))
    if not lines:
        return None
    title = (
        f"step (sample + update) at {format_capacity(cap)}: peer's time over gper's ({ours}); above 1, gper is faster"
    )
    return title, (headers, lines, [False] + [True] * (len(headers) - 1))


def _headline_line(p: str, b: int, mode: str, t: float, g: dict, graph: bool, targets: bool) -> list[str]:
    """One headline row: peer ``p`` at batch ``b`` called as ``mode`` (``t`` us) against gper's graph and eager."""
    gg, ge = g.get((b, "graph")), g.get((b, "eager"))
    rg, re = (t / gg if gg else None), (t / ge if ge else None)
    line = [p if mode in ("eager", "jit") else f"{p} ({mode})", str(b), _us(t)]
    line += [_us(gg), _times(rg)] if graph else []
    line += [_us(ge), _times(re)]
    if targets:
        fam = "flashbax" if p.startswith("flashbax") else "torchrl" if p.startswith("torchrl") else None
        tg, te = TARGETS.get((fam, b, "graph")), TARGETS.get((fam, b, "eager"))
        line.append(" / ".join(f"{x}x {_met(v, x)}" if x else "-" for v, x in ((rg, tg), (re, te))))
    return line


def _met(ratio: float | None, target: int) -> str:
    return "?" if ratio is None else "met" if ratio >= target else "NOT met"


def make_report(
    cfg: PeersConfig, env: dict, versions: dict, absent: dict, rows: list[Row], png: str | None = None
) -> dict:
    """The text printed, the tables printed, and the Markdown written, which shows the plot ``png`` (a
    file name beside it) where one is given."""
    head = header_line(env, "peers")
    peers_line = "Peers: " + "; ".join(f"{p}: {v}" for p, v in versions.items())
    if absent:
        peers_line += ". Skipped: " + "; ".join(f"{p} ({why})" for p, why in absent.items())
    cuda = cfg.device.type == "cuda"
    clock = "CUDA events for torch, wall time closed by block_until_ready for JAX" if cuda else "wall time"
    settings = (
        f"Median of up to {cfg.repeats} repeats, each the mean of enough back-to-back calls to last about "
        f"{cfg.target_ms:g} ms ({clock}), after warm-up calls. Buffers filled to capacity, priorities from "
        "log-uniform TD errors (1e-3..1e2), alpha 0.6, beta 0.4, eps 1e-6. eager = plain calls; "
        "graph = replays of one captured CUDA graph; jit = calls of jitted JAX functions, state donated. "
        "Peers' results are on the device and their transfers are counted (host-side trees and storage). "
        "x_gper_eager / x_gper_graph = this median over gper's for the same op and size (above 1: slower than gper). "
        "flashbax and the O(N) baselines normalise IS weights by the batch's largest (no O(N) pass); gper, TorchRL "
        "and cpprb by the global minimum priority. flashbax stores action as int32 without x64 (JAX has no int64 then)."
    )
    if not cuda:
        settings += (
            f" Ran on the CPU with {torch.get_num_threads()} torch thread(s): gper's torch back end; "
            "no CUDA graphs; nothing is transferred."
        )
        if cfg.load:
            settings += f" Load average of the machine at the start and end: {cfg.load}."
    if any(r.op in TRAJ_OPS for r in rows):
        w = cfg.traj
        settings += (
            f" Trajectory workload (ops *-n1, *-n3, add-envs): {w.num_envs} streams of random episodes (a step ends "
            f"one with probability {w.end_prob:g}), filled to capacity; 1-step and 3-step transitions (gamma 0.99) "
            "with IS weights; its x_gper ratios are over gper-traj's."
        )
    tables = []
    flat = (("step", "step = sample + update_priorities, us"), ("step+add", "step+add = add + step, us"))
    for op, title in flat + TRAJ_SUMMARIES:
        s = summary(rows, op)
        if s:
            tables.append((title, s))
    h = headline(rows, cfg.device)
    if h:
        tables.append(h)
    full = _all_rows(rows)
    command = cfg.command or " ".join(sys.argv)
    md = [f"# {head}", "", peers_line, "", settings, "", f"Command: `{command}`", ""]
    for title, table in tables:
        md += [f"## {title}", "", format_markdown(*table), ""]
    notes = [f"- **{p}**: {text}" for p, text in _where_time_goes(versions)]
    if notes:
        md += ["## Where each peer's time goes (from its source)", "", *notes, ""]
    if png is not None:
        md += [f"![time per PER step]({png})", ""]
    md += ["## All rows", ""]
    md += [format_markdown(*full), ""]
    return {
        "text": f"{head}\n{peers_line}\n{settings}",
        "tables": [("all rows", full), *tables],  # printed in this order: the summaries end the output
        "markdown": "\n".join(md),
    }


def _where_time_goes(versions: dict) -> list[tuple[str, str]]:
    """(peer, one line from its module) for every peer that ran and has one."""
    out = []
    for p in versions:
        text = peers.load(p).WHERE_TIME_GOES.get(p)
        if text:
            out.append((p, text))
    return out


def _all_rows(rows: list[Row]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["impl", "op", "capacity", "batch", "mode", "median_us", "x_gper_eager", "x_gper_graph", "note"]
    lines = [
        [
            r.impl,
            r.op,
            format_capacity(r.capacity),
            str(r.batch),
            r.mode,
            _us(r.median_us) if r.median_us is not None else r.status,
            _times(r.ratios.get("x_gper_eager")),
            _times(r.ratios.get("x_gper_graph")),
            r.note,
        ]
        for r in rows
    ]
    return headers, lines, [False, False, True, True, False, True, True, True, False]


def plot_steps(rows: list[Row], path: Path, title: str, log: Callable[[str], None]) -> bool:
    """Time per PER step against capacity, log-log, a line per implementation and mode, a panel per batch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log('no plot: it needs matplotlib (pip install ".[peers]")')
        return False
    step = [r for r in rows if r.op == "step" and r.median_us is not None]
    batches = sorted({r.batch for r in step})
    if not batches:
        return False
    fig, axes = plt.subplots(1, len(batches), figsize=(6.5 * len(batches), 5), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        lines = sorted(
            {(r.impl, r.mode) for r in step if r.batch == b}, key=lambda c: row_key(Row(c[0], "step", 0, 0, c[1]))
        )
        colors = plt.get_cmap("tab20").colors  # up to 13 lines on a GPU: more than the default cycle's 10
        for n, (impl, mode) in enumerate(lines):
            pts = sorted((r.capacity, r.median_us) for r in step if r.batch == b and (r.impl, r.mode) == (impl, mode))
            style = "-" if impl.startswith("gper") else "--"
            ax.plot(
                [c for c, _ in pts],
                [t for _, t in pts],
                style,
                color=colors[n % len(colors)],
                marker="os^vD"[n % 5],
                label=_label(impl, mode),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("capacity (slots)")
        ax.set_ylabel("time per PER step (sample + update), us")
        ax.set_title(f"batch {b}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
