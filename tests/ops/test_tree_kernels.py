"""The kernels of either back end driven directly on hand-made trees (:meth:`PriorityTree.from_leaves`).

Covers what the buffer's checks hide: indices out of range (dropped and counted by the kernels;
on CUDA the API does not raise), stale generations, zero-priority leaves that must never be drawn,
uniform draws bounded by the size counter, the descent's edges and rescaling, the adds' slots and
commits, and the torch back end's gather of a node's children. Tests that take ``device`` run the
same kernels on CUDA too (the Triton ones compiled there).
"""

from __future__ import annotations

import math

import pytest
import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import (
    C_CURSOR,
    C_INVALID,
    C_NONFINITE,
    C_SIZE,
    C_STALE,
    MODE_PROPORTIONAL,
    MODE_STRATIFIED,
    MODE_UNIFORM,
    S_MAXP,
)
from gper.ops.tree import reference
from gper.replay.tree import PriorityTree
from helpers import assert_at_rest, check_tree, sample_fresh


def test_out_of_range_indices_are_dropped_and_counted_by_the_kernels(ops, device):
    """The kernels drop entries outside [0, size) and count them (on CUDA the API does not raise)."""
    t = PriorityTree.from_leaves([1.0] * 10, ops, arity=4, size=6, device=device)
    idx = torch.tensor([-1, 6, 9, 2, 1 << 40], device=device)
    t.update(idx, torch.tensor([15.5, 15.5, 15.5, 3.5, 15.5], device=device), None, alpha=1.0, eps=0.5)
    assert t.leaves().tolist() == [1.0, 1.0, 4.0] + [1.0] * 7
    assert int(t.counters[C_INVALID]) == 4 and int(t.counters[C_STALE]) == 0
    assert float(t.max_priority()) == 4.0, "dropped entries must not raise the max priority"
    check_tree(t, [1.0, 1.0, 4.0] + [1.0] * 7)
    assert_at_rest(t, "after an update with dropped entries")


def test_stale_generations_in_the_kernels(ops, device):
    t = PriorityTree.from_leaves([1.0] * 5, ops, arity=2, device=device)
    t.gen.copy_(torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32))
    expected = torch.tensor([0, 0, 2, 0, 4], dtype=torch.int32, device=device)
    td = torch.tensor([1.5, 1.5, 3.5, math.nan, 7.5], device=device)
    t.update(torch.arange(5, device=device), td, expected, alpha=1.0, eps=0.5)
    assert t.leaves().tolist() == [2.0, 1.0, 4.0, 1.0, 8.0]
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
def test_zero_priority_leaves_are_never_drawn(ops, device, case, mode):
    leaves = ZERO_LEAVES[case]
    t = PriorityTree.from_leaves(leaves, ops, arity=4, device=device)
    idx, w, rows, _ = sample_fresh(t, 1024, mode, seed=case)
    drawn = set(idx.tolist())
    assert all(leaves[i] > 0 for i in drawn), sorted(i for i in drawn if leaves[i] <= 0)
    assert drawn == {i for i, p in enumerate(leaves) if p > 0}
    assert torch.equal(rows[:, 0].long(), idx)
    assert bool(torch.isfinite(w).all())


def test_uniform_mode_respects_size_counter(ops, device):
    t = PriorityTree.from_leaves([1.0] * 64, ops, arity=4, size=10, device=device)
    idx, w, _, _ = sample_fresh(t, 1024, MODE_UNIFORM)
    assert set(idx.tolist()) == set(range(10))
    assert w.tolist() == [1.0] * 1024


def words_for(depth: int, r: int, b: int = 1) -> list[torch.Tensor]:
    return [torch.full((b,), r, dtype=torch.int64) for _ in range(depth + 1)]


