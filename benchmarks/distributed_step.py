"""The PER step (sample + priority update) of the sharded replay against one buffer, under torchrun.

Every rank builds a shard of ``--capacity`` slots filled with the reference transitions (51-float
observations), then times, in lockstep on every rank (the calls are collectives): one buffer
(``gper.PrioritizedReplayBuffer``, this rank's alone), the sharded buffer in ``exact`` mode and in
``local`` mode, each eagerly and (on CUDA) captured in a CUDA graph, at ``--batch`` draws per rank.
The difference to one buffer is what the collectives cost. Iterations are fixed (not calibrated)
so that every rank makes the same calls. Rank 0 prints the table and writes the result files.

    torchrun --nproc-per-node 1 benchmarks/distributed_step.py --capacity 24 --batch 16384   # NCCL on a GPU
    torchrun --nproc-per-node 2 benchmarks/distributed_step.py --device cpu --capacity 12 --batch 256

Writes ``benchmarks/results/distributed-step-<device>-w<world>-<stamp>.{md,csv}``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import Timing, time_fn, time_graph
from gper.bench.workload import SPEC, random_td, random_transitions
from gper.distributed import ShardedPrioritizedReplayBuffer

COLUMNS = ["world", "capacity_per_rank", "batch_per_rank", "buffer", "how", "median_us", "min_us", "max_us", "note"]


def fill(rb, n: int, device: torch.device, seed: int) -> None:
    g = torch.Generator(device=device).manual_seed(seed)
    for start in range(0, n, 2**16):
        rb.add(random_transitions(min(2**16, n - start), device, g))


def step_fn(rb, b: int, td: torch.Tensor):
    def step() -> None:
        batch = rb.sample(b)
        rb.update_priorities(batch, td)

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=20, help="log2 of the slots per rank")
    p.add_argument("--batch", type=int, default=16384, help="draws per rank and step")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=200, help="steps per timed repeat (the same on every rank)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _run(args, cuda)
    finally:
        dist.destroy_process_group()


def _run(args: argparse.Namespace, cuda: bool) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    cap, b = 2**args.capacity, args.batch
    env = dict(environment(device))
    env["slug"] = f"{env['slug']}-w{world}"
    what = f"distributed PER step, world {world}, 2^{args.capacity} slots and B = {b} a rank"
    if rank == 0:
        print(header_line(env, what))
    td = random_td(b, device, torch.Generator(device=device).manual_seed(1)).abs()
    buffers = {
        "one buffer": gper.PrioritizedReplayBuffer(cap, SPEC, device=device, seed=rank),
        "sharded exact": ShardedPrioritizedReplayBuffer(cap * world, SPEC, mode="exact", device=device, seed=0),
        "sharded local": ShardedPrioritizedReplayBuffer(cap * world, SPEC, mode="local", device=device, seed=0),
    }
    rows = []
    for name, rb in buffers.items():
        fill(rb, cap, device, seed=rank)
        step = step_fn(rb, b, td)
        ways = [("eager", lambda s=step: time_fn(s, warmup=5, iters=args.iters, repeats=args.repeats, device=device))]
        if cuda:
            ways.append(("graph", lambda s=step: time_graph(s, warmup=5, iters=args.iters, repeats=args.repeats)))
        for how, timed in ways:
            note = ""
            try:
                t: Timing | None = timed()
            except Exception as err:  # a capture the collectives refuse: say so, go on
                t, note = None, f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
            dist.barrier()
            rows.append(
                {
                    "world": world,
                    "capacity_per_rank": f"2^{args.capacity}",
                    "batch_per_rank": b,
                    "buffer": name,
                    "how": how,
                    "median_us": None if t is None else round(t.median_us, 2),
                    "min_us": None if t is None else round(t.min_us, 2),
                    "max_us": None if t is None else round(t.max_us, 2),
                    "note": note,
                }
            )
        del rb
    if rank == 0:
        files = ResultFiles(Path(args.out), env, COLUMNS, prefix="distributed-step")
        files.append(rows)
        headers = ["buffer", "how", "median us", "min us", "max us", "note"]
        table = [
            [r["buffer"], r["how"], *(str(r[k]) for k in ("median_us", "min_us", "max_us")), r["note"]] for r in rows
        ]
        right = [False, False, True, True, True, False]
        print_table(headers, table, right)
        files.write_markdown(
            "\n".join([f"# {what}", "", header_line(env, what), "", format_markdown(headers, table, right), ""])
        )
        print(f"wrote {files.csv_path} and {files.md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
