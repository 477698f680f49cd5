"""The buffer façade: slots and wrap-around, what it exposes (tree, rows, policy, storage views),
the sampled batch, its counts, its choice of device and back end, and no host syncs on the hot path.

Tests that take ``device`` also run on CUDA (marked ``gpu``); add() round trips of every dtype are
in ``test_storage.py``.
"""

from __future__ import annotations

import pytest
import torch

import gper
import gper.replay.core
from gper._device import canonical_device
from gper.ops import kernels
from gper.ops.tree import reference
from gper.replay.samplers import SamplingPolicy
from gper.replay.storage import RowStorage
from gper.replay.tree import PriorityTree
from helpers import (
    SPEC,
    assert_unchanged,
    dyadic_td,
    filled_wide_buffer,
    make_buffer,
    snapshot,
    transitions,
    wide_transitions,
)
from oracle import OracleBuffer


def test_slots_returned_wrap_around(backend, device):
    rb = make_buffer(7, backend, device, arity=4)
    orc = OracleBuffer(7, 0.6, 1e-6)
    added = 0
    for n in [3, 3, 3, 1, 7, 2, 6]:
        slots = rb.add(transitions(n, added))
        assert slots.dtype == torch.int64
        assert slots.tolist() == orc.add(n)
        added += n
        assert len(rb) == orc.size and rb.stats()["cursor"] == orc.cursor
        # every slot holds the latest item written there
        latest = {}
        for item in range(added):
            latest[(item) % 7] = item
        filled = rb.storage["action"][: len(rb)].tolist()
        assert filled == [latest[s] for s in range(len(rb))]
    assert rb.state_dict()["gen"].tolist() == orc.generations


@pytest.mark.parametrize("capacity, n", [(1, 5), (7, 8), (7, 30), (1000, 2500)])
def test_add_more_than_capacity_keeps_the_last_items(backend, device, capacity, n):
    rb = make_buffer(capacity, backend, device, arity=4)
    rb.add(transitions(2))  # start mid-ring
    slots = rb.add(transitions(n, 100))
    kept = list(range(100 + n - capacity, 100 + n))
    cursor = (2 + n) % capacity
    want_slots = [(2 + n - capacity + k) % capacity for k in range(capacity)]
    assert slots.tolist() == want_slots
    assert sorted(slots.tolist()) == list(range(capacity))
    assert rb.storage["action"][slots].tolist() == kept
    assert len(rb) == capacity and rb.stats()["cursor"] == cursor and rb.stats()["size"] == capacity
    # each slot is written once however many items passed over it: generations stay small
    gen = rb.state_dict()["gen"].tolist()
    assert gen == OracleBuffer_after(capacity, [2, n]).generations
    batch = rb.sample(64)
    assert set(batch["action"].tolist()) <= set(kept)


def OracleBuffer_after(capacity: int, adds: list[int]) -> OracleBuffer:
    orc = OracleBuffer(capacity, 0.6, 1e-6)
    for n in adds:
        orc.add(n)
    return orc


def test_storage_is_a_view_of_the_buffer(backend, device):
    rb = make_buffer(6, backend, device)
    views = rb.storage
    rb.add(transitions(3, 40))
    assert views["action"][:3].tolist() == [40, 41, 42], "storage views see later adds"
    assert set(views) == set(SPEC)


def test_new_items_enter_at_the_max_priority(backend, device):
    rb = make_buffer(6, backend, device, alpha=1.0, eps=0.5)
    rb.add(transitions(3))
    assert rb.priorities(torch.arange(3, device=device)).tolist() == [1.0] * 3, "the first items enter at priority 1"
    rb.update_priorities(torch.tensor([0, 1], device=device), torch.tensor([3.5, 0.5], device=device))
    rb.add(transitions(2, 3))
    got = rb.priorities(torch.arange(5, device=device)).cpu()
    torch.testing.assert_close(got, torch.tensor([4.0, 1.0, 1.0, 4.0, 4.0]), rtol=1e-6, atol=0)


