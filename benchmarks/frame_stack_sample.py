"""Time sampling stacked Atari-shaped transitions: frames stored once and stacked at sample time,
against the flat buffer that stores both four-frame stacks of every transition.

Buffers (every one prioritized, proportional, filled with random 84 x 84 uint8 frames; episodes
end with probability ``--p-end`` a step, so some stacks hold zeros before an episode's start):

| variant | buffer | a transition holds |
| --- | --- | --- |
| ``stacked`` | ``TrajectoryReplayBuffer(..., frame_stack=4)``, obs ``(84, 84)`` uint8 | one frame, its fields |
| ``one-frame`` | the same buffer with ``frame_stack=1``: one frame a draw, no stack | the same |
| ``flat`` | ``PrioritizedReplayBuffer``, obs and next_obs ``(4, 84, 84)`` uint8 | both stacks: 56 KB |

Each ``sample(B, n_step=n, gamma=0.99)`` is timed as a captured CUDA graph
(``gper.bench.timing.time_graph``: replays timed with CUDA events, the median of the repeats).
The flat buffer has no n-step sampling: its rows are for ``n_step`` 1. ``bytes/transition`` is
the buffer's ``nbytes_estimate`` over its capacity (rows, tree and indices); ``x_flat`` is a
row's median over the flat buffer's at the same batch. ``--sample-words`` sets how many row words
a sampling program holds (``LaunchConfig.sample_words`` of ``gper.ops.tree.triton``: rows as wide
as a frame take fewer draws a program; a large value gives every program 16 draws).

    python benchmarks/frame_stack_sample.py                       # 10^6 transitions, B = 256 and 4096
    python benchmarks/frame_stack_sample.py --device cpu --capacity 4096 --batches 32 --flat-capacity 4096

Writes ``benchmarks/results/frame-stack-sample-<device>-<stamp>.{csv,md}`` and prints the same table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from functools import partial
from pathlib import Path

import torch

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import Timing, time_fn, time_graph

COLUMNS = ["variant", "capacity", "batch", "n_step", "bytes_per_transition", "median_us", "min_us", "max_us", "x_flat"]
FRAME = (84, 84)
STACK = 4


def trajectory_buffer(args, device: torch.device, frame_stack: int) -> gper.TrajectoryReplayBuffer:
    spec = {"obs": (FRAME, torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}
    return gper.TrajectoryReplayBuffer(
        args.capacity, args.num_envs, spec, window=3, frame_stack=frame_stack, device=device, seed=args.seed
    )


def fill_trajectory(rb: gper.TrajectoryReplayBuffer, args, device: torch.device) -> None:
    """Every stream's ring filled with random frames, then random priorities on the drawable starts."""
    g = torch.Generator(device=device).manual_seed(args.seed)
    e = args.num_envs
    obs = torch.randint(0, 256, (e, *FRAME), dtype=torch.uint8, device=device, generator=g)
    for _ in range(args.capacity // e + 4):
        nxt = torch.randint(0, 256, (e, *FRAME), dtype=torch.uint8, device=device, generator=g)
        ended = torch.rand(e, device=device, generator=g) < args.p_end
        step = {
            "obs": obs,
            "action": torch.randint(0, 6, (e,), device=device, generator=g),
            "reward": torch.randn(e, device=device, generator=g),
            "next_obs": nxt,
            "terminated": ended,
            "truncated": torch.zeros_like(ended),
        }
        rb.add(step)
        fresh = torch.randint(0, 256, (e, *FRAME), dtype=torch.uint8, device=device, generator=g)
        obs = torch.where(ended[:, None, None], fresh, nxt)
    random_priorities(rb, rb.drawable().nonzero().squeeze(1), device)


def random_priorities(rb, idx: torch.Tensor, device: torch.device) -> None:
    g = torch.Generator(device=device).manual_seed(1)
    size = min(2**18, idx.numel())
    for lo in range(0, idx.numel() - size + 1, size):
        rb.update_priorities(idx[lo : lo + size], 10.0 ** (torch.rand(size, device=device, generator=g) * 4 - 2))


def flat_buffer(args, device: torch.device) -> gper.PrioritizedReplayBuffer:
    stack = ((STACK, *FRAME), torch.uint8)
    spec = {"obs": stack, "next_obs": stack, "action": ((), torch.int64), "reward": ((), torch.float32)}
    spec["done"] = ((), torch.float32)
    rb = gper.PrioritizedReplayBuffer(args.flat_capacity, spec, device=device, seed=args.seed)
    chunk = 4096
    g = torch.Generator(device=device).manual_seed(args.seed)
    for _ in range(args.flat_capacity // chunk):
        rb.add({n: random_field(chunk, s, d, device, g) for n, (s, d) in spec.items()})
    random_priorities(rb, torch.arange(args.flat_capacity, device=device), device)
    return rb


def random_field(n: int, shape: tuple, dtype: torch.dtype, device: torch.device, g) -> torch.Tensor:
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n, *shape), dtype=dtype, device=device, generator=g)
    if dtype == torch.int64:
        return torch.randint(0, 6, (n, *shape), device=device, generator=g)
    return torch.rand(n, *shape, device=device, generator=g)


