"""Sum/min tree invariants under adds and priority updates, on both back ends, against the oracle.

Covers the rules of ``shared/DESIGN.md`` section 4 at the level of the trees: wrap-around,
duplicate indices (last wins), stale updates, raw indices, NaN/Inf TD errors, indices out of
range (dropped and counted by the kernels), and zero-priority leaves that must never be drawn.
"""

from __future__ import annotations

import math

import pytest
import torch

from gper.ops import reference
from gper.ops.state import (
    C_INVALID,
    C_NONFINITE,
    C_SIZE,
    C_STALE,
    C_TICKET,
    MODE_PROPORTIONAL,
    MODE_STRATIFIED,
    MODE_UNIFORM,
)
from helpers import LEAF_RTOL, RawTree, assert_verbose_allclose, check_tree, make_buffer, transitions
from oracle import OracleBuffer

CAPACITIES = [1, 2, 7, 1000, 1024, 1025]


def check_against_oracle(rb, orc: OracleBuffer, what: str):
    check_tree(rb._tree, rb._mintree, rb._tree_layout, orc.priorities, what=what)
    st = rb.stats()
    assert (len(rb), st["size"], st["cursor"]) == (orc.size, orc.size, orc.cursor), what
    assert rb._gen.tolist() == orc.generations, f"{what}: generations"
    assert math.isclose(st["max_priority"], orc.max_priority, rel_tol=LEAF_RTOL), what
    assert (st["stale_updates"], st["nonfinite_td"], st["invalid_indices"]) == (
        orc.stale_updates,
        orc.nonfinite_td,
        orc.invalid_indices,
    ), what
    # scratch the kernels share between calls must be back to its resting state
    assert bool((rb._owner == -1).all()), f"{what}: update scratch not reset"
    assert rb._counters[C_TICKET:].tolist() == [0] * (rb._counters.numel() - C_TICKET), f"{what}: tickets not reset"
    if orc.size:
        filled = torch.arange(orc.size)
        want = torch.tensor(orc.priorities[: orc.size], dtype=torch.float64)
        got = rb.priorities(filled).double()
        assert torch.allclose(got, want, rtol=LEAF_RTOL, atol=0), f"{what}: priorities()"


