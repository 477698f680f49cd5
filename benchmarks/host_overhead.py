"""Host time of the pieces of an eager call (B=256, where the GPU work is small).

Developer tool: ``python benchmarks/host_overhead.py``; prints microseconds per call. It uses the
buffer's public calls only, and times the replay of a ``rb.sample(256)`` graph it captures itself
(:func:`gper.bench.timing.capture_graph`) as the floor of a graphed call. Earlier versions also
timed the buffer's private sample slot (``slot.free()``, a clone of its flat output); those rows
measured internals, not a public seam, and are gone.
"""

from __future__ import annotations

import os
import time

import torch

import gper
from gper.bench.timing import capture_graph
from gper.bench.workload import SPEC, random_transitions


def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / n * 1e6
    return host, wall


def main():
    b = 256
    rb = gper.PrioritizedReplayBuffer(1 << 16, SPEC, device="cuda")
    rb.add(random_transitions(1 << 16, "cuda"))
    td = torch.randn(b, device="cuda")
    smp = rb.sample(b)
    rb.update_priorities(smp, td)
    smp = None
    for _ in range(3):  # the update graph keyed by these addresses is captured on the second sight
        smp = rb.sample(b)
        rb.update_priorities(smp, td)
    sample_graph = capture_graph(lambda: rb.sample(b))
    x64 = torch.zeros(b, dtype=torch.int64, device="cuda")
    rows = [
        ("replay of a captured sample(256)", sample_graph.replay),
        ("copy_ 256 int64 d2d", lambda: x64.copy_(smp.indices)),
        ("is_current_stream_capturing", torch.cuda.is_current_stream_capturing),
        ("torch.cuda.is_available", torch.cuda.is_available),
        ("rb.sample(256)", lambda: rb.sample(b)),
        ("rb.sample(256) + fields", lambda: [v for v in rb.sample(b).values()]),
        ("rb.update_priorities(batch)", lambda: rb.update_priorities(smp, td)),
        ("rb.update_priorities(indices)", lambda: rb.update_priorities(smp.indices, td)),
        ("step: sample + update", lambda: rb.update_priorities(rb.sample(b), td)),
    ]
    lines = [
        f"# host overhead per call, {torch.cuda.get_device_name()}, torch {torch.__version__}, B={b}",
        f"{'piece':34s} {'host us':>9s} {'wall us':>9s}",
    ]
    for name, fn in rows:
        h, w = per_call(fn)
        lines.append(f"{name:34s} {h:9.2f} {w:9.2f}")
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("OUT") or "benchmarks/results"
    with open(os.path.join(out, "host-overhead.txt"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
