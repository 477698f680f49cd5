"""Plant inf/NaN/-1 in the sum tree of a Triton buffer on CUDA and draw from it; a huge-TD update too.
Run under compute-sanitizer: `compute-sanitizer --tool memcheck python benchmarks/planted_tree_draws.py`."""

import torch

import gper

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}
bad = 0
for sampling in ("proportional", "stratified"):
    for value in (float("inf"), float("nan"), -1.0):
        for where in ("leaf", "inner", "top", "padding", "unfilled"):
            rb = gper.PrioritizedReplayBuffer(
                100, SPEC, device="cuda", backend="triton", arity=4, sampling=sampling, alpha=1.0, cuda_graphs=False
            )
            k = torch.arange(37, device="cuda")
            rb.add({"obs": torch.stack([k * 1.0] * 3, 1), "action": k})
            lay = rb.tree.layout
            cell = {
                "leaf": lay.leaf_offset + 5,
                "unfilled": lay.leaf_offset + 99,
                "inner": lay.offsets[-2] + 2,
                "top": lay.offsets[0],
                "padding": lay.offsets[-2] + lay.sizes[-2],
            }[where]
            rb.tree.tree[cell] = value
            for _ in range(3):
                b = rb.sample(128)
                idx = b.indices
                if not bool(((idx >= 0) & (idx < 37)).all()):
                    bad += 1
                    print("outside:", sampling, value, where, idx.max().item())
                    break
rb = gper.PrioritizedReplayBuffer(10, SPEC, device="cuda", backend="triton", alpha=1.0, cuda_graphs=False)
k = torch.arange(10, device="cuda")
rb.add({"obs": torch.stack([k * 1.0] * 3, 1), "action": k})
rb.update_priorities(k, torch.tensor([3e38, -3.2e38] + [1.0] * 8, device="cuda"))
b = rb.sample(256)
print("huge TD: max index", b.indices.max().item(), "tree finite", bool(torch.isfinite(rb.tree.tree[:-1]).all()))
torch.cuda.synchronize()
print("draws outside the filled range:", bad)
