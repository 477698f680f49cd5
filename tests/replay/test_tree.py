"""The priority tree: its public methods on hand-made and fresh trees, and its invariants under the
buffer's adds and priority updates, on both back ends, against the oracle.

Covers the rules of the oracle (``tests/oracle.py``) at the level of the trees: wrap-around,
duplicate indices (last wins), stale updates, raw indices, NaN/Inf TD errors, and empty slots
that must never be drawn. Tests that take ``device`` also run on CUDA (marked ``gpu``).
"""

from __future__ import annotations

import math

import pytest
import torch

from gper.ops.state import (
    C_CURSOR,
    C_INVALID,
    C_NONFINITE,
    C_RNG,
    C_STALE,
    MODE_PROPORTIONAL,
    N_COUNTERS,
    N_SCALARS,
    S_BETA,
    S_MAXP,
)
from gper.ops.tree import reference
from gper.replay.tree import STATE_NAMES, PriorityTree
from helpers import (
    assert_at_rest,
    assert_verbose_allclose,
    assert_verbose_equal,
    check_tree,
    leaf_rtol,
    make_buffer,
    sample_fresh,
    transitions,
)
from oracle import OracleBuffer

CAPACITIES = [1, 2, 7, 1000, 1024, 1025]


def check_against_oracle(rb, orc: OracleBuffer, what: str):
    rtol = leaf_rtol(rb.device)
    check_tree(rb.tree, orc.priorities, what=what)
    st = rb.stats()
    assert (len(rb), st["size"], st["cursor"]) == (orc.size, orc.size, orc.cursor), what
    assert rb.tree.gen.tolist() == orc.generations, f"{what}: generations"
    assert math.isclose(st["max_priority"], orc.max_priority, rel_tol=rtol), what
    assert (st["stale_updates"], st["nonfinite_td"], st["invalid_indices"]) == (
        orc.stale_updates,
        orc.nonfinite_td,
        orc.invalid_indices,
    ), what
    # scratch the kernels share between calls must be back to its resting state
    assert_at_rest(rb.tree, what)
    if orc.size:
        filled = torch.arange(orc.size, device=rb.device)
        want = torch.tensor(orc.priorities[: orc.size], dtype=torch.float64)
        got = rb.priorities(filled).double().cpu()
        assert torch.allclose(got, want, rtol=rtol, atol=0), f"{what}: priorities()"


@pytest.mark.parametrize("arity", [4, 32])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_tree_invariants_after_adds_and_updates(backend, device, capacity, arity):
    """Random adds (some wrapping, some larger than the buffer), samples and updates (with stale
    entries, duplicates, NaN/Inf) keep both trees equal to the oracle's exact trees."""
    g = torch.Generator().manual_seed(capacity * 64 + arity)
    alpha, eps = 0.6, 1e-3
    rb = make_buffer(capacity, backend, device, arity=arity, alpha=alpha, eps=eps, seed=capacity)
    orc = OracleBuffer(capacity, alpha, eps)
    check_against_oracle(rb, orc, "empty")
    steps = 3 if backend == "triton" and device.type == "cpu" else 6  # the interpreter is slow
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
            rb.update_priorities(batch.indices, td.to(device))
            orc.update(batch.indices.tolist(), td.tolist())
        else:
            rb.update_priorities(batch, td.to(device))
            orc.update(batch.indices.tolist(), td.tolist(), batch.generations.tolist())
        check_against_oracle(rb, orc, f"step {step} after update of {b}")


def test_update_wraps_and_overwrites_keep_tree_exact_over_many_steps(device):
    """A longer run on the torch back end: the tree never drifts (recomputed, never delta-updated)."""
    g = torch.Generator().manual_seed(5)
    rb = make_buffer(1025, "torch", device, arity=4, alpha=0.7, eps=1e-2, seed=1)
    orc = OracleBuffer(1025, 0.7, 1e-2)
    added = 0
    for _step in range(60):
        n = int(torch.randint(1, 300, (1,), generator=g))
        rb.add(transitions(n, added))
        orc.add(n)
        added += n
        batch = rb.sample(256)
        td = torch.rand(256, generator=g) * 100
        rb.update_priorities(batch, td.to(device))
        orc.update(batch.indices.tolist(), td.tolist(), batch.generations.tolist())
    check_against_oracle(rb, orc, "after 60 steps")


