"""Storage rows: where each field of a transition sits in its row (RowLayout), the rows themselves
(RowStorage: views, checks, writes), and add() round trips: what goes in comes back out, bit for bit.

RowLayout: fields aligned, disjoint, and 16-byte aligned when their size allows.
"""

from __future__ import annotations

import math

import pytest
import torch

import gper
from gper.replay.storage import RowLayout, RowStorage
from helpers import SPEC, make_buffer, transitions

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
    """The raw bytes of a tensor, on the CPU, so NaN and -0.0 compare exactly."""
    return x.contiguous().view(torch.uint8).cpu()


# ---- RowLayout

ROW_SPECS = [
    {"obs": ((51,), torch.float32), "next_obs": ((51,), torch.float32), "action": ((), torch.int64)},
    {"obs": ((52,), torch.float32), "next_obs": ((52,), torch.float32), "action": ((), torch.int64)},
    {"a": ((3,), torch.uint8), "b": ((), torch.int64), "c": ((2,), torch.float16), "d": ((4,), torch.float32)},
    {"x": ((2, 3), torch.bfloat16), "y": ((), torch.bool), "z": ((8,), torch.float64), "w": ((), torch.int32)},
]


@pytest.mark.parametrize("spec", ROW_SPECS)
def test_row_fields_aligned_and_disjoint(spec):
    lay = RowLayout.build(spec)
    assert [f.name for f in lay.fields] == list(spec), "fields keep the spec's order"
    assert lay.row_bytes % 16 == 0
    spans = sorted((f.offset, f.offset + f.nbytes) for f in lay.fields)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False)), "fields overlap"
    assert spans[-1][1] <= lay.row_bytes
    for f in lay.fields:
        assert f.offset % f.dtype.itemsize == 0, f"{f.name} at byte {f.offset} is not aligned to its elements"
        if f.nbytes % 16 == 0:
            assert f.offset % 16 == 0, f"{f.name} ({f.nbytes} bytes) does not start 16-byte aligned"


def test_padded_obs_rows_feed_a_matmul_without_a_copy():
    """52-float observations start the row: the batch's view is 16-byte aligned with a row stride."""
    lay = RowLayout.build(ROW_SPECS[1])
    rows = torch.zeros(8, lay.words, dtype=torch.int32)
    obs, next_obs = lay.view(rows, "obs"), lay.view(rows, "next_obs")
    assert (obs.data_ptr() - rows.data_ptr(), next_obs.data_ptr() - rows.data_ptr()) == (0, 208)
    assert obs.stride() == (lay.words, 1) and not obs.is_contiguous()


# ---- RowStorage: the rows, their field views, the checks and writes of a batch


def test_row_storage_views_share_the_rows(device):
    lay = RowLayout.build(WEIRD_SPEC)
    st = RowStorage(lay, 6, device)
    assert st.rows.shape == (6, lay.row_bytes) and st.rows.dtype == torch.uint8
    assert st.rows.device.type == device.type and not bool(st.rows.any()), "rows start zeroed"
    assert st.words.dtype == torch.int32 and st.words.shape == (6, lay.words)
    assert st.words.data_ptr() == st.rows.data_ptr(), "words are the same memory as rows"
    assert st.names == tuple(WEIRD_SPEC) and list(st.fields) == list(WEIRD_SPEC)
    assert st.nbytes == 6 * lay.row_bytes
    for f in lay.fields:
        view = st.fields[f.name]
        assert view.shape == (6, *f.shape) and view.dtype == f.dtype, f.name
        assert view.untyped_storage().data_ptr() == st.rows.untyped_storage().data_ptr(), f.name
    st.words.fill_(-1)
    assert st.fields["word"].tolist() == [-1] * 6, "a field view sees writes to the rows"


