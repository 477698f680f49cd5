"""The command line of ``gper bench``: its flags, their defaults per device, and ``main``.

Examples::

    gper bench                  # full sweep (GPU: 2^16..2^25, batches 256..16384)
    gper bench --quick          # a smoke run
    gper bench --train          # the DQN training step with replay vs from a fixed batch
    gper bench --capacities 20 25 --batches 16384 --impls gper seeds --no-graph
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from gper.bench.replay import IMPLS, BenchConfig, run
from gper.bench.workload import OPS

# (capacities as log2, batches, repeats, ms per repeat) by device and --quick
DEFAULTS = {
    ("cuda", False): ((16, 18, 20, 22, 24, 25), (256, 4096, 16384), 5, 20.0),
    ("cuda", True): ((16, 20, 25), (256, 16384), 3, 10.0),
    ("cpu", False): ((10, 14, 16), (256, 4096), 5, 10.0),
    ("cpu", True): ((10, 12), (256,), 2, 5.0),
}


def parse_sizes(tokens: list[str], log2_below: int | None) -> list[int]:
    """``["16,18", "2^20", "1000000"]`` -> sizes; numbers <= ``log2_below`` are powers of two."""
    out = []
    for tok in (t for token in tokens for t in token.replace(",", " ").split()):
        t = tok.replace("**", "^")
        try:
            v = 2 ** int(t[2:]) if t.startswith("2^") else int(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a size: {tok!r}") from None
        if log2_below is not None and 0 <= v <= log2_below and not t.startswith("2^"):
            v = 2**v
        if v < 1:
            raise argparse.ArgumentTypeError(f"sizes must be >= 1, got {tok!r}")
        out.append(v)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``gper bench``."""
    p.add_argument(
        "--capacities",
        nargs="+",
        metavar="N",
        help="buffer sizes: log2 sizes (numbers up to 40), 2^k or "
        "plain ints, space or comma separated (default on CUDA: 16 18 20 22 24 25; on CPU: 10 14 16)",
    )
    p.add_argument(
        "--batches", nargs="+", metavar="B", help="batch sizes (default on CUDA: 256 4096 16384; on CPU: 256 4096)"
    )
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument(
        "--backend", choices=("auto", "triton", "torch"), default="auto", help="gper back end (default auto)"
    )
    p.add_argument(
        "--graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time each call as a replayed CUDA graph (default: on with CUDA)",
    )
    p.add_argument("--repeats", type=int, help="timed repeats per measurement; the median is reported (default 5)")
    p.add_argument("--iters", type=int, help="calls per repeat (default: enough for a repeat of 10-20 ms)")
    p.add_argument("--impls", nargs="+", choices=tuple(IMPLS), default=list(IMPLS), help="what to time (default all)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="which calls to time (default all)")
    p.add_argument("--out", default="benchmarks/results", help="results directory (default benchmarks/results)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats: a smoke run")
    t = p.add_argument_group("training step (--train)")
    t.add_argument(
        "--train",
        action="store_true",
        help="time the DQN training step with replay against the same step from a fixed batch "
        "(first of --capacities and --batches; default on CUDA 2^24 and 16384, on CPU 2^14 and 256)",
    )
    t.add_argument("--hidden", nargs="+", type=int, help="hidden sizes (default on CUDA 512 512, on CPU 64 64)")
    t.add_argument(
        "--precisions",
        nargs="+",
        choices=("tf32", "fp32", "bf16"),
        help="matmul precisions (default on CUDA tf32 fp32 bf16; on CPU fp32)",
    )
    t.add_argument("--steps", type=int, help="training steps per timed repeat (default on CUDA 200, on CPU 10)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("gper bench: --device cuda, but torch sees no CUDA GPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    caps, batches, repeats, target_ms = DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    graph = device.type == "cuda" if args.graph is None else args.graph
    if graph and device.type != "cuda":
        print("gper bench: --graph needs CUDA; timing eager calls only", file=sys.stderr)
        graph = False
    try:
        capacities = parse_sizes(args.capacities, 40) if args.capacities else [2**k for k in caps]
        batch_sizes = parse_sizes(args.batches, None) if args.batches else list(batches)
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"gper bench: {e}") from None
    return BenchConfig(
        capacities=capacities,
        batches=batch_sizes,
        device=device,
        backend=args.backend,
        graph=graph,
        repeats=args.repeats or repeats,
        iters=args.iters,
        target_ms=target_ms,
        impls=list(dict.fromkeys(args.impls)),
        ops=[op for op in OPS if op in args.ops],
        out=Path(args.out),
        command=getattr(args, "command_line", ""),
    )


def train_config_from_args(args: argparse.Namespace):
    from gper.bench.train_step import TrainBenchConfig

    cfg = config_from_args(args)
    cuda = cfg.device.type == "cuda"
    try:
        capacity = parse_sizes(args.capacities, 40)[0] if args.capacities else (2**24 if cuda else 2**14)
        batch = parse_sizes(args.batches, None)[0] if args.batches else (16384 if cuda else 256)
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"gper bench: {e}") from None
    if batch > capacity:
        raise SystemExit(f"gper bench: batch {batch} is larger than the replay ({capacity})")
    if args.precisions and not cuda and set(args.precisions) != {"fp32"}:
        raise SystemExit("gper bench: --precisions tf32/bf16 need CUDA")
    return TrainBenchConfig(
        device=cfg.device,
        capacity=capacity,
        batch=batch,
        hidden=tuple(args.hidden) if args.hidden else ((512, 512) if cuda else (64, 64)),
        precisions=tuple(args.precisions) if args.precisions else (("tf32", "fp32", "bf16") if cuda else ("fp32",)),
        steps=args.steps or (200 if cuda else 10),
        repeats=args.repeats or (5 if cuda else 3),
        out=cfg.out,
    )


def main(args: argparse.Namespace) -> int:
    """Run ``gper bench``; exit status 1 if any gper call failed."""
    if args.train:
        from gper.bench.train_step import run_train_bench

        run_train_bench(train_config_from_args(args))
        return 0
    result = run(config_from_args(args))
    return 1 if any(r.status == "error" for r in result.rows) else 0