def test_duplicate_indices_last_occurrence_wins(backend, device):
    rb = make_buffer(16, backend, device, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(16))
    idx = torch.tensor([3, 5, 3, 3, 9, 5], device=device)
    td = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], device=device)
    rb.update_priorities(idx, td)
    got = rb.priorities(torch.tensor([3, 5, 9], device=device)).tolist()
    rtol = leaf_rtol(device)
    assert_verbose_allclose(got, [4.5, 6.5, 5.5], rtol=rtol, what="a duplicate slot takes the last entry")
    orc = OracleBuffer(16, 1.0, 0.5)
    orc.add(16)
    orc.update(idx.tolist(), td.tolist())
    check_tree(rb.tree, orc.priorities)


def test_duplicates_across_kernel_blocks_are_deterministic(backend, device):
    """600 entries over 7 slots: the last occurrence lies in another Triton program than the first ones."""
    trees = []
    for _ in range(2):
        rb = make_buffer(7, backend, device, arity=4, alpha=1.0, eps=0.25)
        rb.add(transitions(7))
        idx = torch.arange(600, device=device) % 7
        td = torch.arange(600, dtype=torch.float32, device=device)
        rb.update_priorities(idx, td)
        last = [max(k for k in range(600) if k % 7 == slot) for slot in range(7)]
        want = torch.tensor([k + 0.25 for k in last])
        got = rb.priorities(torch.arange(7, device=device))
        assert_verbose_allclose(got, want, rtol=leaf_rtol(device), what="last occurrence")
        trees.append((rb.tree.tree[:-1].clone(), rb.tree.mintree[:-1].clone()))
    assert torch.equal(trees[0][0], trees[1][0]) and torch.equal(trees[0][1], trees[1][1])


def test_stale_updates_ignored_and_counted(backend, device):
    slots = torch.arange(8, device=device)
    rb = make_buffer(8, backend, device, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(8))
    batch = rb.sample(32)
    drawn = sorted(set(batch.indices.tolist()))
    # overwrite every slot: each entry of the batch is now stale
    rb.add(transitions(8, 100))
    t = rb.tree
    before = t.tree.clone(), t.mintree.clone()
    rb.update_priorities(batch, torch.full((32,), 9.0, device=device))
    assert torch.equal(t.tree[:-1], before[0][:-1]) and torch.equal(t.mintree[:-1], before[1][:-1])
    assert rb.priorities(slots).tolist() == [1.0] * 8
    st = rb.stats()
    assert st["stale_updates"] == 32 and st["max_priority"] == 1.0
    # half stale: overwrite only slots 0..3, the rest of a fresh batch applies
    batch = rb.sample(64)
    rb.add(transitions(4, 200))
    td = torch.arange(64, dtype=torch.float32, device=device)
    rb.update_priorities(batch, td)
    idx = batch.indices.tolist()
    fresh = [k for k in range(64) if idx[k] >= 4]
    assert rb.stats()["stale_updates"] == 32 + (64 - len(fresh))
    want = [1.0] * 8
    for k in fresh:
        want[idx[k]] = k + 0.5
    assert_verbose_allclose(rb.priorities(slots), torch.tensor(want), rtol=leaf_rtol(device))
    assert len(drawn) > 1


def test_raw_indices_skip_the_stale_check(backend, device):
    rb = make_buffer(8, backend, device, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(8))
    batch = rb.sample(4)
    rb.add(transitions(8, 100))
    rb.update_priorities(batch.indices, torch.full((4,), 2.0, device=device))
    assert_verbose_allclose(rb.priorities(batch.indices), torch.full((4,), 2.5), rtol=leaf_rtol(device))
    assert rb.stats()["stale_updates"] == 0


