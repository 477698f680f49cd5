"""A target for ``compute-sanitizer`` on the tree repair: contended updates (the climb), wrapping
adds with a bool field, samples, and a trajectory buffer's adds, on the GPU.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_climb.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_climb.py
"""

from __future__ import annotations

import torch

import gper


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
    main()
