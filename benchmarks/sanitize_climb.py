"""A target for ``compute-sanitizer`` on the tree repair: contended updates (the climb), wrapping
adds with a bool field, samples, and a trajectory buffer's adds, on the GPU.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_climb.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_climb.py

``--instances [--n N]``: the same on a buffer of ``instances=N`` (default 16; the batched launches of
``gper.ops.tree.triton_instances``: contended climbs in every instance at once, wrapping adds,
samples in every mode), instead of the single buffers.
"""

from __future__ import annotations

import argparse

import torch

import gper


def instances(n: int = 16) -> None:
    """Contended batched updates (the climb: 16384 entries an instance on 500 slots), wrapping
    batched adds with a bool field and batched samples, for arity 4 and 32 and every mode."""
    spec = {"x": ((), torch.int32), "d": ((), torch.bool)}
    g = torch.Generator(device="cuda").manual_seed(0)
    for arity in (4, 32):
        for sampling in ("proportional", "stratified", "uniform"):
            cap = 50_000
            rb = gper.PrioritizedReplayBuffer(
                cap, spec, instances=n, device="cuda", arity=arity, sampling=sampling, cuda_graphs=False
            )
            rb.add(
                {
                    "x": torch.zeros(n, cap, dtype=torch.int32, device="cuda"),
                    "d": torch.zeros(n, cap, dtype=torch.bool, device="cuda"),
                }
            )
            for _ in range(3):
                idx = torch.randint(0, 500, (n, 16384), device="cuda", generator=g)
                rb.update_priorities(idx, torch.randn(n, 16384, device="cuda", generator=g))
                rb.add(
                    {
                        "x": torch.zeros(n, 7000, dtype=torch.int32, device="cuda"),
                        "d": torch.ones(n, 7000, dtype=torch.bool, device="cuda"),
                    }
                )
                batch = rb.sample(4096)
                rb.update_priorities(batch, torch.randn(n, 4096, device="cuda", generator=g))
    torch.cuda.synchronize()
    print("sanitize script (instances) done")


def main() -> None:
    for arity in (4, 32):
        cap = 50_000
        spec = {"x": ((), torch.int32), "d": ((), torch.bool)}
        rb = gper.PrioritizedReplayBuffer(cap, spec, device="cuda", arity=arity, cuda_graphs=False)
        rb.add(
            {
                "x": torch.zeros(cap, dtype=torch.int32, device="cuda"),
                "d": torch.zeros(cap, dtype=torch.bool, device="cuda"),
            }
        )
        g = torch.Generator(device="cuda").manual_seed(0)
        for _ in range(3):
            idx = torch.randint(0, 500, (16384,), device="cuda", generator=g)
            rb.update_priorities(idx, torch.randn(16384, device="cuda", generator=g))
            new = {
                "x": torch.zeros(7000, dtype=torch.int32, device="cuda"),
                "d": torch.ones(7000, dtype=torch.bool, device="cuda"),
            }
            rb.add(new)
            rb.sample(4096)
    spec = {"obs": ((51,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32)}
    tb = gper.TrajectoryReplayBuffer(1 << 14, 64, spec, window=3, device="cuda", cuda_graphs=False)
    o = torch.randn(64, 51, device="cuda")
    flags = torch.zeros(64, dtype=torch.bool, device="cuda")
    step = {
        "obs": o,
        "action": torch.zeros(64, dtype=torch.int64, device="cuda"),
        "reward": torch.randn(64, device="cuda"),
        "next_obs": o,
        "terminated": flags,
        "truncated": flags,
    }
    for _ in range(8):
        tb.add(step)
    torch.cuda.synchronize()
    print("sanitize script done")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", action="store_true", help="a buffer of instances=N (batched launches)")
    parser.add_argument("--n", type=int, default=16, help="N with --instances (default 16)")
    args = parser.parse_args()
    if args.instances:
        instances(args.n)
    else:
        main()