def test_nonfinite_td_maps_to_max_priority_and_is_counted(backend, device):
    rtol = leaf_rtol(device)
    rb = make_buffer(8, backend, device, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(8))
    rb.update_priorities(torch.tensor([0], device=device), torch.tensor([6.5], device=device))  # max priority 7
    td = torch.tensor([math.nan, math.inf, -math.inf, 100.0, 1.0], device=device)
    rb.update_priorities(torch.tensor([1, 2, 3, 4, 5], device=device), td)
    # non-finite entries take the max from before the call (7), not the 100.5 of this call
    want = torch.tensor([7.0, 7.0, 7.0, 7.0, 100.5, 1.5])
    assert_verbose_allclose(rb.priorities(torch.arange(6, device=device)), want, rtol=rtol)
    st = rb.stats()
    assert st["nonfinite_td"] == 3 and math.isclose(st["max_priority"], 100.5, rel_tol=rtol)
    assert math.isfinite(st["total_priority"])


def test_nan_td_before_any_update_uses_initial_max(backend, device):
    rb = make_buffer(4, backend, device, alpha=0.5, eps=1e-6)
    rb.add(transitions(4))
    slot = torch.tensor([2], device=device)
    rb.update_priorities(slot, torch.tensor([math.nan], dtype=torch.float64, device=device))
    assert rb.priorities(slot).tolist() == [1.0]


def test_max_priority_only_grows_and_new_items_enter_at_it(backend, device):
    rtol = leaf_rtol(device)
    rb = make_buffer(8, backend, device, arity=4, alpha=1.0, eps=0.5)
    rb.add(transitions(4))
    rb.update_priorities(torch.tensor([0, 1], device=device), torch.tensor([10.5, 0.0], device=device))
    # lower the former max slot
    rb.update_priorities(torch.tensor([0], device=device), torch.tensor([0.5], device=device))
    assert math.isclose(rb.stats()["max_priority"], 11.0, rel_tol=rtol)
    rb.add(transitions(2, 4))
    want = torch.tensor([1.0, 0.5, 1.0, 1.0, 11.0, 11.0])
    assert_verbose_allclose(rb.priorities(torch.arange(6, device=device)), want, rtol=rtol)


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform"])
def test_empty_slots_are_never_drawn(backend, device, sampling):
    rb = make_buffer(1000, backend, device, arity=4, sampling=sampling, seed=3)
    rb.add(transitions(37))
    idx = rb.sample(2048).indices
    assert int(idx.min()) >= 0 and int(idx.max()) < 37
    assert len(set(idx.tolist())) == 37


def test_update_accepts_int32_indices_and_any_float_td(backend, device):
    """int32 indices and float16/float64/bfloat16 TD errors give what int64/float32 give."""
    want = make_buffer(8, backend, device, arity=4, alpha=1.0, eps=0.5)
    want.add(transitions(8))
    want.update_priorities(torch.tensor([1, 6], device=device), torch.tensor([1.5, -3.5], device=device))
    for dtype in [torch.float16, torch.float64, torch.bfloat16]:
        rb = make_buffer(8, backend, device, arity=4, alpha=1.0, eps=0.5)
        rb.add(transitions(8))
        td = torch.tensor([1.5, -3.5], dtype=dtype, device=device, requires_grad=True)
        rb.update_priorities(torch.tensor([1, 6], dtype=torch.int32, device=device), td)
        assert torch.equal(rb.tree.tree, want.tree.tree), dtype


# ---- PriorityTree's own methods

LEAVES = [2.0, 0.0, 0.5, 3.0, 0.0, 1.0, 4.0, 0.25, 0.0, 1.5]


def test_a_new_tree_is_empty_and_at_rest(ops, device):
    t = PriorityTree(10, ops, device, arity=4)
    assert t.capacity == 10 and t.layout.capacity == 10 and t.layout.arity == 4 and t.kernels is ops
    assert t.tree.shape == t.mintree.shape == (t.layout.numel + 1,)
    assert t.tree.device.type == device.type and t.tree.dtype == t.mintree.dtype == torch.float32
    assert not bool(t.tree.any()) and bool((t.mintree == math.inf).all())
    assert t.gen.shape == (10,) and t.gen.dtype == torch.int32 and not bool(t.gen.any())
    assert t.counters.tolist() == [0] * N_COUNTERS and t.counters.dtype == torch.int64
    assert t.scalars.shape == (N_SCALARS,) and t.scalars[S_MAXP].item() == 1.0, "new items enter at 1"
    assert_at_rest(t, "new tree")
    assert float(t.total()) == 0.0 and float(t.min()) == math.inf