def test_sampled_batch_is_a_mapping(device):
    rb = make_buffer(6, "torch", device)
    rb.add(transitions(6))
    batch = rb.sample(5)
    assert isinstance(batch, gper.SampledBatch)
    assert len(batch) == 3 and list(batch) == list(SPEC)
    assert dict(batch).keys() == SPEC.keys()
    assert batch.batch_size == 5
    assert batch.indices.shape == batch.weights.shape == batch.generations.shape == (5,)
    assert batch.indices.dtype == torch.int64 and batch.generations.dtype == torch.int32
    assert batch.weights.dtype == torch.float32
    text = repr(batch)
    assert "batch_size=5" in text and "obs" in text
    assert torch.equal(batch["obs"], rb.storage["obs"][batch.indices])


def test_len_and_stats_track_adds(backend, device):
    rb = make_buffer(5, backend, device)
    assert len(rb) == 0
    st = rb.stats()
    assert (st["size"], st["cursor"], st["max_priority"], st["total_priority"]) == (0, 0, 1.0, 0.0)
    rb.add(transitions(3))
    st = rb.stats()
    assert (len(rb), st["size"], st["cursor"], st["total_priority"]) == (3, 3, 3, 3.0)
    rb.add(transitions(4))
    st = rb.stats()
    assert (len(rb), st["size"], st["cursor"], st["total_priority"]) == (5, 5, 2, 5.0)


def test_sample_returns_fresh_tensors(backend, device):
    rb = make_buffer(6, backend, device)
    rb.add(transitions(6))
    a = rb.sample(8)
    idx = a.indices.clone()
    obs = a["obs"].clone()
    rb.sample(8)
    rb.add(transitions(6, 10))
    assert torch.equal(a.indices, idx) and torch.equal(a["obs"], obs), "a later call changed an earlier batch"


def test_public_state_objects(device):
    """The buffer's state is three public objects on its device, plus what describes it."""
    rb = make_buffer(10, "torch", device, arity=4, sampling="rank")
    assert rb.device == canonical_device(device)
    assert rb.capacity == 10 and rb.backend == "torch" and rb.spec == SPEC
    assert isinstance(rb.tree, PriorityTree) and rb.tree.capacity == 10 and rb.tree.layout.arity == 4
    assert rb.tree.kernels is kernels("tree", "torch", device) and rb.tree.device == rb.device
    assert isinstance(rb.rows, RowStorage) and rb.rows.rows.shape == (10, rb.rows.layout.row_bytes)
    assert rb.rows.rows.device == rb.device and rb.rows.names == tuple(SPEC)
    assert isinstance(rb.policy, SamplingPolicy) and rb.policy.mode == "rank" and rb.policy.weight_norm == "global"
    assert rb.policy.rank.keys.shape == (11,) and rb.policy.rank.keys.device == rb.device
    assert {k: v.data_ptr() for k, v in rb.storage.items()} == {k: v.data_ptr() for k, v in rb.rows.fields.items()}
    held = rb.rows.nbytes + sum(x.numel() * x.element_size() for x in (rb.tree.tree, rb.tree.mintree, rb.tree.gen))
    assert rb.nbytes_estimate >= held + rb.policy.rank.keys.numel() * 4
    # adds and updates reach the objects: the tree's counters and the rows
    rb.add(transitions(3))
    assert int(rb.tree.size) == 3 and rb.rows.fields["action"][:3].tolist() == [0, 1, 2]


def test_a_kernel_module_as_backend_is_used_as_it_is(device):
    """``backend=`` a module (kernel experiments): the buffer calls its functions and names it."""
    mod = make_buffer(50, reference, device, seed=4)
    named = make_buffer(50, "torch", device, seed=4)
    assert mod.backend == "gper.ops.tree.reference" and mod.tree.kernels is reference
    for rb in (mod, named):
        rb.add(transitions(30))
        b = rb.sample(64)
        rb.update_priorities(b, torch.linspace(0, 3, 64, device=device))
    a, b = mod.sample(128), named.sample(128)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)


