"""``gper bench peers``: time gper against the prioritized replay buffers people use today, on the reference workload.

Peers (:mod:`gper.bench.peers`; each imported only when asked for; one that is not installed,
or does not load, is skipped with a message and named in the report): ``gper`` (eager and, on
CUDA, replayed as one captured graph), the O(N) baselines ``cumsum`` and ``multinomial``,
``torchrl`` and ``torchrl-td``, ``cpprb``, and ``flashbax`` and ``flashbax-x64`` (each in a
worker process of its own). On the trajectory workload (:data:`TRAJ_PEERS`, asked for by name):
``gper-traj`` (:class:`gper.TrajectoryReplayBuffer`), ``torchrl-nstep`` and
``torchrl-nstep-uniform`` (TorchRL's ``MultiStepTransform``) and ``flashbax-traj`` (flashbax's
prioritised trajectory buffer, in the worker process).

What is timed, per capacity and batch size B, on a buffer filled to capacity with random
transitions (obs and next_obs 51 float32, action int64, reward float32, done bool) whose
priorities are then set from log-uniform TD errors:

* ``add``: B new transitions, already on the device.
* ``sample``: B transitions with their IS weights and indices, every field on the device.
* ``update``: new priorities for one sampled batch, from a [B] tensor of TD errors on the device.
* ``step``: ``sample`` then ``update`` of what it drew (the PER step of a training loop).
* ``step+add``: ``add`` then ``step``.

The trajectory workload's ops (:data:`~gper.bench.peers.base.TRAJ_OPS`) are ``sample-n1`` /
``sample-n3`` (1-step / 3-step transitions, discount 0.99, with IS weights), ``step-n1`` /
``step-n3`` (that sample, then the update of what it drew) and ``add-envs`` (one step of every one
of ``--num-envs`` streams, timed at batch ``num_envs``), on ``--num-envs`` streams of random
episodes filled to capacity; their ratios are against ``gper-traj``.

Where a peer hands results to the host (cpprb's arrays, TorchRL's host-side IS weights), the time
includes moving them to the device, and where it needs TD errors or new data on the host, moving
them there; on the CPU nothing moves. Each number is the median over repeats of the mean over
enough back-to-back calls to fill ``--target-ms``, after warm-up calls (compilation, allocation);
CUDA events time torch work, wall time around calls closed by ``block_until_ready`` times JAX
(:class:`gper.bench.harness.Probed`). A cell whose single call takes longer than ``--max-call-s``,
or a capacity whose fill would take longer than ``--max-fill-s``, is skipped and the reason
recorded. Running out of memory is recorded per cell, and the sweep goes on.

Results go to ``--out``: ``peers-<device>-<stamp>.csv`` (rewritten as rows arrive, so a run cut
short keeps what it measured), ``.md`` (header, summaries, all rows) and ``.png`` (time per PER
step against capacity, log-log, one line per implementation, one panel per batch size).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from gper.bench import peers
from gper.bench.harness import Group, Probed, Row, Sweep, free, make_log
from gper.bench.peers import baselines
from gper.bench.peers import flashbax as flashbax_peer
from gper.bench.peers import gper as gper_peer
from gper.bench.peers import gper_traj as gper_traj_peer
from gper.bench.peers.base import OPS, TRAJ_OPS, Peer, Setting
from gper.bench.peers_report import add_ratios, make_report, plot_steps, row_key
from gper.bench.report import DEFAULT_OUT, ResultFiles, environment, header_line, print_table
from gper.bench.workload import TrajectoryWorkload, format_capacity

#: in the order they run (the targets' peers first, so a run cut short by --deadline-s keeps them)
PEERS = ("gper", "torchrl", "torchrl-td", "flashbax", "cpprb", "flashbax-x64", "cumsum", "multinomial")
#: the peers of the trajectory workload (n-step transitions from streams of steps), timed when named
TRAJ_PEERS = ("gper-traj", "torchrl-nstep", "torchrl-nstep-uniform", "flashbax-traj")
#: every op, of both workloads (each peer is timed on those of its own workload)
ALL_OPS = OPS + tuple(op for op in TRAJ_OPS if op != "sequences")
JAX_PEERS = flashbax_peer.WORKER_NAMES
COLUMNS = ("impl", "op", "capacity", "batch", "mode", "median_us", "x_gper_eager", "x_gper_graph")
COLUMNS += ("min_us", "max_us", "iters", "repeats", "status", "note")

log = make_log("gper bench peers")


@dataclass
class PeersConfig:
    """What to sweep and how (``gper bench peers --help`` documents each field)."""

    capacities: list[int]
    batches: list[int]
    device: torch.device
    peers: list[str] = field(default_factory=lambda: list(PEERS))
    ops: list[str] = field(default_factory=lambda: list(ALL_OPS))
    repeats: int = 7
    warmup: int = 3
    target_ms: float = 20.0
    max_call_s: float = 2.0
    max_cell_s: float = 4.0
    max_fill_s: float = 180.0
    worker_timeout_s: float = 1500.0
    out: Path | None = DEFAULT_OUT
    plot: bool = True
    seed: int = 0
    command: str = ""
    #: ``time.monotonic()`` after which no fill or cell starts (the rest is recorded as skipped)
    deadline: float | None = None
    #: the 1-minute load average at the start and end of a CPU run (others' work there skews the numbers)
    load: str = ""
    #: the streams of the trajectory workload's peers
    traj: TrajectoryWorkload = field(default_factory=TrajectoryWorkload)

    def left_s(self) -> float:
        """Seconds left before the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def timer(self) -> Probed:
        return Probed(self.warmup, self.repeats, self.target_ms, self.max_call_s, self.max_cell_s)