def test_from_leaves_builds_both_trees_and_sets_the_size(ops, device):
    t = PriorityTree.from_leaves(LEAVES, ops, arity=4, device=device)
    assert t.device.type == device.type and t.tree.device.type == device.type
    check_tree(t, LEAVES, "from_leaves")
    assert t.leaves().tolist() == LEAVES
    assert int(t.size) == 10 and int(t.cursor) == 0, "size defaults to every leaf"
    lo = t.layout.leaf_offset
    assert t.mintree[lo : lo + 10].tolist() == [p if p > 0 else math.inf for p in LEAVES]
    assert int(PriorityTree.from_leaves(LEAVES, ops, arity=2, size=3, device=device).size) == 3


def test_reads_are_0d_device_tensors(ops, device):
    t = PriorityTree.from_leaves(LEAVES, ops, arity=4, device=device)
    reads = {"total": (t.total(), torch.float64), "min": (t.min(), torch.float32)}
    reads |= {"max_priority": (t.max_priority(), torch.float32), "beta": (t.beta, torch.float32)}
    reads |= {"size": (t.size, torch.int64), "cursor": (t.cursor, torch.int64)}
    for name, (x, dtype) in reads.items():
        assert x.dim() == 0 and x.dtype == dtype and x.device.type == device.type, name
    assert float(t.total()) == math.fsum(LEAVES)
    assert float(t.min()) == 0.25, "the smallest positive leaf (zeros are empty)"
    assert float(t.max_priority()) == 1.0
    # the reads are views of the device state, not copies
    t.scalars[S_BETA] = 0.75
    t.scalars[S_MAXP] = 6.0
    t.counters[C_CURSOR] = 4
    assert (float(t.beta), float(t.max_priority()), int(t.cursor)) == (0.75, 6.0, 4)
    # the leaves are a view too: a write plus rebuild() shows in total() and min()
    t.leaves()[7] = 0.125
    t.mintree[t.layout.leaf_offset + 7] = 0.125
    t.rebuild()
    assert float(t.min()) == 0.125 and float(t.total()) == math.fsum(LEAVES) - 0.125


def test_priorities_are_nan_outside_the_filled_slots(ops, device):
    t = PriorityTree.from_leaves(LEAVES, ops, arity=4, size=6, device=device)
    idx = torch.tensor([0, 5, 3, 6, 9, -1, 1 << 40], device=device)
    got = t.priorities(idx)
    assert got.dtype == torch.float32 and got.device.type == device.type
    assert_verbose_equal(got, torch.tensor([2.0, 1.0, 3.0] + [math.nan] * 4), what="priorities")


def test_read_counts_are_host_numbers(ops, device):
    t = PriorityTree.from_leaves([1.0] * 8, ops, arity=4, size=6, device=device)
    assert t.read_counts() == {
        "size": 6,
        "cursor": 0,
        "rng_offset": 0,
        "invalid_indices": 0,
        "stale_updates": 0,
        "nonfinite_td": 0,
        "max_priority": 1.0,
        "total_priority": 8.0,
    }
    t.gen[2] = 1
    idx = torch.tensor([0, 1, 2, 7, -2], device=device)
    td = torch.tensor([1.5, math.nan, 1.5, 1.5, 1.5], device=device)
    seen = torch.zeros(5, dtype=torch.int32, device=device)
    t.update(idx, td, seen, alpha=1.0, eps=0.5)  # slot 2 stale, 7 and -2 out of range, one NaN
    sample_fresh(t, 5, MODE_PROPORTIONAL)
    counts = t.read_counts()
    assert all(isinstance(v, int) for k, v in counts.items() if k not in ("max_priority", "total_priority"))
    assert isinstance(counts["max_priority"], float) and isinstance(counts["total_priority"], float)
    assert (counts["invalid_indices"], counts["stale_updates"], counts["nonfinite_td"]) == (2, 1, 1)
    assert counts["rng_offset"] == int(t.counters[C_RNG]) > 0
    assert counts["max_priority"] == 2.0 and counts["total_priority"] == 2.0 + 1.0 + 6 * 1.0
    for name, i in {"invalid_indices": C_INVALID, "stale_updates": C_STALE, "nonfinite_td": C_NONFINITE}.items():
        assert counts[name] == int(t.counters[i]), name


