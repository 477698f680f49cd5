"""``gper bench peers``: gper against other replay libraries (:mod:`gper.bench.peers_sweep`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gper.bench.flags import OUT_HELP, add_sizes, device_of, sizes_of
from gper.bench.peers import canonical_name
from gper.bench.report import DEFAULT_OUT

# peers: (capacities as log2, batches, repeats) by device and --quick
PEERS_DEFAULTS = {
    ("cuda", False): ((16, 20, 24, 25), (256, 16384), 7),
    ("cuda", True): ((16, 20), (256, 16384), 3),
    ("cpu", False): ((16, 20), (256, 16384), 5),
    ("cpu", True): ((12, 16), (256,), 2),
}


def add_peers_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.peers_sweep import ALL_OPS, PEERS, TRAJ_PEERS

    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    add_sizes(
        p,
        "log2 sizes (or 2^k, or slot counts above 40); default CUDA: 16 20 24 25, CPU: 16 20",
        "batch sizes (default 256 16384)",
    )
    p.add_argument(
        "--peers",
        nargs="+",
        type=canonical_name,
        choices=PEERS + TRAJ_PEERS,
        default=list(PEERS),
        help=f"what to time (default the flat workload's: {' '.join(PEERS)}; the trajectory workload's, by name: "
        f"{' '.join(TRAJ_PEERS)})",
    )
    p.add_argument(
        "--ops",
        nargs="+",
        choices=ALL_OPS,
        default=list(ALL_OPS),
        help="which calls to time (default all; each peer is timed on its own workload's)",
    )
    p.add_argument(
        "--num-envs",
        type=int,
        default=256,
        help="streams of the trajectory workload (default 256; add-envs is timed at this batch)",
    )
    p.add_argument("--repeats", type=int, help="timed repeats per cell, the median is reported (default CUDA 7, CPU 5)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per cell (default 3)")
    p.add_argument("--target-ms", type=float, default=20.0, help="length of a repeat (default 20 ms)")
    p.add_argument("--max-call-s", type=float, default=2.0, help="skip a cell whose single call takes longer (2 s)")
    p.add_argument("--max-cell-s", type=float, default=4.0, help="fewer repeats past this many seconds per cell (4)")
    p.add_argument("--max-fill-s", type=float, default=180.0, help="skip a capacity whose fill would take longer")
    p.add_argument("--worker-timeout-s", type=float, default=1500.0, help="limit for each JAX peer's subprocess")
    p.add_argument(
        "--deadline-s",
        type=float,
        help="start no fill or cell after this many seconds: the rest is recorded as skipped and the report "
        "is written (for a machine lent for a fixed time)",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        help="torch's intra-op threads (default: torch's choice); 1 keeps a busy shared CPU from stalling "
        "torch's parallel kernels",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer sizes and repeats")


def peers_config(args: argparse.Namespace):
    from gper.bench.peers_sweep import ALL_OPS, PeersConfig
    from gper.bench.workload import TrajectoryWorkload

    prog = "gper bench peers"
    device = device_of(args.device, prog)
    caps, batches, repeats = PEERS_DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    capacities, batch_sizes = sizes_of(args, prog)
    return PeersConfig(
        capacities=capacities or [2**k for k in caps],
        batches=batch_sizes or list(batches),
        device=device,
        peers=list(dict.fromkeys(args.peers)),
        ops=[op for op in ALL_OPS if op in args.ops],
        repeats=args.repeats or repeats,
        warmup=args.warmup,
        target_ms=args.target_ms,
        max_call_s=args.max_call_s,
        max_cell_s=args.max_cell_s,
        max_fill_s=args.max_fill_s,
        worker_timeout_s=args.worker_timeout_s,
        deadline=None if args.deadline_s is None else time.monotonic() + args.deadline_s,
        out=Path(args.out),
        plot=not args.no_plot,
        seed=args.seed,
        command=getattr(args, "command_line", ""),
        traj=TrajectoryWorkload(num_envs=args.num_envs),
    )


def run_peers(args: argparse.Namespace) -> int:
    """Exit status 1 if any of gper's cells failed."""
    from gper.bench.peers_sweep import run

    if args.threads:
        torch.set_num_threads(args.threads)
    rows, _ = run(peers_config(args))
    return 1 if any(r.status == "error" and r.impl.startswith("gper") for r in rows) else 0
