"""Where does the time of a sample or an update go? Times them with parts of them removed.

Developer tool. Each variant is a copy of ``gper.ops.tree.triton`` with one part cut out of its
source (the trees it leaves are wrong: these are timings, not implementations). A buffer at 2^25
is built on each variant (``PrioritizedReplayBuffer(..., backend=variant)``), filled, and its
update or sample timed as one CUDA graph; each buffer is freed before the next.

    python benchmarks/ablation.py
"""

# ruff: noqa: B023

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import tempfile

import torch

import gper
from gper.bench.timing import time_graph
from gper.ops.tree import triton as tree_triton

CUTS = {
    "no event counts in the claim": [
        ("    tl.atomic_add(counters + 3, n_invalid, mask=n_invalid > 0)  # C_INVALID\n", ""),
        ("    tl.atomic_add(counters + 5, n_stale, mask=n_stale > 0)  # C_STALE\n", ""),
        ("    tl.atomic_add(counters + 4, n_nonfinite, mask=n_nonfinite > 0)  # C_NONFINITE\n", ""),
    ],
    "no min tree above the leaves": [
        (
            '    mv = tl.load(mintree + c, mask=m[:, None], other=float("inf"))\n'
            "    tl.store(mintree + par_off + par, tl.min(mv, axis=1), mask=m)\n",
            "",
        ),
        (
            '        mv = tl.load(mintree + leaf_off + c, mask=valid[:, None], other=float("inf"))\n'
            "        tl.store(mintree + par_off + par, tl.min(tl.where(claimed >= 0, new, mv), axis=1), mask=valid)\n",
            "",
        ),
    ],
    "top level in its own launch": [("    fold_top = len(levels) >= 2\n", "    fold_top = False\n")],
}


SAMPLE_CUTS = {
    "float32 scan in the descent": [
        ("            cs = tl.cumsum(v.to(tl.float64), axis=1)\n", "            cs = tl.cumsum(v, axis=1)\n"),
        (
            "                t = r.to(tl.float64) * 2.3283064365386963e-10 * tot\n",
            "                t = r.to(tl.float32) * 2.3283064e-10 * tot\n",
        ),
    ],
    "no row gather": [
        (
            "    vals = tl.load(rows + node[:, None] * W + cols[None, :], mask=cm, other=0)\n"
            "    tl.store(out_rows + s[:, None] * W + cols[None, :], vals, mask=cm)\n",
            "",
        )
    ],
}


def variant(name, cuts):
    src = open(tree_triton.__file__).read()
    for old, new in cuts:
        assert old in src, (name, old)
        src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "variant_ops.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(name))}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def timed_graph(fn):
    return time_graph(fn, iters=200, repeats=7).median_us


#: the fields the ablation gathers (obs and next_obs of the reference transition)
SPEC = {"obs": ((51,), torch.float32), "next_obs": ((51,), torch.float32)}


def filled(mod, cap):
    """A buffer at ``cap`` on kernel module ``mod``, filled with the same random rows for every variant."""
    rb = gper.PrioritizedReplayBuffer(cap, SPEC, device="cuda", cuda_graphs=False, backend=mod)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(cap >> 21):
        rows = {k: torch.randn(1 << 21, 51, device="cuda", generator=gen) for k in ("obs", "next_obs")}
        rb.add(rows)
    return rb


def free():
    gc.collect()
    torch.cuda.empty_cache()


def main():
    cap, b = 1 << 25, 16384
    td = torch.rand(b, device="cuda")
    lines = [f"# ablation, {torch.cuda.get_device_name()}, capacity 2^25, B={b}, graph replay medians (us)"]
    variants = {"baseline": tree_triton} | {k: variant(k, v) for k, v in CUTS.items()}
    variants["all three cut"] = variant("all", [c for cuts in CUTS.values() for c in cuts])
    for name, mod in variants.items():
        rb = filled(mod, cap)
        batch = rb.sample(b)
        t_batch = timed_graph(lambda: rb.update_priorities(batch, td))
        t_raw = timed_graph(lambda: rb.update_priorities(batch.indices, td))
        lines.append(f"{name:32s} with generation check {t_batch:6.2f}   raw indices {t_raw:6.2f}")
        print(lines[-1], flush=True)
        rb = batch = None  # freed before the next variant is built
        free()
    row_bytes = gper.replay.RowLayout.build(SPEC).row_bytes
    lines.append(f"# sample ablation (proportional, gather of the {row_bytes}-byte row of obs and next_obs, weights)")
    for name, mod in ({"baseline": tree_triton} | {k: variant(k, v) for k, v in SAMPLE_CUTS.items()}).items():
        rb = filled(mod, cap)
        lines.append(f"{name:32s} sample {timed_graph(lambda: rb.sample(b)):6.2f}")
        print(lines[-1], flush=True)
        rb = None
        free()
    out = os.environ.get("OUT") or "benchmarks/results"
    with open(os.path.join(out, "ablation-2e25.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
