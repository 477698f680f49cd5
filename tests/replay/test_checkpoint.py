"""state_dict() / load_state_dict(): a restored buffer continues exactly where the original was."""

from __future__ import annotations

import pytest
import torch

import gper
from helpers import (
    EPS_DYADIC,
    TRITON_ON_CPU,
    assert_unchanged,
    assert_verbose_equal,
    dyadic_td,
    make_buffer,
    snapshot,
    transitions,
)


def used_buffer(backend: str, sampling: str = "proportional", device: torch.device | str = "cpu", **kw):
    rb = make_buffer(50, backend, device, arity=4, sampling=sampling, seed=17, rank_refresh_interval=3, **kw)
    rb.add(transitions(70))
    for step in range(4):
        batch = rb.sample(16)
        td = torch.randn(16, generator=torch.Generator().manual_seed(step))
        rb.update_priorities(batch, td.to(rb.device))
    return rb


def continue_run(rb, steps: int = 3):
    """What a buffer does next: samples (indices, weights, rows) and its trees after updates."""
    out = []
    for step in range(steps):
        batch = rb.sample(32)
        out.append((batch.indices.clone(), batch.weights.clone(), batch.rows.clone(), batch.generations.clone()))
        rb.update_priorities(batch, torch.linspace(-3, 3, 32, device=rb.device) * (step + 1))
        rb.add(transitions(5, 1000 + 5 * step))
    t = rb.tree
    out.append((t.tree.clone(), t.mintree.clone(), t.gen.clone(), t.counters.clone()))
    return out


def assert_same_future(a, b):
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        for k, (u, v) in enumerate(zip(x, y, strict=True)):
            assert_verbose_equal(u, v, what=f"step {step} item {k}")


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "rank", "uniform"])
def test_round_trip_into_a_fresh_buffer(backend, device, sampling):
    rb = used_buffer(backend, sampling, device)
    saved = snapshot(rb)
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in rb.state_dict().items()}
    fresh = make_buffer(50, backend, device, arity=4, sampling=sampling, seed=0, rank_refresh_interval=3)
    fresh.load_state_dict(state)
    assert len(fresh) == len(rb) == 50 and fresh.seed == 17
    assert_unchanged(fresh, saved)
    assert_same_future(continue_run(rb), continue_run(fresh))


def test_round_trip_through_a_file(backend, device, tmp_path):
    rb = used_buffer(backend, device=device)
    path = tmp_path / "buffer.pt"
    torch.save(rb.state_dict(), path)
    fresh = make_buffer(50, backend, device, arity=4, rank_refresh_interval=3)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert fresh.stats() == rb.stats()
    for name, view in rb.storage.items():
        assert torch.equal(fresh.storage[name], view), name
    assert_same_future(continue_run(rb), continue_run(fresh))


def test_state_dict_is_live_and_load_copies():
    """state_dict() returns the buffer's own tensors; load_state_dict() copies into its own."""
    rb = used_buffer("torch")
    sd = rb.state_dict()
    before = sd["counters"].clone()
    rb.sample(4)
    assert not torch.equal(sd["counters"], before), "state_dict() tensors should be the live ones"
    other = make_buffer(50, arity=4, rank_refresh_interval=3)
    tree = other.tree.tree
    other.load_state_dict(sd)
    assert other.tree.tree is tree and other.tree.tree.data_ptr() != rb.tree.tree.data_ptr()
    rb.sample(4)
    assert not torch.equal(other.tree.counters, rb.tree.counters)


def test_load_restores_rank_bookkeeping():
    """The count of updates since the last rank refresh travels with the state."""
    rb = used_buffer("torch", "rank")  # 4 updates, interval 3: one update since the refresh
    rb.update_priorities(torch.tensor([1, 2]), torch.tensor([5.0, 6.0]))  # two
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in rb.state_dict().items()}
    fresh = make_buffer(50, arity=4, sampling="rank", rank_refresh_interval=3)
    fresh.load_state_dict(state)
    before = rb.priorities(torch.arange(50))
    # the third update since the refresh refreshes both at the same call
    for buf in (rb, fresh):
        buf.update_priorities(torch.tensor([3]), torch.tensor([9.0]))
    after = rb.priorities(torch.arange(50))
    assert not torch.equal(after, before), "the interval was reached: ranks should have been refreshed"
    assert torch.equal(fresh.priorities(torch.arange(50)), after)


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
def test_checkpoint_moves_between_back_ends():
    """A torch checkpoint restored on Triton draws the same (dyadic priorities: identical trees)."""
    rb = make_buffer(40, "torch", arity=4, alpha=0.5, eps=EPS_DYADIC, seed=5)
    rb.add(transitions(55))
    batch = rb.sample(64)
    rb.update_priorities(batch, dyadic_td(torch.arange(64) % 4 * 2))
    tri = make_buffer(40, "triton", arity=4, alpha=0.5, eps=EPS_DYADIC)
    tri.load_state_dict(rb.state_dict())
    a, b = rb.sample(128), tri.sample(128)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.rows, b.rows)
    torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=0)