@pytest.mark.parametrize("arity", [4, 32])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_tree_invariants_after_adds_and_updates(backend, capacity, arity):
    """Random adds (some wrapping, some larger than the buffer), samples and updates (with stale
    entries, duplicates, NaN/Inf) keep both trees equal to the oracle's exact trees."""
    g = torch.Generator().manual_seed(capacity * 64 + arity)
    alpha, eps = 0.6, 1e-3
    rb = make_buffer(capacity, backend, arity=arity, alpha=alpha, eps=eps, seed=capacity)
    orc = OracleBuffer(capacity, alpha, eps)
    check_against_oracle(rb, orc, "empty")
    steps = 6 if backend == "torch" else 3
    added = 0
    for step in range(steps):
        n = [capacity // 3 + 1, 1, capacity + 5, capacity // 2 + 3][step % 4]
        assert rb.add(transitions(n, added)).tolist() == orc.add(n)
        added += n
        check_against_oracle(rb, orc, f"step {step} after add({n})")
        b = [1, 33, 256][step % 3]
        batch = rb.sample(b)
        if step % 2 == 1:
            # overwrite some sampled slots before the update: those entries go stale
            k = max(1, capacity // 4)
            orc.add(k)
            rb.add(transitions(k, added))
            added += k
        td = torch.randn(b, generator=g) * torch.exp(torch.randn(b, generator=g) * 2)
        if b > 2:
            td[1] = math.nan
            td[2] = -math.inf if step % 2 else math.inf
        if step % 3 == 2:
            rb.update_priorities(batch.indices, td)
            orc.update(batch.indices.tolist(), td.tolist())
        else:
            rb.update_priorities(batch, td)
            orc.update(batch.indices.tolist(), td.tolist(), batch.generations.tolist())
        check_against_oracle(rb, orc, f"step {step} after update of {b}")


def test_update_wraps_and_overwrites_keep_tree_exact_over_many_steps():
    """A longer run on the torch back end: the tree never drifts (recomputed, never delta-updated)."""
    g = torch.Generator().manual_seed(5)
    rb = make_buffer(1025, arity=4, alpha=0.7, eps=1e-2, seed=1)
    orc = OracleBuffer(1025, 0.7, 1e-2)
    added = 0
    for _step in range(60):
        n = int(torch.randint(1, 300, (1,), generator=g))
        rb.add(transitions(n, added))
        orc.add(n)
        added += n
        batch = rb.sample(256)
        td = torch.rand(256, generator=g) * 100
        rb.update_priorities(batch, td)
        orc.update(batch.indices.tolist(), td.tolist(), batch.generations.tolist())
    check_against_oracle(rb, orc, "after 60 steps")


def test_duplicate_indices_last_occurrence_wins(backend):
    rb = make_buffer(16, backend, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(16))
    idx = torch.tensor([3, 5, 3, 3, 9, 5])
    td = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    rb.update_priorities(idx, td)
    got = rb.priorities(torch.tensor([3, 5, 9])).tolist()
    assert_verbose_allclose(got, [4.5, 6.5, 5.5], rtol=LEAF_RTOL, what="a duplicate slot takes the last entry")
    orc = OracleBuffer(16, 1.0, 0.5)
    orc.add(16)
    orc.update(idx.tolist(), td.tolist())
    check_tree(rb._tree, rb._mintree, rb._tree_layout, orc.priorities)


def test_duplicates_across_kernel_blocks_are_deterministic(backend):
    """600 entries over 7 slots: the last occurrence lies in another Triton program than the first ones."""
    trees = []
    for _ in range(2):
        rb = make_buffer(7, backend, arity=4, alpha=1.0, eps=0.25)
        rb.add(transitions(7))
        idx = torch.arange(600) % 7
        td = torch.arange(600, dtype=torch.float32)
        rb.update_priorities(idx, td)
        last = [max(k for k in range(600) if k % 7 == slot) for slot in range(7)]
        want = torch.tensor([k + 0.25 for k in last])
        assert_verbose_allclose(rb.priorities(torch.arange(7)), want, rtol=LEAF_RTOL, what="last occurrence")
        trees.append((rb._tree[:-1].clone(), rb._mintree[:-1].clone()))
    assert torch.equal(trees[0][0], trees[1][0]) and torch.equal(trees[0][1], trees[1][1])


def test_stale_updates_ignored_and_counted(backend):
    rb = make_buffer(8, backend, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(8))
    batch = rb.sample(32)
    drawn = sorted(set(batch.indices.tolist()))
    # overwrite every slot: each entry of the batch is now stale
    rb.add(transitions(8, 100))
    before = rb._tree.clone(), rb._mintree.clone()
    rb.update_priorities(batch, torch.full((32,), 9.0))
    assert torch.equal(rb._tree[:-1], before[0][:-1]) and torch.equal(rb._mintree[:-1], before[1][:-1])
    assert rb.priorities(torch.arange(8)).tolist() == [1.0] * 8
    st = rb.stats()
    assert st["stale_updates"] == 32 and st["max_priority"] == 1.0
    # half stale: overwrite only slots 0..3, the rest of a fresh batch applies
    batch = rb.sample(64)
    rb.add(transitions(4, 200))
    td = torch.arange(64, dtype=torch.float32)
    rb.update_priorities(batch, td)
    idx = batch.indices.tolist()
    fresh = [k for k in range(64) if idx[k] >= 4]
    assert rb.stats()["stale_updates"] == 32 + (64 - len(fresh))
    want = [1.0] * 8
    for k in fresh:
        want[idx[k]] = k + 0.5
    assert_verbose_allclose(rb.priorities(torch.arange(8)), torch.tensor(want), rtol=LEAF_RTOL)
    assert len(drawn) > 1


def test_raw_indices_skip_the_stale_check(backend):
    rb = make_buffer(8, backend, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(8))
    batch = rb.sample(4)
    rb.add(transitions(8, 100))
    rb.update_priorities(batch.indices, torch.full((4,), 2.0))
    assert_verbose_allclose(rb.priorities(batch.indices), torch.full((4,), 2.5), rtol=LEAF_RTOL)
    assert rb.stats()["stale_updates"] == 0


def test_nonfinite_td_maps_to_max_priority_and_is_counted(backend):
    rb = make_buffer(8, backend, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(8))
    rb.update_priorities(torch.tensor([0]), torch.tensor([6.5]))  # max priority 7
    td = torch.tensor([math.nan, math.inf, -math.inf, 100.0, 1.0])
    rb.update_priorities(torch.tensor([1, 2, 3, 4, 5]), td)
    # non-finite entries take the max from before the call (7), not the 100.5 of this call
    want = torch.tensor([7.0, 7.0, 7.0, 7.0, 100.5, 1.5])
    assert_verbose_allclose(rb.priorities(torch.arange(6)), want, rtol=LEAF_RTOL)
    st = rb.stats()
    assert st["nonfinite_td"] == 3 and math.isclose(st["max_priority"], 100.5, rel_tol=LEAF_RTOL)
    assert math.isfinite(st["total_priority"])


def test_nan_td_before_any_update_uses_initial_max(backend):
    rb = make_buffer(4, backend, alpha=0.5, eps=1e-6)
    rb.add(transitions(4))
    rb.update_priorities(torch.tensor([2]), torch.tensor([math.nan], dtype=torch.float64))
    assert rb.priorities(torch.tensor([2])).tolist() == [1.0]


def test_max_priority_only_grows_and_new_items_enter_at_it(backend):
    rb = make_buffer(8, backend, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(4))
    rb.update_priorities(torch.tensor([0, 1]), torch.tensor([10.5, 0.0]))
    rb.update_priorities(torch.tensor([0]), torch.tensor([0.5]))  # lower the former max slot
    assert math.isclose(rb.stats()["max_priority"], 11.0, rel_tol=LEAF_RTOL)
    rb.add(transitions(2, 4))
    want = torch.tensor([1.0, 0.5, 1.0, 1.0, 11.0, 11.0])
    assert_verbose_allclose(rb.priorities(torch.arange(6)), want, rtol=LEAF_RTOL)


def test_out_of_range_indices_are_dropped_and_counted_by_the_kernels(ops):
    """The kernels drop entries outside [0, size) and count them (on CUDA the API does not raise)."""
    t = RawTree([1.0] * 10, arity=4, size=6)
    t.update(ops, [-1, 6, 9, 2, 1 << 40], [15.5, 15.5, 15.5, 3.5, 15.5])
    leaves = t.tree[t.layout.leaf_offset : t.layout.leaf_offset + 10]
    assert leaves.tolist() == [1.0, 1.0, 4.0] + [1.0] * 7
    assert int(t.counters[C_INVALID]) == 4 and int(t.counters[C_STALE]) == 0
    assert float(t.scalars[0]) == 4.0, "dropped entries must not raise the max priority"
    check_tree(t.tree, t.mintree, t.layout, [1.0, 1.0, 4.0] + [1.0] * 7)


def test_stale_generations_in_the_kernels(ops):
    t = RawTree([1.0] * 5, arity=2)
    t.gen[:] = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    expected = torch.tensor([0, 0, 2, 0, 4], dtype=torch.int32)
    t.update(ops, [0, 1, 2, 3, 4], [1.5, 1.5, 3.5, math.nan, 7.5], expected_gen=expected)
    leaves = t.tree[t.layout.leaf_offset : t.layout.leaf_offset + 5].tolist()
    assert leaves == [2.0, 1.0, 4.0, 1.0, 8.0]
    assert int(t.counters[C_STALE]) == 2 and int(t.counters[C_NONFINITE]) == 0, "a stale NaN is not counted"
    assert int(t.counters[C_SIZE]) == 5


ZERO_LEAVES = [
    # leading zeros in every node, a lone positive leaf at the end of a node, and empty slots past size
    [0.0, 0.0, 0.0, 1.0] * 8 + [0.0] * 31 + [2.0] + [0.0] * 7 + [3.0, 0.0, 0.0, 0.0, 5.0],
    # one positive leaf among 1025, the last one
    [0.0] * 1024 + [1.0],
    # the first leaf only
    [1.0] + [0.0] * 1024,
]


@pytest.mark.parametrize("mode", [MODE_PROPORTIONAL, MODE_STRATIFIED])
@pytest.mark.parametrize("case", range(len(ZERO_LEAVES)))
def test_zero_priority_leaves_are_never_drawn(ops, case, mode):
    leaves = ZERO_LEAVES[case]
    t = RawTree(leaves, arity=4)
    idx, w, rows, _ = t.sample(ops, 1024, mode, seed=case)
    drawn = set(idx.tolist())
    assert all(leaves[i] > 0 for i in drawn), sorted(i for i in drawn if leaves[i] <= 0)
    assert drawn == {i for i, p in enumerate(leaves) if p > 0}
    assert torch.equal(rows[:, 0].long(), idx)
    assert bool(torch.isfinite(w).all())


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform"])
def test_empty_slots_are_never_drawn(backend, sampling):
    rb = make_buffer(1000, backend, arity=4, sampling=sampling, seed=3)
    rb.add(transitions(37))
    idx = rb.sample(2048).indices
    assert int(idx.min()) >= 0 and int(idx.max()) < 37
    assert len(set(idx.tolist())) == 37


def test_uniform_mode_respects_size_counter(ops):
    t = RawTree([1.0] * 64, arity=4, size=10)
    idx, w, _, _ = t.sample(ops, 1024, MODE_UNIFORM)
    assert set(idx.tolist()) == set(range(10))
    assert w.tolist() == [1.0] * 1024


def words_for(depth: int, r: int, b: int = 1) -> list[torch.Tensor]:
    return [torch.full((b,), r, dtype=torch.int64) for _ in range(depth + 1)]


def test_descent_edges_of_the_uniform_skip_zero_children():
    """The extreme words 0 and 2^32 - 1 land on the first and last positive leaf, never on a zero:
    a child is chosen when ``cs[j-1] <= t < cs[j]``, so zero-mass children are stepped over."""
    leaves = [0.0, 0.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    t = RawTree(leaves, arity=4)
    lay = t.layout
    for r, want in [(0, 2), (2**32 - 1, 13)]:
        node, leaf = reference.descend(t.tree, lay, words_for(lay.depth, r))
        assert node.tolist() == [want] and leaf.tolist() == [leaves[want]]
    node, _ = reference.descend_stratified(t.tree, lay, [torch.zeros(2, dtype=torch.int64)] * (lay.depth + 1))
    assert node.tolist() == [2, 5], "stratum 0 starts at the first positive leaf, stratum 1 at mass 3 of 6"
    last = [torch.full((2,), 2**32 - 1, dtype=torch.int64)] * (lay.depth + 1)
    node, _ = reference.descend_stratified(t.tree, lay, last)
    assert node.tolist() == [2, 13], "a jitter just under 1 keeps each draw inside its own stratum"


def test_update_accepts_int32_indices_and_any_float_td(backend):
    """int32 indices and float16/float64/bfloat16 TD errors give what int64/float32 give."""
    want = make_buffer(8, backend, arity=4, alpha=1.0, eps=0.5)
    want.add(transitions(8))
    want.update_priorities(torch.tensor([1, 6]), torch.tensor([1.5, -3.5]))
    for dtype in [torch.float16, torch.float64, torch.bfloat16]:
        rb = make_buffer(8, backend, arity=4, alpha=1.0, eps=0.5)
        rb.add(transitions(8))
        td = torch.tensor([1.5, -3.5], dtype=dtype, requires_grad=True)
        rb.update_priorities(torch.tensor([1, 6], dtype=torch.int32), td)
        assert torch.equal(rb._tree, want._tree), dtype


def test_stratified_descent_rescales_when_a_parent_disagrees_with_its_children(ops):
    """Stored sums may differ from their children's in the last bits; the stratified descent rescales
    its threshold at every level, so a node's strata spread over its children in proportion to them.
    The disagreement is made 2x here so that a descent without the rescale shows."""
    t = RawTree([1.0] * 16, arity=4)
    t.tree[t.layout.offsets[0]] = 8.0  # parent of leaves 0..3 says 8, its children sum to 4
    idx, *_ = t.sample(ops, 1000, MODE_STRATIFIED, seed=1)
    counts = torch.bincount(idx, minlength=16).tolist()
    # total 20: the first node owns 8/20 of the 1000 strata, 100 for each of its leaves; the rest 50 each
    want = [100] * 4 + [50] * 12
    assert all(abs(c - w) <= 2 for c, w in zip(counts, want, strict=True)), counts


@pytest.mark.parametrize("arity", [2, 4, 32])
@pytest.mark.parametrize("capacity", [1, 7, 33, 1000, 1025])
def test_children_rows_match_single_entry_gathers(capacity, arity):
    """The torch back end gathers a node's K children as one row of its level; every node's row,
    the last one's reaching into the level's padding included, is the K entries from K * node."""
    from gper.ops.layout import TreeLayout

    lay = TreeLayout.build(capacity, arity)
    tree = torch.rand(lay.numel + 1)
    for level in range(lay.depth):
        n_parents = lay.sizes[level - 1] if level else 1
        parent = torch.arange(n_parents)
        rows = reference._children(tree, lay, level, parent)
        first = lay.offsets[level] + parent * arity
        expected = torch.take(tree, first[:, None] + torch.arange(arity))
        assert torch.equal(rows, expected), f"level {level}"