def plain_mode(impl: str) -> str:
    """How ``impl`` is called when nothing else is said: the mode a row that never ran is filed under."""
    return "jit" if impl in JAX_PEERS else "eager"


def _group(cfg: PeersConfig, peer: str, cap: int, ours: str, setting: Setting) -> Group:
    """One in-process peer at capacity ``cap`` (the two baselines share one set of arrays)."""
    module = peers.load(peer)
    if peer == "gper":
        impls = (ours,)
    elif peer == "gper-traj":
        impls = (gper_traj_peer.impl_name(ours.removeprefix("gper-")),)
    elif module is baselines:
        impls = tuple(baselines.IMPLS[p] for p in baselines.NAMES if p in cfg.peers)
    else:
        impls = (peer,)
    build = partial(module.build, impls, cap, setting)
    ops_of = getattr(module, "ops_of", Peer.ops_of)
    ops_at = partial(module.ops_at, setting=setting) if hasattr(module, "ops_at") else None
    return Group(cap, impls, build, ops_of=ops_of, ops_at=ops_at, unbuilt_modes=lambda impl: (plain_mode(impl),))


def _write_csv(files: ResultFiles, rows: list[Row]) -> None:
    add_ratios(rows)
    files.rewrite([r.csv() for r in sorted(rows, key=row_key)])


def run(cfg: PeersConfig) -> tuple[list[Row], dict]:
    """Run every peer over every capacity; write and print the results. Returns (rows, report info)."""
    if cfg.device.type == "cuda":
        torch.cuda.set_device(cfg.device)
    env = environment(cfg.device)
    versions, absent = {}, {}
    cfg.peers = list(dict.fromkeys(peers.canonical_name(p) for p in cfg.peers))
    for peer in cfg.peers:
        ok, text = peers.status(peer, cfg.device)
        (versions if ok else absent)[peer] = text
        if not ok:
            log(f"skipping {peer}: {text}")
    cfg.peers = [p for p in cfg.peers if p in versions]
    files = ResultFiles(cfg.out, env, COLUMNS, prefix="peers") if cfg.out is not None else None
    log(header_line(env, "peers"))
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    rows: list[Row] = []
    ours = gper_peer.impl_name(cfg.device)
    modes = ("graph", "eager") if cfg.device.type == "cuda" else ("eager",)
    setting = Setting(cfg.device, cfg.seed, tuple(cfg.batches), cfg.max_fill_s, cfg.deadline, modes=modes)
    setting = dataclasses.replace(setting, traj=cfg.traj)
    sweep = Sweep(cfg.device, cfg.timer(), cfg.ops, cfg.batches, deadline=cfg.deadline, log=log)
    for peer in cfg.peers:
        if peer in JAX_PEERS:
            got, text = _run_worker(cfg, peer)
            rows += got
            versions[peer] = text or versions[peer]
        elif peer == "multinomial" and "cumsum" in cfg.peers:
            continue  # timed with the cumsum baseline, on the same arrays
        else:
            for cap in cfg.capacities:
                log(f"{peer} at capacity {format_capacity(cap)} ({cap:,})")
                rows += sweep.group(_group(cfg, peer, cap, ours, setting))
                if files:
                    _write_csv(files, rows)
        if files:
            _write_csv(files, rows)
    add_ratios(rows)
    rows.sort(key=row_key)
    if hasattr(os, "getloadavg"):
        cfg.load = f"{load0:.1f} and {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    report = make_report(cfg, env, versions, absent, rows)
    print(report["text"])
    for title, table in report["tables"]:
        print()
        print_table(*table, title=title)
    if files:
        _write_csv(files, rows)
        files.write_markdown(report["markdown"])  # written before the plot, which may fail
        png = files.path(".png")
        if cfg.plot and plot_steps(rows, png, header_line(env, "peers"), log):
            files.write_markdown(make_report(cfg, env, versions, absent, rows, png=png.name)["markdown"])
            log(f"wrote {png}")
        log(f"wrote {files.csv_path} and {files.md_path}")
    return rows, {"env": env, "versions": versions, "absent": absent, "files": files}


def _run_worker(cfg: PeersConfig, peer: str) -> tuple[list[Row], str]:
    """Run a JAX peer over every capacity in its worker process; rows it could not reach are marked skipped."""
    timeout, left = cfg.worker_timeout_s, None
    if cfg.deadline is not None:  # the worker stops starting work at the same deadline; a margin to report
        left = max(cfg.left_s(), 0.0)
        timeout = min(timeout, left + 60)
    free(cfg.device)
    log(f"{peer}: in a subprocess")
    got, versions, why = flashbax_peer.time_in_worker(
        peer,
        cfg.device,
        cfg.capacities,
        cfg.batches,
        cfg.ops,
        cfg.timer(),
        cfg.seed,
        cfg.max_fill_s,
        left,
        timeout,
        traj=cfg.traj,
    )
    why = f"the {peer} worker {why}" if why else ""
    rows = [Row(**r) for r in got]
    seen = {(r.capacity, r.batch, r.op) for r in rows}
    setting = Setting(cfg.device, batches=tuple(cfg.batches), traj=cfg.traj)
    for cap in cfg.capacities:
        for b in (b for b in cfg.batches if b <= cap):
            for op in (op for op in cfg.ops if op in flashbax_peer.ops_at(peer, b, setting)):
                if (cap, b, op) not in seen:
                    rows.append(Row(peer, op, cap, b, "jit", status="skipped", note=why or "not reached"))
    if why:
        log(why)
    return rows, versions
