"""``gper bench checkpoint``: save() and load() of a full buffer (:mod:`gper.bench.buffer_files`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gper.bench.flags import OUT_HELP, device_of, parse_sizes
from gper.bench.report import DEFAULT_OUT


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument(
        "--capacities",
        nargs="+",
        default=None,
        help="log2 sizes (or 2^k, or slot counts above 40); default CUDA: 20 25, CPU: 16 20",
    )
    p.add_argument("--folder", default="bench-checkpoint-files", help="where to write the files (deleted after)")
    p.add_argument("--no-torch-save", action="store_true", help="do not time torch.save / torch.load for comparison")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)


def run_checkpoint(args: argparse.Namespace) -> int:
    from gper.bench.buffer_files import CheckpointBenchConfig, run_checkpoint_bench

    prog = "gper bench checkpoint"
    device = device_of(args.device, prog)
    default = (20, 25) if device.type == "cuda" else (16, 20)
    capacities = parse_sizes(args.capacities, 40) if args.capacities else [2**k for k in default]
    cfg = CheckpointBenchConfig(
        capacities=capacities,
        device=device,
        folder=Path(args.folder),
        out=Path(args.out),
        torch_save=not args.no_torch_save,
        command=getattr(args, "command_line", ""),
    )
    run_checkpoint_bench(cfg)
    return 0
