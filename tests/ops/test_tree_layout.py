"""TreeLayout: level sizes, 128-byte aligned offsets, >= K padding after every level, depth.

Only the layout is computed here (no tensors), so 2^26 costs nothing.
"""

from __future__ import annotations

import pytest

from gper.ops.layout import DEFAULT_ARITY, TreeLayout

CAPACITIES = [1, 2, 7, 31, 32, 33, 1000, 1024, 1025, 2**26]
ARITIES = [2, 4, 16, 32, 64]


def expected_depth(capacity: int, k: int) -> int:
    """Fewest levels whose top holds at most K nodes: 1 if capacity <= K, else 1 + that of ceil(capacity / K)."""
    depth, n = 1, capacity
    while n > k:
        n = -(-n // k)
        depth += 1
    return depth


@pytest.mark.parametrize("arity", ARITIES)
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_sizes_offsets_padding_depth(capacity, arity):
    lay = TreeLayout.build(capacity, arity)
    assert lay.capacity == capacity and lay.arity == arity
    assert lay.depth == len(lay.sizes) == len(lay.offsets) == expected_depth(capacity, arity)
    assert lay.sizes[-1] == capacity
    assert lay.leaf_offset == lay.offsets[-1]
    assert 1 <= lay.sizes[0] <= arity, "the top level (whose sum is the root) holds at most K nodes"
    for level in range(lay.depth - 1):
        assert lay.sizes[level] == -(-lay.sizes[level + 1] // arity), f"level {level} is not ceil(next / K)"
    ends = list(lay.offsets[1:]) + [lay.numel]
    for level, (off, n, end) in enumerate(zip(lay.offsets, lay.sizes, ends, strict=True)):
        assert (off * 4) % 128 == 0, f"level {level} starts at byte {off * 4}, not 128-byte aligned"
        assert end - (off + n) >= arity, f"level {level} has {end - off - n} padding entries, fewer than K"
    assert (lay.numel * 4) % 128 == 0
    assert lay.log2_arity == arity.bit_length() - 1 and 2**lay.log2_arity == arity


@pytest.mark.parametrize("arity", [4, 32])
@pytest.mark.parametrize("capacity", [7, 1000, 1025, 2**26])
def test_shift_maps_leaf_to_ancestor(capacity, arity):
    lay = TreeLayout.build(capacity, arity)
    for leaf in [0, 1, arity - 1, arity, capacity // 2, capacity - 1]:
        leaf = min(leaf, capacity - 1)
        assert leaf >> lay.shift(lay.depth - 1) == leaf
        for level in range(lay.depth):
            ancestor = leaf >> lay.shift(level)
            assert ancestor == leaf // arity ** (lay.depth - 1 - level)
            assert 0 <= ancestor < lay.sizes[level]


def test_children_of_every_node_fit_before_the_next_level():
    """One unmasked K-wide load of the children of the last node of a level stays inside that level's block."""
    for capacity in [1, 7, 33, 1025, 2**26]:
        for arity in [4, 32]:
            lay = TreeLayout.build(capacity, arity)
            ends = list(lay.offsets[1:]) + [lay.numel]
            for level in range(1, lay.depth):
                last_parent = lay.sizes[level - 1] - 1
                assert lay.offsets[level] + (last_parent + 1) * arity <= ends[level]


def test_known_shapes():
    assert TreeLayout.build(1, 32).sizes == (1,)
    assert TreeLayout.build(32, 32).sizes == (32,)
    assert TreeLayout.build(33, 32).sizes == (2, 33)
    assert TreeLayout.build(1025, 4).sizes == (2, 5, 17, 65, 257, 1025)
    big = TreeLayout.build(2**26, 32)
    assert big.sizes == (2, 64, 2048, 2**16, 2**21, 2**26)
    assert TreeLayout.build(2**25, 32).depth == 5
    # about 3% more than the leaves (as the gper.ops.layout docstring says)
    assert big.numel < 1.04 * 2**26
    assert DEFAULT_ARITY in (16, 32)


@pytest.mark.parametrize("capacity, arity", [(0, 32), (-1, 32), (10, 3), (10, 1), (10, 0), (10, 48)])
def test_bad_layout_arguments(capacity, arity):
    with pytest.raises(ValueError, match="capacity|arity"):
        TreeLayout.build(capacity, arity)