@pytest.mark.gpu
def test_checkpoint_moves_between_devices():
    """A CUDA checkpoint restored on the CPU (and back) draws the same: dyadic priorities, identical trees."""
    rb = make_buffer(40, "auto", "cuda", arity=4, alpha=0.5, eps=EPS_DYADIC, seed=5)
    rb.add(transitions(55))
    batch = rb.sample(64)
    rb.update_priorities(batch, dyadic_td(torch.arange(64) % 4 * 2).cuda())
    cpu = make_buffer(40, "torch", "cpu", arity=4, alpha=0.5, eps=EPS_DYADIC)
    cpu.load_state_dict(rb.state_dict())
    assert cpu.stats() == rb.stats()
    a, b = rb.sample(128), cpu.sample(128)
    assert torch.equal(a.indices.cpu(), b.indices) and torch.equal(a.rows.cpu(), b.rows)
    torch.testing.assert_close(a.weights.cpu(), b.weights, rtol=1e-5, atol=0)
    back = make_buffer(40, "auto", "cuda", arity=4, alpha=0.5, eps=EPS_DYADIC)
    back.load_state_dict(cpu.state_dict())
    assert torch.equal(back.sample(32).indices.cpu(), cpu.sample(32).indices)


MISMATCHES = [
    ({"capacity": 51}, "capacity"),
    ({"alpha": 0.5}, "alpha"),
    ({"beta": 0.5}, "beta"),
    ({"eps": 1e-3}, "eps"),
    ({"sampling": "stratified"}, "sampling"),
    ({"weight_norm": "batch"}, "weight_norm"),
    ({"arity": 8}, "arity"),
    ({"spec": {"obs": ((3,), torch.float32)}}, "spec"),
    ({"spec": {**{"obs": ((4,), torch.float32)}, "action": ((), torch.int64), "done": ((), torch.bool)}}, "spec"),
]


@pytest.mark.parametrize("change, key", MISMATCHES, ids=[m[1] + str(i) for i, m in enumerate(MISMATCHES)])
def test_config_mismatch_raises_and_changes_nothing(change, key):
    src = used_buffer("torch")
    kw = {"capacity": 50, "spec": src.spec, "device": "cpu", "arity": 4, "rank_refresh_interval": 3, **change}
    dst = gper.PrioritizedReplayBuffer(**kw)
    dst.add({name: torch.zeros((3, *shape), dtype=dtype) for name, (shape, dtype) in dst.spec.items()})
    before = snapshot(dst)
    with pytest.raises(ValueError, match=key):
        dst.load_state_dict(src.state_dict())
    assert_unchanged(dst, before)


@pytest.mark.parametrize("drop", ["rows", "tree", "gen", "counters", "scalars", "config", "seed", "host"])
def test_incomplete_state_raises_value_error_and_changes_nothing(drop):
    src = used_buffer("torch")
    state = dict(src.state_dict())
    del state[drop]
    dst = make_buffer(50, arity=4, rank_refresh_interval=3)
    dst.add(transitions(3))
    before = snapshot(dst)
    with pytest.raises(ValueError):
        dst.load_state_dict(state)
    assert_unchanged(dst, before)


def test_rows_packed_another_way_are_refused():
    """A state whose rows were packed with other field offsets (an older gper ordered fields
    differently) is refused, not read as scrambled fields."""
    src = used_buffer("torch")
    state = dict(src.state_dict())
    config = dict(state["config"])
    layout = dict(config["row_layout"])
    first, second = list(layout)[:2]
    layout[first], layout[second] = layout[second], layout[first]
    state["config"] = config | {"row_layout": layout}
    dst = make_buffer(50, arity=4, rank_refresh_interval=3)
    dst.add(transitions(3))
    before = snapshot(dst)
    with pytest.raises(ValueError, match="row_layout"):
        dst.load_state_dict(state)
    assert_unchanged(dst, before)


def test_wrong_tensor_shape_raises_and_changes_nothing():
    src = used_buffer("torch")
    state = dict(src.state_dict())
    state["gen"] = state["gen"][:-1]
    dst = make_buffer(50, arity=4, rank_refresh_interval=3)
    before = snapshot(dst)
    with pytest.raises(ValueError, match="gen"):
        dst.load_state_dict(state)
    assert_unchanged(dst, before)
