# ruff: noqa: B023, E501  (closures are timed at once; long f-strings are table rows)
"""Sweep launch shapes of gper's Triton kernels on the GPU and time sample / update / add / step.

Developer tool for tuning ``gper.ops.tree.triton`` (``gper bench replay`` is the user-facing benchmark).
Launch shapes are set through ``tree_triton.launch_config`` (graphs captured inside keep them);
everything outside those blocks runs with the shipped shapes (``tree_triton.LAUNCH``). Prints one
line per variant and writes them to ``$OUT`` or ``benchmarks/results``.

    python benchmarks/kernel_sweep.py --capacity 25 --batch 16384
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch

import gper
from gper.bench.timing import capture_graph, time_fn
from gper.bench.workload import SPEC, random_transitions
from gper.ops.tree import triton as tree_triton
from gper.replay.tree import PriorityTree

DEV = "cuda"


def batch(n):
    return random_transitions(n, DEV)


def events(fn, iters=200, repeats=5):
    return time_fn(fn, iters=iters, repeats=repeats, device=DEV).median_us


def wall(fn, iters=200, repeats=5):
    """Host wall time per call, the GPU drained at the end of each repeat."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(out)


graph = capture_graph


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=25, help="log2 capacity")
    ap.add_argument("--batch", type=int, nargs="+", default=[16384, 256])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--direct", action="store_true", help="no internal CUDA graphs")
    args = ap.parse_args()
    cap = 1 << args.capacity
    # the swept kernels run in graphs this script captures: the buffer's own graphs stay off there,
    # or the warm-up calls of the first swept shape would capture them and later rows replay those
    rb = gper.PrioritizedReplayBuffer(cap, SPEC, device="cuda", seed=0, cuda_graphs=False)
    for start in range(0, cap, 1 << 21):
        rb.add(batch(min(1 << 21, cap - start)))
    for _ in range(cap // (1 << 20)):
        rb.update_priorities(torch.randint(0, cap, (1 << 20,), device="cuda"), torch.randn(1 << 20, device="cuda"))
    # the eager rows: the same contents in a buffer with its own graphs (unless --direct)
    eager_rb = gper.PrioritizedReplayBuffer(cap, SPEC, device="cuda", seed=0, cuda_graphs=not args.direct)
    eager_rb.load_state_dict(rb.state_dict())
    torch.cuda.synchronize()
    lines = [f"# kernel sweep: {torch.cuda.get_device_name()} torch {torch.__version__} capacity 2^{args.capacity}"]

    def emit(s):
        print(s, flush=True)
        lines.append(s)

    # host overhead of the building blocks of an eager call
    x = torch.zeros(16, device="cuda")
    emit(
        f"host: torch.empty {wall(lambda: torch.empty(16384, device='cuda')):.2f} us, "
        f"x.add_(1) {wall(lambda: x.add_(1)):.2f} us, x.copy_(y) {wall(lambda: x.copy_(x)):.2f} us"
    )
    g0 = graph(lambda: x.add_(1))
    emit(f"host: replay of a 1-kernel graph {wall(g0.replay):.2f} us")

    bare = PriorityTree(cap, tree_triton, torch.device("cuda")).state  # a bare launch's own cursor and size
    emit(
        f"host: triton add_positions launch {wall(lambda: tree_triton.add_positions(state=bare, n=256, skip=0)):.2f} us"
    )
    for cg in (False, True):
        r2 = gper.PrioritizedReplayBuffer(1 << 16, SPEC, device="cuda", cuda_graphs=cg)
        r2.add(batch(1 << 16))
        td2 = torch.randn(256, device="cuda")
        smp2 = r2.sample(256)
        emit(
            f"host: cuda_graphs={cg} sample(256) {wall(lambda: r2.sample(256)):.2f} us, "
            f"update(256) {wall(lambda: r2.update_priorities(smp2, td2)):.2f} us, "
            f"add(256) {wall(lambda: r2.add(batch(256))):.2f} us (incl. making the batch)"
        )

    for b in args.batch:
        td = torch.randn(b, device="cuda")
        new = batch(b)
        shipped = tree_triton.LAUNCH
        sb = [4, 8, 16, 32] if not args.quick else [shipped.sample_block]
        sw = [1, 2, 4] if not args.quick else [shipped.sample_warps]
        for blk, nw in itertools.product(sb, sw):
            with tree_triton.launch_config(sample_block=blk, sample_warps=nw):
                g = graph(lambda: rb.sample(b))
            emit(f"B={b} sample block={blk} warps={nw}: graph {events(g.replay):.2f} us")
        for ublk, blk, nw in itertools.product([64, 128, 256], [16, 32, 64], [1, 2, 4]):
            if args.quick and (ublk, nw) != (shipped.update_block, shipped.level_warps):
                continue
            smp = rb.sample(b)
            with tree_triton.launch_config(update_block=ublk, level_block=blk, level_warps=nw):
                g = graph(lambda: rb.update_priorities(smp, td))
            emit(f"B={b} update update_block={ublk} level_block={blk} warps={nw}: graph {events(g.replay):.2f} us")

        def step():
            s = eager_rb.sample(b)
            eager_rb.update_priorities(s, td)

        g = graph(step)
        emit(
            f"B={b} step: graph {events(g.replay):.2f} us, eager wall {wall(step):.2f} us, "
            f"eager events {events(step):.2f} us"
        )
        emit(f"B={b} sample eager wall {wall(lambda: eager_rb.sample(b)):.2f} us")
        smp = eager_rb.sample(b)
        emit(f"B={b} update eager wall {wall(lambda: eager_rb.update_priorities(smp, td)):.2f} us")
        emit(
            f"B={b} add eager wall {wall(lambda: eager_rb.add(new)):.2f} us, graph {events(graph(lambda: eager_rb.add(new)).replay):.2f} us"
        )
    out = os.environ.get("OUT") or "benchmarks/results"
    with open(os.path.join(out, f"kernel-sweep-2e{args.capacity}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
