"""``gper bench train-step``: the DQN training step with replay against a fixed batch (:mod:`gper.bench.train_step`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gper.bench.flags import OUT_HELP, add_sizes, device_of, sizes_of
from gper.bench.report import DEFAULT_OUT


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_sizes(
        p,
        "replay size: the first of these (log2 up to 40, 2^k or plain ints; default on CUDA 2^24, on CPU 2^14)",
        "batch size: the first of these (default on CUDA 16384, on CPU 256)",
    )
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument("--hidden", nargs="+", type=int, help="hidden sizes (default on CUDA 512 512, on CPU 64 64)")
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=("tf32", "fp32", "bf16"),
        help="matmul precisions (default on CUDA tf32 fp32 bf16; on CPU fp32)",
    )
    p.add_argument("--steps", type=int, help="training steps per timed repeat (default on CUDA 200, on CPU 10)")
    p.add_argument("--repeats", type=int, help="timed repeats; the median is reported (default on CUDA 5, on CPU 3)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: the first precision only, 20 steps x 2 repeats (on CUDA; on the CPU 5 x 2)",
    )
    p.add_argument(
        "--population",
        nargs="+",
        type=int,
        metavar="N",
        help="instead: the cartpole-sized iteration (collect + learn) of populations of N agents (gper train "
        "--population N) beside the single agent, timed from CUDA graphs, with each phase's launches counted and "
        "timed (torch.profiler) and the costliest kernels listed; e.g. --population 1 16 64 256. It takes the "
        "cartpole preset's sizes, and --hidden, one --precisions value and --fused-step",
    )
    p.add_argument(
        "--fused-step",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the trainer's fused step (gper train's default; --no-fused-step: the plain step): fused network "
        "forward, loss kernel, Adam kernels",
    )


def train_config(args: argparse.Namespace):
    from gper.bench.train_step import TrainBenchConfig

    prog = "gper bench train-step"
    device = device_of(args.device, prog)
    cuda = device.type == "cuda"
    caps, batches = sizes_of(args, prog)
    capacity = caps[0] if caps else (2**24 if cuda else 2**14)
    batch = batches[0] if batches else (16384 if cuda else 256)
    if batch > capacity:
        raise SystemExit(f"{prog}: batch {batch} is larger than the replay ({capacity})")
    if args.precisions and not cuda and set(args.precisions) != {"fp32"}:
        raise SystemExit(f"{prog}: --precisions tf32/bf16 need CUDA")
    precisions = tuple(args.precisions) if args.precisions else (("tf32", "fp32", "bf16") if cuda else ("fp32",))
    steps, repeats = (200, 5) if cuda else (10, 3)
    if args.quick:
        precisions, steps, repeats = precisions[:1], (20 if cuda else 5), 2
    return TrainBenchConfig(
        device=device,
        capacity=capacity,
        batch=batch,
        hidden=tuple(args.hidden) if args.hidden else ((512, 512) if cuda else (64, 64)),
        precisions=precisions,
        steps=args.steps or steps,
        repeats=args.repeats or repeats,
        fused_step=args.fused_step,
        out=Path(args.out),
    )


def population_config(args: argparse.Namespace):
    from gper.bench.population_step import PopulationBenchConfig

    prog = "gper bench train-step --population"
    if any(n < 1 for n in args.population):
        raise SystemExit(f"{prog}: every N must be >= 1, got {args.population}")
    device = device_of(args.device, prog)
    cuda = device.type == "cuda"
    if args.precisions and len(args.precisions) != 1:
        raise SystemExit(f"{prog}: times gper train's step at one precision: give --precisions one value")
    if args.precisions and not cuda and args.precisions != ["fp32"]:
        raise SystemExit(f"{prog}: --precisions tf32/bf16 need CUDA")
    overrides = {"fused_step": args.fused_step} | ({"precision": args.precisions[0]} if args.precisions else {})
    if args.hidden:
        overrides["hidden"] = tuple(args.hidden)
    steps, repeats = (200, 5) if cuda else (5, 2)
    if args.quick:
        steps, repeats = (20 if cuda else 2), 2
    return PopulationBenchConfig(
        device=device,
        agents=tuple(args.population),
        steps=args.steps or steps,
        repeats=args.repeats or repeats,
        out=Path(args.out),
        overrides=overrides,
    )


def run_train(args: argparse.Namespace) -> int:
    if args.population:
        from gper.bench.population_step import run_population_bench

        run_population_bench(population_config(args))
        return 0
    from gper.bench.train_step import run_train_bench

    run_train_bench(train_config(args))
    return 0
