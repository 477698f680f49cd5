"""add(), storage and the sampled batch: what goes in comes back out, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

import gper
from helpers import SPEC, make_buffer, transitions
from oracle import OracleBuffer

WEIRD_SPEC = {
    "flag": ((), torch.bool),
    "small": ((), torch.int8),
    "count": ((), torch.int16),
    "big": ((2,), torch.int64),
    "half": ((3,), torch.float16),
    "brain": ((2,), torch.bfloat16),
    "grid": ((2, 3), torch.float64),
    "pixels": ((4, 5), torch.uint8),
    "one": ((1,), torch.float32),
    "word": ((), torch.int32),
}


def weird_batch(n: int, start: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(start)
    k = torch.arange(start, start + n)
    half = torch.randn(n, 3, generator=g).half()
    half[0] = torch.tensor([-0.0, math.inf, 6e-8])  # signed zero, infinity, a float16 subnormal
    return {
        "flag": k % 2 == 1,
        "small": (k % 256 - 128).to(torch.int8),
        "count": (k * 977 % 65536 - 32768).to(torch.int16),
        "big": torch.stack([k * (2**40 + 3), -k - 2**62], 1),
        "half": half,
        "brain": torch.randn(n, 2, generator=g).bfloat16(),
        "grid": torch.randn(n, 2, 3, generator=g, dtype=torch.float64) * 1e300,
        "pixels": torch.randint(0, 256, (n, 4, 5), generator=g, dtype=torch.uint8),
        "one": torch.full((n, 1), math.nan),
        "word": (k - 2**31 + 7).to(torch.int32),
    }


def bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so NaN and -0.0 compare exactly."""
    return x.contiguous().view(torch.uint8)


def test_weird_dtypes_and_shapes_round_trip_exactly(backend):
    rb = gper.PrioritizedReplayBuffer(13, WEIRD_SPEC, device="cpu", backend=backend, arity=4)
    assert rb.spec == WEIRD_SPEC
    data = weird_batch(9)
    slots = rb.add(data)
    assert slots.tolist() == list(range(9))
    for name, (shape, dtype) in WEIRD_SPEC.items():
        view = rb.storage[name]
        assert view.shape == (13, *shape) and view.dtype == dtype, name
        assert torch.equal(bits(view[:9]), bits(data[name])), name
    batch = rb.sample(64)
    for name in WEIRD_SPEC:
        assert batch[name].shape == (64, *WEIRD_SPEC[name][0]) and batch[name].dtype == WEIRD_SPEC[name][1]
        assert torch.equal(bits(batch[name]), bits(data[name][batch.indices])), name


def test_slots_returned_wrap_around(backend):
    rb = make_buffer(7, backend, arity=4)
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
def test_add_more_than_capacity_keeps_the_last_items(backend, capacity, n):
    rb = make_buffer(capacity, backend, arity=4)
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


def test_add_copies_its_input(backend):
    rb = make_buffer(8, backend)
    data = transitions(4)
    rb.add(data)
    data["obs"].fill_(-7.0)
    data["action"].fill_(-7)
    assert rb.storage["action"][:4].tolist() == [0, 1, 2, 3]
    assert float(rb.storage["obs"][:4].abs().sum()) > 0


def test_add_non_contiguous_inputs(backend):
    rb = make_buffer(8, backend)
    base = torch.arange(30.0).view(3, 10)
    obs = base.t()[:5]  # [5, 3] with strides (1, 10)
    assert not obs.is_contiguous()
    action = torch.arange(10)[::2]
    done = torch.tensor([True, False] * 5)[::2]
    rb.add({"obs": obs, "action": action, "done": done})
    assert torch.equal(rb.storage["obs"][:5], obs)
    assert rb.storage["action"][:5].tolist() == [0, 2, 4, 6, 8]
    assert rb.storage["done"][:5].tolist() == [True] * 5


def test_storage_is_a_view_of_the_buffer(backend):
    rb = make_buffer(6, backend)
    views = rb.storage
    rb.add(transitions(3, 40))
    assert views["action"][:3].tolist() == [40, 41, 42], "storage views see later adds"
    assert set(views) == set(SPEC)


def test_new_items_enter_at_the_max_priority(backend):
    rb = make_buffer(6, backend, alpha=1.0, eps=0.5)
    rb.add(transitions(3))
    assert rb.priorities(torch.arange(3)).tolist() == [1.0] * 3, "the first items enter at priority 1"
    rb.update_priorities(torch.tensor([0, 1]), torch.tensor([3.5, 0.5]))
    rb.add(transitions(2, 3))
    got = rb.priorities(torch.arange(5))
    torch.testing.assert_close(got, torch.tensor([4.0, 1.0, 1.0, 4.0, 4.0]), rtol=1e-6, atol=0)


def test_sampled_batch_is_a_mapping():
    rb = make_buffer(6)
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


def test_len_and_stats_track_adds(backend):
    rb = make_buffer(5, backend)
    assert len(rb) == 0
    st = rb.stats()
    assert (st["size"], st["cursor"], st["max_priority"], st["total_priority"]) == (0, 0, 1.0, 0.0)
    rb.add(transitions(3))
    st = rb.stats()
    assert (len(rb), st["size"], st["cursor"], st["total_priority"]) == (3, 3, 3, 3.0)
    rb.add(transitions(4))
    st = rb.stats()
    assert (len(rb), st["size"], st["cursor"], st["total_priority"]) == (5, 5, 2, 5.0)


def test_sample_returns_fresh_tensors(backend):
    rb = make_buffer(6, backend)
    rb.add(transitions(6))
    a = rb.sample(8)
    idx = a.indices.clone()
    obs = a["obs"].clone()
    rb.sample(8)
    rb.add(transitions(6, 10))
    assert torch.equal(a.indices, idx) and torch.equal(a["obs"], obs), "a later call changed an earlier batch"


def field_bytes(rb: gper.PrioritizedReplayBuffer, name: str) -> range:
    """Bytes of row 0 that field ``name``'s storage view covers."""
    v = rb.storage[name]
    assert v[0].is_contiguous(), name
    start = v.storage_offset() * v.element_size()
    return range(start, start + v[0].numel() * v.element_size())


def test_field_views_are_disjoint_and_inside_the_row():
    rb = gper.PrioritizedReplayBuffer(3, WEIRD_SPEC, device="cpu")
    row_bytes = rb.state_dict()["rows"].shape[1]
    spans = {name: field_bytes(rb, name) for name in WEIRD_SPEC}
    for name, span in spans.items():
        assert 0 <= span.start and span.stop <= row_bytes, (name, span, row_bytes)
        assert span.start % WEIRD_SPEC[name][1].itemsize == 0, f"{name} is not aligned to its element size"
        for other, o in spans.items():
            if other != name:
                assert span.stop <= o.start or o.stop <= span.start, f"{name} {span} overlaps {other} {o}"


def test_uint8_field_beside_a_float_field():
    """A uint8 field must not be placed over the float field packed before it in the row."""
    rb = gper.PrioritizedReplayBuffer(4, {"a": ((4,), torch.float32), "p": ((3,), torch.uint8)}, device="cpu")
    a = torch.full((2, 4), 1.5)
    p = torch.full((2, 3), 7, dtype=torch.uint8)
    rb.add({"a": a, "p": p})
    assert torch.equal(rb.storage["a"][:2], a)
    assert torch.equal(rb.storage["p"][:2], p)
    batch = rb.sample(8)
    assert torch.equal(batch["a"], a[:1].expand(8, 4)) and torch.equal(batch["p"], p[:1].expand(8, 3))
