"""``gper bench exactness``: each peer's sampler checked (:mod:`gper.bench.exactness`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gper.bench.flags import OUT_HELP, count, device_of
from gper.bench.peers import canonical_name
from gper.bench.report import DEFAULT_OUT


def add_exactness_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.checks import CHECKS
    from gper.bench.exactness import PEERS

    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument(
        "--peers",
        nargs="+",
        type=canonical_name,
        choices=PEERS,
        default=list(PEERS),
        help="whose samplers (default all)",
    )
    p.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    p.add_argument("--reach-log2", type=int, help="slots of the reach check (default CUDA 25, CPU 22)")
    p.add_argument("--reach-per-slot", type=float, default=1.0, help="draws per slot in the reach check (1)")
    p.add_argument("--tiny-draws", type=count, help="draws of the tiny-leaf check (default CUDA 2^32, CPU 2^30)")
    p.add_argument("--distinct-draws", type=count, help="draws of the distinct check (default CUDA 2^26, CPU 2^24)")
    p.add_argument("--batch", type=count, default=1 << 20, help="draws per call (default 2^20)")
    p.add_argument("--budget-s", type=float, help="seconds of drawing per check and peer (default CUDA 10, CPU 60)")
    p.add_argument("--deadline-s", type=float, help="start no check after this many seconds (report what ran)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)


def exactness_config(args: argparse.Namespace):
    from gper.bench.checks import ExactConfig

    device = device_of(args.device, "gper bench exactness")
    cuda = device.type == "cuda"
    return ExactConfig(
        device=device,
        peers=list(dict.fromkeys(args.peers)),
        reach_log2=args.reach_log2 or (25 if cuda else 22),
        reach_per_slot=args.reach_per_slot,
        tiny_draws=int(args.tiny_draws or (2**32 if cuda else 2**30)),
        distinct_draws=int(args.distinct_draws or (2**26 if cuda else 2**24)),
        batch=args.batch,
        budget_s=args.budget_s or (10.0 if cuda else 60.0),
        out=Path(args.out),
        checks=tuple(dict.fromkeys(args.checks)),
        deadline=None if args.deadline_s is None else time.monotonic() + args.deadline_s,
        command=getattr(args, "command_line", ""),
    )


def run_exactness(args: argparse.Namespace) -> int:
    """Exit status 1 if a check of gper's could not run."""
    from gper.bench.exactness import run

    results = run(exactness_config(args))
    return 1 if any(r.verdict.startswith("error") for r in results if r.peer.startswith("gper")) else 0
