"""The Triton kernels against the torch reference: under the interpreter on the CPU, compiled on CUDA.

With the same seed and the same calls the two back ends must draw the same slots. Indices and
generations are compared exactly; IS weights to rtol 1e-5 (the reference uses ``pow``, the kernel
``exp2(-beta * log2(x))``, a few float32 ulps apart). Exact index equality needs the two trees to
hold the same sums, so these runs use dyadic priorities (:func:`helpers.dyadic_td`), whose sums
are exact in float32 whatever the order of addition.
"""

from __future__ import annotations

import pytest
import torch

import gper
from helpers import (
    TRITON_ON_CPU,
    WIDE_SPEC,
    assert_verbose_allclose,
    assert_verbose_equal,
    make_buffer,
    parity_script,
    sum_rtol,
    transitions,
    wide_transitions,
)

needs_interpreter = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")


@needs_interpreter
@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
@pytest.mark.parametrize("capacity, arity", [(7, 4), (1025, 4), (1000, 32)])
def test_torch_and_triton_draw_the_same(capacity, arity, sampling):
    ref, ref_seen = parity_script("torch", capacity, arity, sampling)
    tri, tri_seen = parity_script("triton", capacity, arity, sampling)
    for step, (a, b) in enumerate(zip(ref_seen, tri_seen, strict=True)):
        what = f"{sampling} sample {step}"
        assert_verbose_equal(b.indices, a.indices, what=f"{what}: indices")
        assert_verbose_equal(b.generations, a.generations, what=f"{what}: generations")
        assert_verbose_equal(b.rows, a.rows, what=f"{what}: rows")
        assert_verbose_allclose(b.weights, a.weights, rtol=1e-5, what=f"{what}: weights")
    lay = ref.tree.layout
    assert_verbose_equal(tri.tree.tree[: lay.numel], ref.tree.tree[: lay.numel], what="sum tree")
    assert_verbose_equal(tri.tree.mintree[: lay.numel], ref.tree.mintree[: lay.numel], what="min tree")
    assert_verbose_equal(tri.tree.gen, ref.tree.gen, what="generations")
    st_ref, st_tri = ref.stats(), tri.stats()
    assert st_ref == st_tri
    assert st_ref["stale_updates"] > 0 or capacity == 7 or sampling == "rank", "the script should make stale entries"


@needs_interpreter
@pytest.mark.parametrize("capacity, arity", [(1000, 4), (1025, 32)])
def test_non_dyadic_updates_give_the_same_trees_within_rounding(capacity, arity):
    """Arbitrary priorities: leaves within float32 pow vs exp2/log2, inner nodes within summation-order rounding."""
    g = torch.Generator().manual_seed(1)
    idx = [torch.randint(0, capacity, (300,), generator=g) for _ in range(3)]
    td = [torch.randn(300, generator=g) * 10 for _ in range(3)]
    trees = {}
    for backend in ["torch", "triton"]:
        rb = make_buffer(capacity, backend, arity=arity, alpha=0.6, eps=1e-3)
        rb.add(transitions(capacity))
        for i, d in zip(idx, td, strict=True):
            rb.update_priorities(i, d)
        trees[backend] = rb
    a, b = trees["torch"], trees["triton"]
    lay = a.tree.layout
    n = lay.numel
    assert_verbose_allclose(b.tree.tree[:n], a.tree.tree[:n], rtol=2 * sum_rtol(arity, lay.depth), what="sum tree")
    assert_verbose_allclose(b.tree.mintree[:n], a.tree.mintree[:n], rtol=2e-6, what="min tree")
    assert_verbose_allclose(b.stats()["max_priority"], a.stats()["max_priority"], rtol=2e-6)


@pytest.mark.gpu
def test_same_seed_same_samples_and_backends_agree():
    """On CUDA: the same seed draws the same samples run after run, and the compiled Triton kernels
    draw what the reference draws on the same GPU."""
    torch.manual_seed(0)
    data = wide_transitions(5000, "cuda")
    td = torch.randint(0, 8, (1024,), device="cuda").float()  # alpha=1, eps tiny: near-dyadic sums
    runs = {}
    for backend in ["triton", "torch", "triton"]:
        rb = gper.PrioritizedReplayBuffer(5000, WIDE_SPEC, device="cuda", backend=backend, seed=7, alpha=1.0)
        rb.add(data)
        first = rb.sample(1024)
        rb.update_priorities(first, td)
        second = rb.sample(1024)
        runs.setdefault(backend, []).append((first.indices, second.indices, second.weights))
    (a1, a2, aw), (b1, b2, bw) = runs["triton"]
    assert torch.equal(a1, b1) and torch.equal(a2, b2) and torch.equal(aw, bw)
    t1, t2, tw = runs["torch"][0]
    assert torch.equal(a1, t1)
    assert (a2 == t2).float().mean() > 0.999
    torch.testing.assert_close(aw[a2 == t2], tw[a2 == t2], rtol=1e-5, atol=0)
