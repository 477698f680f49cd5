"""``gper bench replay``: gper against the O(N) baselines (:mod:`gper.bench.buffer_sweep`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gper.bench.flags import OUT_HELP, add_sizes, add_timing, device_of, timing_settings
from gper.bench.peers import canonical_name
from gper.bench.report import DEFAULT_OUT

REPLAY_DEFAULTS = {
    ("cuda", False): ((16, 18, 20, 22, 24, 25), (256, 4096, 16384), 5, 20.0),
    ("cuda", True): ((16, 20, 25), (256, 16384), 3, 10.0),
    ("cpu", False): ((10, 14, 16), (256, 4096), 5, 10.0),
    ("cpu", True): ((10, 12), (256,), 2, 5.0),
}


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.buffer_sweep import IMPLS, OPS

    add_sizes(
        p,
        "buffer sizes: log2 sizes (numbers up to 40), 2^k or plain ints, space or comma separated "
        "(default on CUDA: 16 18 20 22 24 25; on CPU: 10 14 16)",
        "batch sizes (default on CUDA: 256 4096 16384; on CPU: 256 4096)",
    )
    add_timing(p)
    p.add_argument(
        "--impls",
        nargs="+",
        type=canonical_name,
        choices=tuple(IMPLS),
        default=list(IMPLS),
        help="what to time (default all)",
    )
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="which calls to time (default all)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats: a smoke run")


def replay_config(args: argparse.Namespace):
    from gper.bench.buffer_sweep import OPS, BenchConfig

    prog = "gper bench replay"
    device = device_of(args.device, prog)
    defaults = REPLAY_DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    return BenchConfig(
        **timing_settings(args, prog, device, defaults),
        impls=list(dict.fromkeys(args.impls)),
        ops=[op for op in OPS if op in args.ops],
        out=Path(args.out),
        command=getattr(args, "command_line", ""),
    )


def run_replay(args: argparse.Namespace) -> int:
    """Exit status 1 if any call failed (gper's, or a baseline's other than a refusal)."""
    from gper.bench.buffer_sweep import run

    result = run(replay_config(args))
    return 1 if any(r.status == "error" for r in result.rows) else 0
