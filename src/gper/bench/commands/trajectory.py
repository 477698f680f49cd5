"""``gper bench trajectory``: the trajectory buffer beside the flat one (:mod:`gper.bench.trajectory_sweep`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gper.bench.flags import OUT_HELP, add_sizes, add_timing, device_of, timing_settings
from gper.bench.report import DEFAULT_OUT

# trajectory: (capacities as log2, batches, repeats, ms per repeat) by device and --quick
TRAJ_DEFAULTS = {
    ("cuda", False): ((16, 18, 20, 22, 24, 25), (256, 16384), 5, 20.0),
    ("cuda", True): ((20, 24), (16384,), 3, 10.0),
    ("cpu", False): ((12, 14), (256,), 3, 10.0),
    ("cpu", True): ((12,), (64,), 2, 5.0),
}
# trajectory on the CPU: fewer streams and sequences, so small capacities hold a window
TRAJ_CPU = {"num_envs": 16, "seq_batch": 32}


def add_trajectory_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.peers.base import TRAJ_OPS

    add_sizes(
        p,
        "buffer sizes: log2 sizes (numbers up to 40), 2^k or plain ints (default on CUDA: 16 18 20 22 24 25; "
        "on CPU: 12 14); a size must hold num_envs streams of window + 2 rows",
        "batch sizes of the samples and steps (default on CUDA: 256 16384; on CPU: 256)",
    )
    add_timing(p)
    p.add_argument("--ops", nargs="+", choices=TRAJ_OPS, default=list(TRAJ_OPS), help="trajectory calls to time")
    p.add_argument("--no-flat", action="store_true", help="do not time the flat buffer beside them")
    p.add_argument("--num-envs", type=int, help="streams (default CUDA 256, CPU 16); add-envs is timed at this batch")
    p.add_argument("--window", type=int, default=80, help="the buffer's longest n-step or sequence (default 80)")
    p.add_argument("--seq-batch", type=int, help="sequences per sample_sequences call (default CUDA 256, CPU 32)")
    p.add_argument("--seq-length", type=int, default=80, help="steps of a sequence after its burn-in (default 80)")
    p.add_argument("--burn-in", type=int, default=40, help="burn-in steps of a sequence (default 40)")
    p.add_argument("--end-prob", type=float, default=0.01, help="probability that a step ends its episode (0.01)")
    p.add_argument("--max-fill-s", type=float, default=300.0, help="skip a capacity whose fill would take longer")
    p.add_argument(
        "--deadline-s", type=float, help="start no fill or cell after this many seconds (the rest is skipped)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats: a smoke run")


def trajectory_config(args: argparse.Namespace):
    from gper.bench.peers.base import TRAJ_OPS
    from gper.bench.trajectory_sweep import TrajectoryBenchConfig
    from gper.bench.workload import TrajectoryWorkload

    prog = "gper bench trajectory"
    device = device_of(args.device, prog)
    cuda = device.type == "cuda"
    timing = timing_settings(args, prog, device, TRAJ_DEFAULTS[("cuda" if cuda else "cpu", args.quick)])
    defaults = {} if cuda else TRAJ_CPU
    traj = TrajectoryWorkload(
        num_envs=args.num_envs or defaults.get("num_envs", 256),
        window=args.window,
        end_prob=args.end_prob,
        seq_batch=args.seq_batch or defaults.get("seq_batch", 256),
        seq_length=args.seq_length,
        burn_in=args.burn_in,
    )
    if traj.seq_length > traj.window:
        raise SystemExit(f"{prog}: --seq-length {traj.seq_length} is longer than --window {traj.window}")
    return TrajectoryBenchConfig(
        **timing,
        ops=[op for op in TRAJ_OPS if op in args.ops],
        flat=not args.no_flat,
        traj=traj,
        max_fill_s=args.max_fill_s,
        deadline=None if args.deadline_s is None else time.monotonic() + args.deadline_s,
        out=Path(args.out),
        seed=args.seed,
        command=getattr(args, "command_line", ""),
    )


def run_trajectory(args: argparse.Namespace) -> int:
    """Exit status 1 if any call failed."""
    from gper.bench.trajectory_sweep import run

    rows = run(trajectory_config(args))
    return 1 if any(r.status == "error" for r in rows) else 0
