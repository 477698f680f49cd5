"""Float32 limits: priorities are clamped to ``P_MAX`` = 2^64 so no node of the sum tree can
overflow, ``eps`` is checked as a float32, IS weights stay finite across the whole range of
priorities, and a draw never leaves the filled slots, whatever the tree holds."""

from __future__ import annotations

import math

import pytest
import torch

import gper
from gper.ops.state import P_MAX
from helpers import assert_unchanged, make_buffer, snapshot

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}


def _filled(n: int, capacity: int, device, backend: str, **kw) -> gper.PrioritizedReplayBuffer:
    rb = gper.PrioritizedReplayBuffer(capacity, SPEC, device=device, backend=backend, **kw)
    k = torch.arange(n, device=device)
    rb.add({"obs": torch.stack([k * 1.0, -k * 1.0, k * 0.5], 1), "action": k})
    return rb


def _assert_draws_inside(rb, batch, what: str) -> None:
    idx = batch.indices
    size = len(rb)
    assert bool(((idx >= 0) & (idx < size)).all()), f"{what}: drew {idx.tolist()} outside [0, {size})"
    for name in SPEC:
        assert torch.equal(batch[name], rb.storage[name][idx]), f"{what}: rows of {name!r} are not the slots drawn"


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_huge_td_errors_are_clamped_and_every_node_stays_finite(device, backend, alpha):
    rb = _filled(10, 10, device, backend, alpha=alpha, beta=1.0)
    td = torch.tensor([3e38, -3.2e38, 1e30, 2.0**70, 1.0, 0.0, 5.0, 3.0e38, 7.0, 1e-3], device=device)
    rb.update_priorities(torch.arange(10, device=device), td)
    tree = rb.tree.tree[:-1]  # the last cell is the trash cell
    assert bool(torch.isfinite(tree).all()), "a node of the sum tree overflowed"
    p = rb.priorities(torch.arange(10, device=device))
    assert float(p.max()) <= P_MAX and float(rb.stats()["max_priority"]) <= P_MAX
    if alpha == 1.0:
        assert p[:4].tolist() == [P_MAX] * 4, "TD errors beyond 2^64 give the largest priority"
    assert math.isfinite(rb.stats()["total_priority"])
    for _ in range(5):
        batch = rb.sample(64)
        _assert_draws_inside(rb, batch, "after huge TD errors")
        assert bool(torch.isfinite(batch.weights).all()) and bool((batch.weights >= 0).all())


def test_weights_stay_finite_from_the_smallest_priority_to_the_largest(device, backend):
    """p_min = eps = 2^-126 and p = 2^64: the ratio (2^190) overflows float32; the weight does not."""
    rb = _filled(4, 4, device, backend, alpha=1.0, eps=2.0**-126)
    rb.update_priorities(torch.arange(4, device=device), torch.tensor([0.0, 3e38, 1.0, 2.0**64], device=device))
    for beta in (0.0, 0.1, 0.5):
        batch = rb.sample(256, beta=beta)
        w, p = batch.weights.double(), rb.priorities(batch.indices).double()
        want = torch.exp2(-beta * (torch.log2(p) - math.log2(2.0**-126)))
        assert bool(torch.isfinite(batch.weights).all()), f"beta={beta}: weights {batch.weights.unique().tolist()}"
        torch.testing.assert_close(w, want, rtol=1e-5, atol=0, msg=f"beta={beta}")


@pytest.mark.parametrize("eps", [1e-46, 0.0, -1e-6, 1e-39, 1e39, 2.0**65, float("inf"), float("nan")])
def test_eps_outside_normal_float32_is_refused(eps):
    with pytest.raises(ValueError, match="eps must be in"):
        make_buffer(8, eps=eps)
    rb = make_buffer(8)
    with pytest.raises(ValueError, match="eps must be in"):
        rb.eps = eps
    assert rb.eps == 1e-6


@pytest.mark.parametrize("eps", [2.0**-126, 1e-30, 2.0**64])
def test_eps_at_the_float32_limits_is_accepted(eps):
    assert make_buffer(8, eps=eps).eps == eps


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0])
@pytest.mark.parametrize("where", ["leaf", "inner", "top", "padding", "unfilled leaf"])
@pytest.mark.parametrize("sampling", ["proportional", "stratified"])
def test_a_descent_never_leaves_the_filled_slots_whatever_the_tree_holds(device, backend, value, where, sampling):
    """inf, NaN and negative values planted anywhere in the sum tree: every draw still lands on a
    filled slot and gathers that slot's rows (the weights of a corrupted tree mean nothing)."""
    rb = _filled(37, 100, device, backend, arity=4, sampling=sampling, alpha=1.0)
    lay = rb.tree.layout
    cell = {
        "leaf": lay.leaf_offset + 5,
        "unfilled leaf": lay.leaf_offset + 99,
        "inner": lay.offsets[-2] + 2,
        "top": lay.offsets[0],
        "padding": lay.offsets[-2] + lay.sizes[-2],
    }[where]
    rb.tree.tree[cell] = value
    for _ in range(4):
        _assert_draws_inside(rb, rb.sample(128), f"{value} planted at {where}")


def test_a_refused_eps_leaves_the_buffer_unchanged():
    rb = make_buffer(8)
    before = snapshot(rb)
    with pytest.raises(ValueError):
        rb.eps = 0.0
    assert_unchanged(rb, before)


def test_batch_normalised_weights_stay_finite_when_global_ones_round_to_zero(device, backend):
    rb = _filled(2, 2, device, backend, alpha=1.0, eps=2.0**-126, weight_norm="batch")
    rb.update_priorities(torch.arange(2, device=device), torch.tensor([0.0, 1e30], device=device))
    for _ in range(20):
        batch = rb.sample(8, beta=1.0)
        assert bool(torch.isfinite(batch.weights).all()), batch.weights.tolist()
        assert float(batch.weights.max()) == 1.0


def test_a_float64_td_error_past_float32_gets_the_largest_priority_not_the_nonfinite_one(device, backend):
    rb = _filled(4, 4, device, backend, alpha=1.0)
    rb.update_priorities(
        torch.arange(4, device=device),
        torch.tensor([1e39, -1e300, 1.0, float("inf")], dtype=torch.float64, device=device),
    )
    assert rb.priorities(torch.arange(2, device=device)).tolist() == [P_MAX, P_MAX]
    assert rb.stats()["nonfinite_td"] == 1