def test_out_of_memory_on_the_cpu_raises(monkeypatch):
    """The CPU fallback is for a GPU that runs out of memory: on the CPU the error is raised."""

    def fail(layout, capacity, device):  # the rows are the buffer's largest allocation
        raise torch.OutOfMemoryError("simulated")

    monkeypatch.setattr(gper.replay.core, "RowStorage", fail)
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        gper.PrioritizedReplayBuffer(100, SPEC, device="cpu")


@pytest.mark.gpu
def test_cpu_fallback_on_out_of_memory(monkeypatch):
    def fail_on_cuda(layout, capacity, device):  # the rows are the buffer's largest allocation
        if device.type == "cuda":
            raise torch.OutOfMemoryError("simulated")
        return RowStorage(layout, capacity, device)

    monkeypatch.setattr(gper.replay.core, "RowStorage", fail_on_cuda)
    with pytest.warns(gper.GperWarning, match="falling back to the CPU"):
        rb = gper.PrioritizedReplayBuffer(100, SPEC, device="cuda")
    assert rb.device.type == "cpu" and rb.backend == "torch"
    with pytest.raises(torch.OutOfMemoryError):
        gper.PrioritizedReplayBuffer(100, SPEC, device="cuda", cpu_fallback=False)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
def test_hot_path_never_syncs(sampling, cuda_graphs):
    """add, sample and update_priorities never wait for the GPU (sync-debug mode raises if they do)."""
    rb = filled_wide_buffer(1 << 16, sampling=sampling, cuda_graphs=cuda_graphs)
    new = wide_transitions(256, "cuda")
    td = torch.randn(256, device="cuda")
    beta = torch.tensor(0.5, device="cuda")

    def calls():
        b = rb.sample(256, beta=beta)
        rb.update_priorities(b, td)
        rb.update_priorities(b.indices, td)
        rb.add(new)
        rb.sample(256, beta=0.7)

    for _ in range(2):  # compile kernels and capture graphs first: both may synchronise
        calls()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_settings_assigned_after_construction_take_effect_and_are_checked():
    """alpha, beta, eps, weight_norm and rank_refresh_interval can be changed on a built buffer
    (as attributes they always could): the next call uses them, a checkpoint records them, and a
    bad value is refused with the buffer unchanged. capacity and sampling are fixed."""
    rb = make_buffer(8, arity=2, seed=3)
    rb.add(transitions(2))
    rb.update_priorities(torch.tensor([0, 1]), dyadic_td(torch.tensor([0, 4]), None))  # priorities 1 and 4
    w_default = rb.sample(256).weights
    rb.beta = 1.0
    w_one = rb.sample(256).weights
    # with p = 1 and 4 (alpha = 0.6 of |td| + eps), the lighter leaf's weight is (p_min / p) ** -beta
    assert float(w_one.min()) < float(w_default.min())
    assert float(rb.sample(256, beta=0.4).weights.min()) == pytest.approx(float(w_default.min()))
    rb.alpha = 0.9
    assert rb.state_dict()["config"]["alpha"] == 0.9
    other = make_buffer(8, arity=2, seed=3, alpha=0.9, beta=1.0)
    other.load_state_dict(rb.state_dict())
    before = snapshot(rb)
    for name, bad in [
        ("alpha", 1.5),
        ("beta", -0.1),
        ("eps", 0.0),
        ("weight_norm", "max"),
        ("rank_refresh_interval", 0),
    ]:
        with pytest.raises(ValueError, match=name):
            setattr(rb, name, bad)
    for name in ("capacity", "sampling"):
        with pytest.raises(AttributeError):
            setattr(rb, name, getattr(rb, name))
    assert_unchanged(rb, before)
    assert rb.alpha == 0.9 and rb.beta == 1.0
    rb.weight_norm = "batch"
    assert float(rb.sample(64).weights.max()) == 1.0
    ranked = make_buffer(8, sampling="rank", rank_refresh_interval=100)
    ranked.add(transitions(4))
    ranked.rank_refresh_interval = 1
    ranked.update_priorities(torch.tensor([3]), torch.tensor([5.0]))  # refreshed at once: slot 3 is rank 1
    assert float(ranked.priorities(torch.tensor([3]))) == 1.0 and float(ranked.priorities(torch.tensor([0]))) < 1.0
