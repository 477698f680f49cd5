"""The kernels of both back ends against the plain-Python oracle (``tests/oracle.py``).

Driven through the buffer (the parity script, replayed on the oracle: priorities, trees and IS
weights of every batch; rank weights from the stored keys) and directly on hand-made trees
(updates with duplicates, out-of-range and stale entries and non-finite TD errors).
"""

from __future__ import annotations

import math

import pytest
import torch

from gper.replay.tree import PriorityTree
from helpers import (
    EPS_DYADIC,
    PARITY_ALPHA,
    assert_at_rest,
    assert_verbose_allclose,
    check_tree,
    dyadic_td,
    leaf_rtol,
    parity_script,
)
from oracle import OracleBuffer, is_weights, rank_weights


@pytest.mark.parametrize("capacity, arity", [(7, 4), (1025, 4)])
def test_script_matches_the_oracle(backend, capacity, arity):
    """The parity script, replayed on the oracle: priorities, trees and IS weights of every batch."""
    rb, seen = parity_script(backend, capacity, arity, "proportional")
    orc = OracleBuffer(capacity, PARITY_ALPHA, EPS_DYADIC)
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
    check_tree(rb.tree, orc.priorities)
    assert rb.tree.leaves().tolist() == orc.priorities
    assert rb.stats()["stale_updates"] == orc.stale_updates


def test_rank_weights_match_the_oracle(backend):
    """Both back ends store the keys ``|td| + eps`` the same way, so the ranks agree with the oracle."""
    rb, _ = parity_script(backend, 7, 4, "rank")
    rb.refresh_ranks()
    keys = rb.policy.rank.keys[:7].tolist()
    want = rank_weights(keys, PARITY_ALPHA)
    assert_verbose_allclose(rb.priorities(torch.arange(7)), torch.tensor(want), rtol=1e-6, what=backend)


@pytest.mark.parametrize("capacity, arity", [(7, 2), (100, 4), (1025, 32)])
def test_update_kernel_matches_the_oracle_on_a_hand_made_tree(ops, device, capacity, arity):
    """Three update calls on a tree of random leaves whose size counter stops short of capacity:
    entries out of [0, size), stale generations (two calls), duplicates and NaN/Inf TD errors. The
    trees, the counts and the max priority follow the oracle's rules exactly (leaves to rounding)."""
    g = torch.Generator().manual_seed(capacity + arity)
    alpha, eps = 0.6, 1e-3
    size = capacity - capacity // 5
    leaves = (torch.rand(capacity, generator=g) * 4 + 0.25).tolist()
    gens = torch.randint(0, 3, (capacity,), generator=g, dtype=torch.int32)
    t = PriorityTree.from_leaves(leaves, ops, arity=arity, size=size, device=device)
    t.gen.copy_(gens)
    orc = OracleBuffer(capacity, alpha, eps)
    orc.priorities, orc.size, orc.generations = list(leaves), size, gens.tolist()
    check_tree(t, orc.priorities, "from_leaves")
    for call in range(3):
        b = 300
        idx = torch.randint(-3, capacity + 3, (b,), generator=g)
        td = torch.randn(b, generator=g) * 5
        td[::17] = math.nan
        td[5::41] = -math.inf
        seen = None
        if call:
            seen = gens[idx.clamp(0, capacity - 1)]
            seen[::7] += 1  # sampled before an overwrite: stale
        t.update(idx.to(device), td.to(device), None if seen is None else seen.to(device), alpha, eps)
        orc.update(idx.tolist(), td.tolist(), None if seen is None else seen.tolist())
        what = f"call {call}"
        check_tree(t, orc.priorities, what)
        counts = t.read_counts()
        got = (counts["invalid_indices"], counts["stale_updates"], counts["nonfinite_td"])
        assert got == (orc.invalid_indices, orc.stale_updates, orc.nonfinite_td), what
        assert math.isclose(counts["max_priority"], orc.max_priority, rel_tol=leaf_rtol(device)), what
        assert_at_rest(t, what)
    assert orc.invalid_indices > 0 and orc.stale_updates > 0 and orc.nonfinite_td > 0, "the calls should make each case"
