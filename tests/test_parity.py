"""The Triton kernels (under the interpreter) against the torch reference, and both against the oracle.

With the same seed and the same calls the two back ends must draw the same slots. Indices and
generations are compared exactly; IS weights to rtol 1e-5 (the reference uses ``pow``, the kernel
``exp2(-beta * log2(x))``, a few float32 ulps apart). Exact index equality needs the two trees to
hold the same sums, so these runs use dyadic priorities (:func:`helpers.dyadic_td`), whose sums
are exact in float32 whatever the order of addition.
"""

from __future__ import annotations

import pytest
import torch

from helpers import (
    EPS_DYADIC,
    TRITON_ON_CPU,
    assert_verbose_allclose,
    assert_verbose_equal,
    check_tree,
    dyadic_td,
    make_buffer,
    sum_rtol,
    transitions,
)
from oracle import OracleBuffer, is_weights, rank_weights

pytestmark = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")

ALPHA = 0.5


def run_script(backend: str, capacity: int, arity: int, sampling: str, weight_norm: str = "global"):
    """Adds (wrapping), samples, updates with stale entries and duplicates; returns everything observed."""
    g = torch.Generator().manual_seed(capacity + arity)
    rb = make_buffer(
        capacity,
        backend,
        arity=arity,
        alpha=ALPHA,
        eps=EPS_DYADIC,
        sampling=sampling,
        weight_norm=weight_norm,
        seed=11,
        rank_refresh_interval=2,
    )
    seen = []
    added = 0
    for step, (n, b) in enumerate([(capacity // 2 + 1, 64), (capacity, 256), (3, 33)]):
        rb.add(transitions(n, added))
        added += n
        batch = rb.sample(b, beta=[0.4, 1.0, 0.0][step])
        seen.append(batch)
        if step == 1:
            rb.add(transitions(capacity // 5 + 1, added))  # some entries go stale
            added += capacity // 5 + 1
        k = torch.randint(-1, 4, (b,), generator=g) * 2
        sign = torch.randint(0, 2, (b,), generator=g) * 2 - 1
        rb.update_priorities(batch, dyadic_td(k, sign))
    seen.append(rb.sample(256))
    return rb, seen


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
@pytest.mark.parametrize("capacity, arity", [(7, 4), (1025, 4), (1000, 32)])
def test_torch_and_triton_draw_the_same(capacity, arity, sampling):
    ref, ref_seen = run_script("torch", capacity, arity, sampling)
    tri, tri_seen = run_script("triton", capacity, arity, sampling)
    for step, (a, b) in enumerate(zip(ref_seen, tri_seen, strict=True)):
        what = f"{sampling} sample {step}"
        assert_verbose_equal(b.indices, a.indices, what=f"{what}: indices")
        assert_verbose_equal(b.generations, a.generations, what=f"{what}: generations")
        assert_verbose_equal(b.rows, a.rows, what=f"{what}: rows")
        assert_verbose_allclose(b.weights, a.weights, rtol=1e-5, what=f"{what}: weights")
    lay = ref._tree_layout
    assert_verbose_equal(tri._tree[: lay.numel], ref._tree[: lay.numel], what="sum tree")
    assert_verbose_equal(tri._mintree[: lay.numel], ref._mintree[: lay.numel], what="min tree")
    assert_verbose_equal(tri._gen, ref._gen, what="generations")
    st_ref, st_tri = ref.stats(), tri.stats()
    assert st_ref == st_tri
    assert st_ref["stale_updates"] > 0 or capacity == 7 or sampling == "rank", "the script should make stale entries"


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("capacity, arity", [(7, 4), (1025, 4)])
def test_script_matches_the_oracle(backend, capacity, arity):
    """The same script, replayed on the oracle: priorities, trees and IS weights of every batch."""
    rb, seen = run_script(backend, capacity, arity, "proportional")
    orc = OracleBuffer(capacity, ALPHA, EPS_DYADIC)
    g = torch.Generator().manual_seed(capacity + arity)
    added = 0
    for step, (n, b) in enumerate([(capacity // 2 + 1, 64), (capacity, 256), (3, 33)]):
        orc.add(n)
        added += n
        batch = seen[step]
        want_w = is_weights(orc.priorities[: orc.size], batch.indices.tolist(), [0.4, 1.0, 0.0][step])
        assert_verbose_allclose(batch.weights, torch.tensor(want_w), rtol=1e-5, what=f"weights {step}")
        if step == 1:
            orc.add(capacity // 5 + 1)
        k = torch.randint(-1, 4, (b,), generator=g) * 2
        sign = torch.randint(0, 2, (b,), generator=g) * 2 - 1
        orc.update(batch.indices.tolist(), dyadic_td(k, sign).tolist(), batch.generations.tolist())
    # dyadic priorities: the leaves, and every sum above them, are exact
    check_tree(rb._tree, rb._mintree, rb._tree_layout, orc.priorities)
    lay = rb._tree_layout
    assert rb._tree[lay.leaf_offset : lay.leaf_offset + capacity].tolist() == orc.priorities
    assert rb.stats()["stale_updates"] == orc.stale_updates


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
    n = a._tree_layout.numel
    assert_verbose_allclose(b._tree[:n], a._tree[:n], rtol=2 * sum_rtol(arity, a._tree_layout.depth), what="sum tree")
    assert_verbose_allclose(b._mintree[:n], a._mintree[:n], rtol=2e-6, what="min tree")
    assert_verbose_allclose(b.stats()["max_priority"], a.stats()["max_priority"], rtol=2e-6)


def test_rank_weights_match_the_oracle():
    """Both back ends store the keys ``|td| + eps`` the same way, so the ranks agree with the oracle."""
    for backend in ["torch", "triton"]:
        rb, _ = run_script(backend, 7, 4, "rank")
        rb.refresh_ranks()
        keys = rb._key[:7].tolist()
        want = rank_weights(keys, ALPHA)
        assert_verbose_allclose(rb.priorities(torch.arange(7)), torch.tensor(want), rtol=1e-6, what=backend)
