"""A PER step (sample + update) of a buffer of N instances against one instance, in CUDA graphs.

For N in ``--instances`` (default 1 16 64 256): a ``PrioritizedReplayBuffer(capacity,
instances=N)`` filled with random transitions of the reference workload's row (51-float
observations), then ``sample(B)`` + ``update_priorities`` captured in one graph and timed by
replays (median of repeats, CUDA events: :func:`gper.bench.timing.time_graph`). The single buffer
(``instances=None``) is timed the same way as the baseline, twice (its spread). Prints a table
headed by the GPU, versions and commit, and writes it under ``--out``.

    python benchmarks/instances_step.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import time_graph

SPEC = {
    "obs": ((51,), torch.float32),
    "next_obs": ((51,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
    "done": ((), torch.float32),
}


def filled(capacity: int, n: int | None) -> gper.PrioritizedReplayBuffer:
    lead = () if n is None else (n,)
    rb = gper.PrioritizedReplayBuffer(capacity, SPEC, instances=n, device="cuda")
    chunk = min(capacity, 2**14)
    for _ in range(capacity // chunk):
        rb.add({k: torch.randn(*lead, chunk, *s, device="cuda").to(d) for k, (s, d) in SPEC.items()})
    return rb


def step_time(rb: gper.PrioritizedReplayBuffer, b: int, n: int | None) -> float:
    td = torch.rand(*((n,) if n else ()), b, device="cuda")

    def step() -> None:
        batch = rb.sample(b)
        rb.update_priorities(batch, td)

    return time_graph(step, repeats=7).median_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=2**16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    env = environment(torch.device("cuda"))
    base = step_time(filled(args.capacity, None), args.batch, None)
    again = step_time(filled(args.capacity, None), args.batch, None)
    rows = [["single buffer", "-", f"{base:.1f}", "1.00", f"{base:.1f}", f"{again:.1f}"]]
    for n in args.instances:
        rb = filled(args.capacity, n)
        t = step_time(rb, args.batch, n)
        rows.append([f"instances={n}", str(n), f"{t:.1f}", f"{t / base:.2f}", f"{t / n:.2f}", ""])
        del rb
        torch.cuda.empty_cache()
    headers = ["buffer", "N", "step µs (graph)", "× single", "µs per instance", "single again µs"]
    right = [False, True, True, True, True, True]
    title = f"PER step, capacity {args.capacity} per instance, B = {args.batch} per instance"
    print(header_line(env, "instances step"))
    print_table(headers, rows, right, title)
    files = ResultFiles(args.out, env, None, prefix="instances-step")
    table = format_markdown(headers, rows, right)
    files.write_markdown(f"{header_line(env, 'instances step')}\n\n{title}\n\n{table}\n")
    print(f"wrote {files.path('.md')}")


if __name__ == "__main__":
    main()
