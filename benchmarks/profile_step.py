"""Where does a PER step's time go? Per-kernel GPU time (torch.profiler) and host time (cProfile).

Developer tool: ``python benchmarks/profile_step.py --capacity 25 --batch 16384``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats

import torch
from torch.profiler import ProfilerActivity, profile

import gper
from gper.bench.workload import SPEC, random_transitions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=25)
    ap.add_argument("--batch", type=int, nargs="+", default=[16384, 256])
    args = ap.parse_args()
    cap = 1 << args.capacity
    out = os.environ.get("OUT") or "benchmarks/results"
    report = []
    for graphs in (False, True):
        rb = gper.PrioritizedReplayBuffer(cap, SPEC, device="cuda", cuda_graphs=graphs)
        for start in range(0, cap, 1 << 21):
            rb.add(random_transitions(min(1 << 21, cap - start), "cuda"))
        for b in args.batch:
            td = torch.randn(b, device="cuda")

            def step(rb=rb, b=b, td=td):
                s = rb.sample(b)
                rb.update_priorities(s, td)

            for _ in range(20):
                step()
            torch.cuda.synchronize()
            if not graphs:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(50):
                        step()
                    torch.cuda.synchronize()
                report.append(f"== kernels, direct launches, capacity 2^{args.capacity}, B={b} (50 steps)")
                report.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20))
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                step()
            torch.cuda.synchronize()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
            report.append(f"== host, cuda_graphs={graphs}, B={b} (200 steps)")
            report.append(s.getvalue())
        rb = None
        torch.cuda.empty_cache()
    text = "\n".join(report)
    print(text)
    with open(os.path.join(out, f"profile-step-2e{args.capacity}.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
