"""The command line of ``gper bench``: its subcommands, their flags, their defaults per device, and ``main``.

Examples::

    gper bench replay               # gper vs the O(N) baselines (GPU: 2^16..2^25, batches 256..16384)
    gper bench replay --quick       # a smoke run
    gper bench replay --capacities 20 25 --batches 16384 --impls gper cumsum --no-graph
    gper bench peers --device cpu --threads 1           # gper vs TorchRL, cpprb, flashbax
    gper bench exactness --peers gper cpprb --budget-s 60
    gper bench train-step           # the DQN training step with replay vs from a fixed batch
    gper bench checkpoint           # save() / load() of a full 2^25 buffer: seconds and host memory
    gper bench trajectory           # the trajectory buffer beside the flat one: 1-/3-step samples, add, sequences

``gper bench [flags]`` is ``gper bench replay [flags]``, and ``gper bench --train [flags]`` is
``gper bench train-step [flags]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gper._device import canonical_device
from gper.bench.peers import canonical_name
from gper.bench.report import DEFAULT_OUT

#: subcommand -> one-line help
SUBCOMMANDS = {
    "replay": "time sample / update / add / step against the O(N) cumsum baseline and torch.multinomial",
    "peers": "time gper against TorchRL, cpprb, flashbax and the O(N) baselines on the reference workload",
    "exactness": "check each peer's sampler: every slot reachable, a 1e-6 leaf, 8 distinct leaves",
    "train-step": "time the DQN training step with replay against the same step from a fixed batch",
    "checkpoint": "time save() and load() of a full buffer, and the host memory they need, against torch.save",
    "trajectory": "time the trajectory buffer's 1-/3-step samples, steps, add and sequences beside the flat buffer's",
}
# replay: (capacities as log2, batches, repeats, ms per repeat) by device and --quick
REPLAY_DEFAULTS = {
    ("cuda", False): ((16, 18, 20, 22, 24, 25), (256, 4096, 16384), 5, 20.0),
    ("cuda", True): ((16, 20, 25), (256, 16384), 3, 10.0),
    ("cpu", False): ((10, 14, 16), (256, 4096), 5, 10.0),
    ("cpu", True): ((10, 12), (256,), 2, 5.0),
}
# peers: (capacities as log2, batches, repeats) by device and --quick
PEERS_DEFAULTS = {
    ("cuda", False): ((16, 20, 24, 25), (256, 16384), 7),
    ("cuda", True): ((16, 20), (256, 16384), 3),
    ("cpu", False): ((16, 20), (256, 16384), 5),
    ("cpu", True): ((12, 16), (256,), 2),
}
# trajectory: (capacities as log2, batches, repeats, ms per repeat) by device and --quick
TRAJ_DEFAULTS = {
    ("cuda", False): ((16, 18, 20, 22, 24, 25), (256, 16384), 5, 20.0),
    ("cuda", True): ((20, 24), (16384,), 3, 10.0),
    ("cpu", False): ((12, 14), (256,), 3, 10.0),
    ("cpu", True): ((12,), (64,), 2, 5.0),
}
# trajectory on the CPU: fewer streams and sequences, so small capacities hold a window
TRAJ_CPU = {"num_envs": 16, "seq_batch": 32}
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


def _sizes(args: argparse.Namespace, prog: str) -> tuple[list[int] | None, list[int] | None]:
    """(``--capacities``, ``--batches``) as sizes, None where not given."""
    try:
        caps = parse_sizes(args.capacities, 40) if args.capacities else None
        batches = parse_sizes(args.batches, None) if args.batches else None
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"{prog}: {e}") from None
    return caps, batches


def _device(request: str | None, prog: str) -> torch.device:
    try:
        return canonical_device(request)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"{prog}: --device: {e}") from None


def _count(text: str) -> int:
    """``"2^30"``, ``"1e9"`` or ``"1000"`` as a number of draws."""
    t = text.replace("**", "^")
    try:
        return 2 ** int(t[2:]) if t.startswith("2^") else int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None


def _add_sizes(p: argparse.ArgumentParser, capacities: str, batches: str) -> None:
    p.add_argument("--capacities", nargs="+", metavar="N", help=capacities)
    p.add_argument("--batches", nargs="+", metavar="B", help=batches)


# ----------------------------------------------------------------------------------------------
# gper bench replay


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.buffer_sweep import IMPLS, OPS

    _add_sizes(
        p,
        "buffer sizes: log2 sizes (numbers up to 40), 2^k or plain ints, space or comma separated "
        "(default on CUDA: 16 18 20 22 24 25; on CPU: 10 14 16)",
        "batch sizes (default on CUDA: 256 4096 16384; on CPU: 256 4096)",
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
    device = _device(args.device, prog)
    caps, batches, repeats, target_ms = REPLAY_DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    graph = device.type == "cuda" if args.graph is None else args.graph
    if graph and device.type != "cuda":
        print(f"{prog}: --graph needs CUDA; timing eager calls only", file=sys.stderr)
        graph = False
    capacities, batch_sizes = _sizes(args, prog)
    return BenchConfig(
        capacities=capacities or [2**k for k in caps],
        batches=batch_sizes or list(batches),
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


def run_replay(args: argparse.Namespace) -> int:
    """Exit status 1 if any call failed (gper's, or a baseline's other than a refusal)."""
    from gper.bench.buffer_sweep import run

    result = run(replay_config(args))
    return 1 if any(r.status == "error" for r in result.rows) else 0


# ----------------------------------------------------------------------------------------------
# gper bench train-step


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    _add_sizes(
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
        "--fused-step",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the trainer's fused step (gper train's default; --no-fused-step: the plain step): fused network "
        "forward, loss kernel, Adam kernels",
    )


def train_config(args: argparse.Namespace):
    from gper.bench.train_step import TrainBenchConfig

    prog = "gper bench train-step"
    device = _device(args.device, prog)
    cuda = device.type == "cuda"
    caps, batches = _sizes(args, prog)
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


def run_train(args: argparse.Namespace) -> int:
    from gper.bench.train_step import run_train_bench

    run_train_bench(train_config(args))
    return 0


# ----------------------------------------------------------------------------------------------
# gper bench peers


def add_peers_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.peers_sweep import ALL_OPS, PEERS, TRAJ_PEERS

    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    _add_sizes(
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
    device = _device(args.device, prog)
    caps, batches, repeats = PEERS_DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    capacities, batch_sizes = _sizes(args, prog)
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


# ----------------------------------------------------------------------------------------------
# gper bench exactness


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
    p.add_argument("--tiny-draws", type=_count, help="draws of the tiny-leaf check (default CUDA 2^32, CPU 2^30)")
    p.add_argument("--distinct-draws", type=_count, help="draws of the distinct check (default CUDA 2^26, CPU 2^24)")
    p.add_argument("--batch", type=_count, default=1 << 20, help="draws per call (default 2^20)")
    p.add_argument("--budget-s", type=float, help="seconds of drawing per check and peer (default CUDA 10, CPU 60)")
    p.add_argument("--deadline-s", type=float, help="start no check after this many seconds (report what ran)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=OUT_HELP)


def exactness_config(args: argparse.Namespace):
    from gper.bench.checks import ExactConfig

    device = _device(args.device, "gper bench exactness")
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


# ----------------------------------------------------------------------------------------------
# gper bench checkpoint


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
    device = _device(args.device, prog)
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


# ----------------------------------------------------------------------------------------------
# gper bench trajectory


def add_trajectory_arguments(p: argparse.ArgumentParser) -> None:
    from gper.bench.peers.base import TRAJ_OPS

    _add_sizes(
        p,
        "buffer sizes: log2 sizes (numbers up to 40), 2^k or plain ints (default on CUDA: 16 18 20 22 24 25; "
        "on CPU: 12 14); a size must hold num_envs streams of window + 2 rows",
        "batch sizes of the samples and steps (default on CUDA: 256 16384; on CPU: 256)",
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
    device = _device(args.device, prog)
    cuda = device.type == "cuda"
    caps, batches, repeats, target_ms = TRAJ_DEFAULTS[("cuda" if cuda else "cpu", args.quick)]
    graph = cuda if args.graph is None else args.graph
    if graph and not cuda:
        print(f"{prog}: --graph needs CUDA; timing eager calls only", file=sys.stderr)
        graph = False
    capacities, batch_sizes = _sizes(args, prog)
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
        capacities=capacities or [2**k for k in caps],
        batches=batch_sizes or list(batches),
        device=device,
        backend=args.backend,
        graph=graph,
        repeats=args.repeats or repeats,
        iters=args.iters,
        target_ms=target_ms,
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


# ----------------------------------------------------------------------------------------------
# dispatch

_PARTS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "replay": (add_replay_arguments, run_replay),
    "peers": (add_peers_arguments, run_peers),
    "exactness": (add_exactness_arguments, run_exactness),
    "train-step": (add_train_arguments, run_train),
    "checkpoint": (add_checkpoint_arguments, run_checkpoint),
    "trajectory": (add_trajectory_arguments, run_trajectory),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gper bench",
        description="Benchmarks of gper. Without a subcommand, `gper bench [flags]` runs `gper bench replay "
        "[flags]`, and `gper bench --train [flags]` runs `gper bench train-step [flags]`.",
    )
    sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for name, help_text in SUBCOMMANDS.items():
        add, run = _PARTS[name]
        p = sub.add_parser(name, help=help_text, description=f"gper bench {name}: {help_text}")
        add(p)
        p.set_defaults(_run=run)
    return parser


def resolve_aliases(argv: list[str]) -> list[str]:
    """``[flags]`` -> ``["replay", *flags]``; ``["--train", *flags]`` -> ``["train-step", *flags]``."""
    if argv and (argv[0] in SUBCOMMANDS or argv[0] in ("-h", "--help")):
        return argv
    if "--train" in argv:
        return ["train-step", *(a for a in argv if a != "--train")]
    return ["replay", *argv]


def main(argv: list[str]) -> int:
    """Run ``gper bench`` with the rest of the command line; the subcommand's exit status."""
    args = build_parser().parse_args(resolve_aliases(list(argv)))
    args.command_line = " ".join(["gper", "bench", *argv])
    if getattr(args, "out", None):  # say where the files go before the (long) run starts
        print(f"gper bench: result files go to {Path(args.out).resolve()} (--out DIR to change)", flush=True)
    return int(args._run(args) or 0)