def test_descent_edges_of_the_uniform_skip_zero_children():
    """The extreme words 0 and 2^32 - 1 land on the first and last positive leaf, never on a zero:
    a child is chosen when ``cs[j-1] <= t < cs[j]``, so zero-mass children are stepped over."""
    leaves = [0.0, 0.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    t = PriorityTree.from_leaves(leaves, reference, arity=4)
    lay = t.layout
    for r, want in [(0, 2), (2**32 - 1, 13)]:
        node, leaf = reference.descend(t.tree, lay, words_for(lay.depth, r), t.size)
        assert node.tolist() == [want] and leaf.tolist() == [leaves[want]]
    node, _ = reference.descend_stratified(t.tree, lay, [torch.zeros(2, dtype=torch.int64)] * (lay.depth + 1), t.size)
    assert node.tolist() == [2, 5], "stratum 0 starts at the first positive leaf, stratum 1 at mass 3 of 6"
    last = [torch.full((2,), 2**32 - 1, dtype=torch.int64)] * (lay.depth + 1)
    node, _ = reference.descend_stratified(t.tree, lay, last, t.size)
    assert node.tolist() == [2, 13], "a jitter just under 1 keeps each draw inside its own stratum"


def test_stratified_descent_rescales_when_a_parent_disagrees_with_its_children(ops, device):
    """Stored sums may differ from their children's in the last bits; the stratified descent rescales
    its threshold at every level, so a node's strata spread over its children in proportion to them.
    The disagreement is made 2x here so that a descent without the rescale shows."""
    t = PriorityTree.from_leaves([1.0] * 16, ops, arity=4, device=device)
    t.tree[t.layout.offsets[0]] = 8.0  # parent of leaves 0..3 says 8, its children sum to 4
    idx, *_ = sample_fresh(t, 1000, MODE_STRATIFIED, seed=1)
    counts = torch.bincount(idx, minlength=16).tolist()
    # total 20: the first node owns 8/20 of the 1000 strata, 100 for each of its leaves; the rest 50 each
    want = [100] * 4 + [50] * 12
    assert all(abs(c - w) <= 2 for c, w in zip(counts, want, strict=True)), counts


@pytest.mark.parametrize("arity", [2, 4, 32])
@pytest.mark.parametrize("capacity", [1, 7, 33, 1000, 1025])
def test_children_rows_match_single_entry_gathers(capacity, arity):
    """The torch back end gathers a node's K children as one row of its level; every node's row,
    the last one's reaching into the level's padding included, is the K entries from K * node."""
    lay = TreeLayout.build(capacity, arity)
    tree = torch.rand(lay.numel + 1)
    for level in range(lay.depth):
        n_parents = lay.sizes[level - 1] if level else 1
        parent = torch.arange(n_parents)
        rows = reference._children(tree, lay, level, parent)
        first = lay.offsets[level] + parent * arity
        expected = torch.take(tree, first[:, None] + torch.arange(arity))
        assert torch.equal(rows, expected), f"level {level}"


def test_add_positions_and_commit_on_a_hand_made_tree(ops, device):
    """``add_positions`` counts from the cursor (past ``skip``), wrapping; ``add_commit`` writes the
    max priority (or ``leaf_value``), bumps the slots' generations and moves cursor and size on."""
    leaves = [2.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    t = PriorityTree.from_leaves(leaves, ops, arity=2, size=2, device=device)
    t.counters[C_CURSOR] = 2
    t.scalars[S_MAXP] = 4.0  # new items enter at the max priority
    pos = t.positions(3)
    assert pos.tolist() == [2, 3, 4]
    t.commit(pos, 3)
    leaves[2:5] = [4.0] * 3
    check_tree(t, leaves, "after a commit at the max priority")
    assert (int(t.cursor), int(t.size)) == (5, 5)
    # 6 items into the 2 free slots and 2 old ones: the first 2 are skipped, the rest wrap around
    pos = t.positions(4, skip=2)
    assert pos.tolist() == [0, 1, 2, 3]
    t.commit(pos, 6, leaf_value=1.0)
    leaves[0:4] = [1.0] * 4
    check_tree(t, leaves, "after a commit at leaf_value")
    assert (int(t.cursor), int(t.size)) == (4, 7)
    assert t.gen.tolist() == [1, 1, 2, 2, 1, 0, 0]
    assert float(t.max_priority()) == 4.0, "a commit does not change the max priority"
    assert_at_rest(t, "after the adds")