def test_set_leaves_writes_both_trees_and_rebuilds(ops, device):
    t = PriorityTree.from_leaves([1.0] * 10, ops, arity=2, device=device)
    values = torch.tensor([0.5, 2.0, 1.0, 0.25], device=device)
    t.set_leaves(values)
    want = [0.5, 2.0, 1.0, 0.25] + [1.0] * 6
    check_tree(t, want, "set_leaves")
    assert float(t.min()) == 0.25


def test_state_dict_is_the_trees_own_tensors_and_loads_in_place(ops, device):
    t = PriorityTree.from_leaves(LEAVES, ops, arity=4, size=7, device=device)
    t.update(torch.tensor([1, 4], device=device), torch.tensor([3.5, 7.5], device=device), None, 1.0, 0.5)
    sd = t.state_dict()
    assert tuple(sd) == STATE_NAMES
    assert all(sd[name] is getattr(t, name) for name in STATE_NAMES), "not copies"
    saved = {k: v.clone() for k, v in sd.items()}
    fresh = PriorityTree(10, ops, device, arity=4)
    addresses = {name: getattr(fresh, name).data_ptr() for name in STATE_NAMES}
    fresh.load_state_dict(saved)
    for name in STATE_NAMES:
        assert getattr(fresh, name).data_ptr() == addresses[name], f"{name} was replaced, not copied into"
        assert_verbose_equal(getattr(fresh, name), saved[name], what=name)
    a, b = sample_fresh(t, 64, MODE_PROPORTIONAL, seed=3), sample_fresh(fresh, 64, MODE_PROPORTIONAL, seed=3)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y), "a loaded tree draws what the original draws"


def _damaged(state: dict, name: str, how: str) -> dict:
    state = dict(state)
    if how == "missing":
        del state[name]
    elif how == "shorter":
        state[name] = state[name][:-1]
    elif how == "dtype":
        state[name] = state[name].double() if state[name].dtype != torch.float64 else state[name].float()
    else:
        state[name] = state[name].tolist()
    return state


@pytest.mark.parametrize("how", ["missing", "shorter", "dtype", "not a tensor"])
@pytest.mark.parametrize("name", STATE_NAMES)
def test_check_state_refuses_wrong_tensors_and_load_changes_nothing(name, how):
    src = PriorityTree.from_leaves(LEAVES, reference, arity=4)
    dst = PriorityTree.from_leaves([1.0] * 10, src.kernels, arity=4, size=4)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    bad = _damaged(src.state_dict(), name, how)
    with pytest.raises(ValueError, match=f"'{name}' missing or of the wrong shape/dtype"):
        dst.check_state(bad)
    with pytest.raises(ValueError, match=rf"^load_state_dict\(\): '{name}'"):
        dst.load_state_dict(bad)
    with pytest.raises(ValueError, match=rf"^restore: '{name}'"):
        dst.check_state(bad, what="restore")
    for k, v in dst.state_dict().items():
        assert_verbose_equal(v, before[k], what=f"{k} after a refused load")
    dst.check_state(src.state_dict())  # the undamaged state passes


def test_estimate_bytes_covers_every_tensor(ops):
    for capacity, arity in [(1, 2), (10, 4), (1025, 32), (4096, 16)]:
        t = PriorityTree(capacity, ops, torch.device("cpu"), arity=arity)
        held = sum(x.numel() * x.element_size() for x in (t.tree, t.mintree, t.gen, t.claims))
        assert PriorityTree.estimate_bytes(t.layout) >= held, (capacity, arity)