def timed(fn, device: torch.device, args) -> Timing:
    if device.type == "cuda":
        return time_graph(fn, repeats=args.repeats, target_ms=args.target_ms)
    return time_fn(fn, repeats=args.repeats, target_ms=args.target_ms, device=device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--capacity", type=int, default=1_000_000, help="transitions of the trajectory buffers")
    p.add_argument("--flat-capacity", type=int, default=2**18, help="transitions of the flat buffer (56 KB each)")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--batches", nargs="+", type=int, default=[256, 4096])
    p.add_argument("--n-steps", nargs="+", type=int, default=[1, 3])
    p.add_argument("--p-end", type=float, default=0.002, help="probability an episode ends at a step")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--target-ms", type=float, default=20.0, help="length of one timed repeat")
    p.add_argument("--sample-words", type=int, default=None, help="LAUNCH.sample_words for the draws (default: gper's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.sample_words is not None:  # graphs keep the launch shapes they were captured with
        from gper.ops.tree.triton import LAUNCH

        LAUNCH.sample_words = args.sample_words
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    env_info = environment(device)
    what = "frame stack sample" + ("" if device.type == "cuda" else " (eager: no CUDA graphs on the CPU)")
    print(header_line(env_info, what))
    files = ResultFiles(Path(args.out), env_info, COLUMNS, prefix="frame-stack-sample")
    rows: list[dict] = []

    def record(variant: str, rb, b: int, n: int, t: Timing) -> None:
        flat = next((r for r in rows if (r["variant"], r["batch"]) == ("flat", b)), None)
        row = {
            "variant": variant,
            "capacity": rb.capacity,
            "batch": b,
            "n_step": n,
            "bytes_per_transition": round(rb.nbytes_estimate / rb.capacity),
            "median_us": round(t.median_us, 2),
            "min_us": round(t.min_us, 2),
            "max_us": round(t.max_us, 2),
            "x_flat": round(t.median_us / flat["median_us"], 3) if flat else None,
        }
        rows.append(row)
        files.append([row])
        print(f"  {variant} B={b} n={n}: {t.median_us:.1f} us", flush=True)

    t0 = time.perf_counter()
    rb = flat_buffer(args, device)
    print(f"flat: {args.flat_capacity:,} transitions filled in {time.perf_counter() - t0:.1f} s")
    for b in args.batches:
        record("flat", rb, b, 1, timed(partial(rb.sample, b), device, args))
    del rb
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for variant, frame_stack in (("stacked", STACK), ("one-frame", 1)):
        t0 = time.perf_counter()
        rb = trajectory_buffer(args, device, frame_stack)
        fill_trajectory(rb, args, device)
        print(f"{variant}: {args.capacity:,} transitions filled in {time.perf_counter() - t0:.1f} s")
        for b in args.batches:
            for n in args.n_steps:
                draw = partial(rb.sample, b, n_step=n, gamma=0.99)
                record(variant, rb, b, n, timed(draw, device, args))
        del rb
        if device.type == "cuda":
            torch.cuda.empty_cache()

    headers = ["variant", "capacity", "batch", "n_step", "bytes/transition", "median us", "min us", "max us", "x flat"]
    table = [["" if r[k] is None else f"{r[k]:,}" if k == "capacity" else str(r[k]) for k in COLUMNS] for r in rows]
    right = [False] + [True] * 8
    print()
    print_table(headers, table, right)
    command = shlex.join(sys.argv[1:] if argv is None else argv)
    files.write_markdown(
        "\n".join(
            [
                "# Frame stacks: sampling stacked 84 x 84 transitions, frames stored once against both stacks stored",
                "",
                header_line(env_info, what),
                "",
                f"Command: `python benchmarks/frame_stack_sample.py {command}`",
                "",
                f"{args.num_envs} streams, episodes ending with probability {args.p_end} a step; times in microseconds "
                "per call" + (", CUDA-graph replays timed with CUDA events" if device.type == "cuda" else ", eager"),
                "",
                format_markdown(headers, table, right),
                "",
            ]
        )
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
