"""Run a function on W gloo processes of this host, bounded in time: a free loopback port, a
timeout on the join, and every process killed on the way out (a test fails, never hangs)."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world: int, port: int, args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world: int, *args, timeout: float = 120.0) -> None:
    """``fn(rank, world, *args)`` on ``world`` spawned processes in one gloo group; raises the first
    process's exception (with its traceback), or TimeoutError past ``timeout`` seconds."""
    args = (fn, world, free_port(), args)
    ctx = mp.start_processes(_entry, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} processes still running after {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
