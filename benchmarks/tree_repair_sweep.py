# ruff: noqa: B023  (the closures are timed at once, inside their loop iteration)
"""The tree repair's variants on the GPU: update, add and PER step, level by level against the
climb (``gper.ops.tree.triton_climb``), at several capacities and batch sizes, each timed as a CUDA
graph of 20 calls (CUDA events, median of 25 replays); and the first call of each shape, which
compiles its kernels.

Developer tool for ``gper.ops.tree.triton.LAUNCH`` (``climb``, ``climb_min_batch``,
``climb_block``, ``add_block``); ``gper bench replay`` is the user-facing benchmark. Prints a
table headed by the GPU, versions and commit, and writes the same rows to
``benchmarks/results/tree-repair-<gpu>-<stamp>.csv`` and ``.md`` (or ``--out``).

    python benchmarks/tree_repair_sweep.py --capacities 16 20 25 --batches 256 16384
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.workload import SPEC, random_transitions
from gper.ops.tree import triton as tree_triton
from gper.replay.graphs import capture

COLUMNS = ["op", "capacity", "batch", "variant", "value", "unit"]
#: the variants: launch shapes set around each capture (graphs keep the shapes they were captured with)
VARIANTS = {
    "levels": {"climb": False},
    "climb": {"climb_min_batch": 1},
    "climb, 64 a program": {"climb_min_batch": 1, "climb_block": 64},
    "climb, 8 warps": {"climb_min_batch": 1, "climb_warps": 8},
    "shipped": {},
}


def graph_us(fn, calls: int = 20, replays: int = 25) -> float:
    """Median µs per call of ``fn`` replayed from one CUDA graph of ``calls`` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def first_call_s(capacity: int, arity: int) -> float:
    """Seconds of a fresh buffer's first add and update of 2048 (the kernels' compilation, if new)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    rb = gper.PrioritizedReplayBuffer(capacity, {"x": ((), torch.int32)}, device="cuda", arity=arity)
    rb.add({"x": torch.zeros(min(capacity, 2048), dtype=torch.int32, device="cuda")})
    rb.update_priorities(torch.zeros(2048, dtype=torch.int64, device="cuda"), torch.ones(2048, device="cuda"))
    torch.cuda.synchronize()
    return time.perf_counter() - t


def sweep_capacity(log2: int, batches: list[int], emit) -> None:
    """Every variant's update, add and step at 2^log2 slots (filled, random priorities)."""
    cap = 1 << log2
    # the buffer's own graphs off: the sweep captures its own, with each variant's shapes
    rb = gper.PrioritizedReplayBuffer(cap, SPEC, device="cuda", seed=0, cuda_graphs=False)
    for start in range(0, cap, 1 << 21):
        rb.add(random_transitions(min(1 << 21, cap - start), "cuda"))
    for _ in range(max(1, cap >> 20)):
        rb.update_priorities(torch.randint(0, cap, (1 << 20,), device="cuda"), torch.randn(1 << 20, device="cuda"))
    for b in batches:
        td, new = torch.randn(b, device="cuda"), random_transitions(b, "cuda")
        smp = rb.sample(b)
        row = {"capacity": f"2^{log2}", "batch": b}
        emit(
            {
                "op": "sample",
                **row,
                "variant": "shipped",
                "value": f"{graph_us(lambda: rb.sample(b)):.2f}",
                "unit": "us",
            }
        )
        for name, shapes in VARIANTS.items():
            with tree_triton.launch_config(**shapes):
                for op, fn in (
                    ("update", lambda: rb.update_priorities(smp, td)),
                    ("add", lambda: rb.add(new)),
                    ("step", lambda: rb.update_priorities(rb.sample(b), td)),
                ):
                    emit({"op": op, **row, "variant": name, "value": f"{graph_us(fn):.2f}", "unit": "us"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", type=int, nargs="+", default=[16, 20, 25], help="log2 capacities")
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 16384])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tree_repair_sweep.py times CUDA graphs: it needs a GPU", file=sys.stderr)
        return 2
    env = environment(torch.device("cuda"))
    print(header_line(env, "tree-repair sweep"), flush=True)
    files = ResultFiles(Path(args.out), env, COLUMNS, prefix="tree-repair")
    rows: list[dict[str, object]] = []

    def emit(row: dict[str, object]) -> None:
        rows.append(row)
        files.append([row])
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    for log2 in args.capacities:
        sweep_capacity(log2, args.batches, emit)
        torch.cuda.empty_cache()
    for cap, arity in ((1000, 32), (5000, 4), (100_000, 2)):
        emit(
            {
                "op": "first add + update (s)",
                "capacity": cap,
                "batch": 2048,
                "variant": f"arity {arity}",
                "value": f"{first_call_s(cap, arity):.2f}",
                "unit": "s",
            }
        )
    headers = COLUMNS
    table = [[str(r[c]) for c in COLUMNS] for r in rows]
    right = [False, True, True, False, True, False]
    print_table(headers, table, right)
    files.write_markdown(
        "\n".join(
            [
                "# Tree repair: level by level against the climb",
                "",
                header_line(env, "tree-repair sweep"),
                "",
                "Rows in us: one CUDA graph of 20 calls, median per call over 25 replays (CUDA events); rows in "
                "s: a fresh buffer's first add and update, wall time (the compilation of its kernels).",
                "",
                f"Command: `python benchmarks/tree_repair_sweep.py {shlex.join(argv or sys.argv[1:])}`",
                "",
                format_markdown(headers, table, right),
                "",
            ]
        )
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