def test_row_storage_write_touches_only_the_rows_named(device):
    st = RowStorage(RowLayout.build(WEIRD_SPEC), 13, device)
    data = weird_batch(4, 3)
    pos = torch.tensor([7, 0, 12, 3], device=device)
    st.write(pos, tuple(data[name] for name in st.names))  # CPU values into device rows
    for name in st.names:
        assert torch.equal(bits(st.fields[name][pos]), bits(data[name])), name
    untouched = [i for i in range(13) if i not in pos.tolist()]
    assert not bool(st.rows[untouched].any()), "rows not written stay zero"
    with pytest.raises(ValueError):
        st.write(pos, tuple(data[name] for name in st.names)[:-1])  # one value per field, no fewer


def test_row_storage_check_batch_returns_the_size_and_checks_like_the_layout(device):
    st = RowStorage(RowLayout.build(SPEC), 4, device)
    assert st.check_batch(transitions(9)) == 9, "a batch larger than the storage is the buffer's business"
    assert st.check_batch(transitions(2, device=device)) == 2
    with pytest.raises(KeyError, match="missing fields"):
        st.check_batch({"obs": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="meta"):
        st.check_batch(transitions(2, device="meta"))


# ---- add() round trips through a buffer


def test_weird_dtypes_and_shapes_round_trip_exactly(backend, device):
    rb = gper.PrioritizedReplayBuffer(13, WEIRD_SPEC, device=device, backend=backend, arity=4)
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
        assert torch.equal(bits(batch[name]), bits(data[name][batch.indices.cpu()])), name


def test_add_copies_its_input(backend, device):
    rb = make_buffer(8, backend, device)
    data = transitions(4, device=device)
    rb.add(data)
    data["obs"].fill_(-7.0)
    data["action"].fill_(-7)
    assert rb.storage["action"][:4].tolist() == [0, 1, 2, 3]
    assert float(rb.storage["obs"][:4].abs().sum()) > 0


def test_add_non_contiguous_inputs(backend, device):
    rb = make_buffer(8, backend, device)
    base = torch.arange(30.0, device=device).view(3, 10)
    obs = base.t()[:5]  # [5, 3] with strides (1, 10)
    assert not obs.is_contiguous()
    action = torch.arange(10, device=device)[::2]
    done = torch.tensor([True, False] * 5, device=device)[::2]
    rb.add({"obs": obs, "action": action, "done": done})
    assert torch.equal(rb.storage["obs"][:5], obs)
    assert rb.storage["action"][:5].tolist() == [0, 2, 4, 6, 8]
    assert rb.storage["done"][:5].tolist() == [True] * 5


def field_bytes(rb: gper.PrioritizedReplayBuffer, name: str) -> range:
    """Bytes of row 0 that field ``name``'s storage view covers."""
    v = rb.storage[name]
    assert v[0].is_contiguous(), name
    start = v.storage_offset() * v.element_size()
    return range(start, start + v[0].numel() * v.element_size())


def test_field_views_are_disjoint_and_inside_the_row():
    rb = gper.PrioritizedReplayBuffer(3, WEIRD_SPEC, device="cpu")
    row_bytes = rb.state_dict()["rows"].shape[1]
    assert row_bytes == rb.rows.layout.row_bytes
    spans = {name: field_bytes(rb, name) for name in WEIRD_SPEC}
    for name, span in spans.items():
        assert 0 <= span.start and span.stop <= row_bytes, (name, span, row_bytes)
        assert span.start % WEIRD_SPEC[name][1].itemsize == 0, f"{name} is not aligned to its element size"
        for other, o in spans.items():
            if other != name:
                assert span.stop <= o.start or o.stop <= span.start, f"{name} {span} overlaps {other} {o}"


def test_uint8_field_beside_a_float_field(device):
    """A uint8 field must not be placed over the float field packed before it in the row."""
    rb = gper.PrioritizedReplayBuffer(4, {"a": ((4,), torch.float32), "p": ((3,), torch.uint8)}, device=device)
    a = torch.full((2, 4), 1.5, device=device)
    p = torch.full((2, 3), 7, dtype=torch.uint8, device=device)
    rb.add({"a": a, "p": p})
    assert torch.equal(rb.storage["a"][:2], a)
    assert torch.equal(rb.storage["p"][:2], p)
    batch = rb.sample(8)
    assert torch.equal(batch["a"], a[:1].expand(8, 4)) and torch.equal(batch["p"], p[:1].expand(8, 3))
