"""What the ``gper bench`` subcommands' flags share: sizes, counts, the device and the results folder."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from gper._device import canonical_device
from gper.bench.report import DEFAULT_OUT

OUT_HELP = f"results directory (default {DEFAULT_OUT} under the working directory; the command prints where)"


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


def sizes_of(args: argparse.Namespace, prog: str) -> tuple[list[int] | None, list[int] | None]:
    """(``--capacities``, ``--batches``) as sizes, None where not given."""
    try:
        caps = parse_sizes(args.capacities, 40) if args.capacities else None
        batches = parse_sizes(args.batches, None) if args.batches else None
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"{prog}: {e}") from None
    return caps, batches


def device_of(request: str | None, prog: str) -> torch.device:
    try:
        return canonical_device(request)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"{prog}: --device: {e}") from None


def count(text: str) -> int:
    """``"2^30"``, ``"1e9"`` or ``"1000"`` as a number of draws."""
    t = text.replace("**", "^")
    try:
        return 2 ** int(t[2:]) if t.startswith("2^") else int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None


def add_sizes(p: argparse.ArgumentParser, capacities: str, batches: str) -> None:
    p.add_argument("--capacities", nargs="+", metavar="N", help=capacities)
    p.add_argument("--batches", nargs="+", metavar="B", help=batches)


def add_timing(p: argparse.ArgumentParser) -> None:
    """The flags of a timed sweep of buffer calls: device, back end, graphs, repeats, calls per repeat."""
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


def timing_settings(
    args: argparse.Namespace,
    prog: str,
    device: torch.device,
    defaults: tuple[tuple[int, ...], tuple[int, ...], int, float],
) -> dict[str, Any]:
    """The settings of a timed sweep (:class:`gper.bench.harness.TimedSweep`) from the flags of
    :func:`add_timing` and :func:`add_sizes`, the device's ``defaults`` (log2 capacities, batches,
    repeats, ms per repeat) filling what was not given; ``--graph`` off, with a line, off CUDA."""
    caps, batches, repeats, target_ms = defaults
    graph = device.type == "cuda" if args.graph is None else args.graph
    if graph and device.type != "cuda":
        print(f"{prog}: --graph needs CUDA; timing eager calls only", file=sys.stderr)
        graph = False
    capacities, batch_sizes = sizes_of(args, prog)
    return {
        "capacities": capacities or [2**k for k in caps],
        "batches": batch_sizes or list(batches),
        "device": device,
        "backend": args.backend,
        "graph": graph,
        "repeats": args.repeats or repeats,
        "iters": args.iters,
        "target_ms": target_ms,
    }
