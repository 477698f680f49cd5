"""``gper bench trainers``: PureJaxRL's DQN beside ``gper train`` on CartPole-v1 (:mod:`gper.bench.trainers`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gper.bench.flags import OUT_HELP
from gper.bench.report import DEFAULT_OUT

TRAINERS = ("purejaxrl", "gper")


def add_trainers_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[1, 16, 64, 256],
        help="seed counts (default 1 16 64 256): PureJaxRL runs each as one jax.vmap, gper as one population "
        "(gper train --population N)",
    )
    p.add_argument(
        "--preset-seeds",
        nargs="+",
        type=int,
        help="seed counts of gper's cartpole-preset rows (default: --seeds); gper's rows at PureJaxRL's "
        "settings run at --seeds",
    )
    p.add_argument("--device", default="auto", help="gper's device: cuda, cuda:N, cpu or auto (JAX picks its own)")
    p.add_argument(
        "--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS), help="which trainers to run (default both)"
    )
    p.add_argument(
        "--total-steps",
        type=int,
        help="env steps per seed for every trainer (a smoke run; default: PureJaxRL's 500,000 and gper's preset)",
    )
    p.add_argument(
        "--worker-timeout-s",
        type=float,
        default=540.0,
        help="stop the PureJaxRL worker after this many seconds (default 540); the seed counts it finished stay",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)


def trainers_config(args: argparse.Namespace):
    from gper.bench.trainers.run import TrainersBenchConfig

    prog = "gper bench trainers"
    if any(n < 1 for n in args.seeds):
        raise SystemExit(f"{prog}: --seeds must be >= 1, got {args.seeds}")
    if args.preset_seeds is not None and any(n < 1 for n in args.preset_seeds):
        raise SystemExit(f"{prog}: --preset-seeds must be >= 1, got {args.preset_seeds}")
    if args.total_steps is not None and args.total_steps < 1:
        raise SystemExit(f"{prog}: --total-steps must be >= 1, got {args.total_steps}")
    return TrainersBenchConfig(
        seeds=tuple(args.seeds),
        preset_seeds=tuple(args.preset_seeds) if args.preset_seeds is not None else None,
        device=args.device,
        out=Path(args.out),
        total_steps=args.total_steps,
        worker_timeout_s=args.worker_timeout_s,
        trainers=tuple(dict.fromkeys(args.trainers)),
        command=getattr(args, "command_line", ""),
    )


def run_trainers(args: argparse.Namespace) -> int:
    """Exit status 1 if a row of a trainer that could run failed (a skipped trainer is not a failure)."""
    from gper.bench.trainers.run import run_trainers_bench

    rows = run_trainers_bench(trainers_config(args))
    return 1 if any(str(r.get("status", "")).startswith("error") for r in rows) else 0
