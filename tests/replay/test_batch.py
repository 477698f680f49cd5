"""What ``sample`` returns: the flat output layout of one call (FlatSample) and the batch over it
(SampledBatch)."""

from __future__ import annotations

import pytest
import torch

from gper.replay.batch import FlatSample, SampledBatch
from gper.replay.storage import RowLayout
from helpers import SPEC

WIDE = {"obs": ((52,), torch.float32), "action": ((), torch.int64), "done": ((), torch.bool)}


@pytest.mark.parametrize("spec", [SPEC, WIDE], ids=["small", "wide"])
@pytest.mark.parametrize("b", [1, 7, 64])
def test_flat_sample_splits_one_tensor_at_fixed_offsets(device, spec, b):
    """rows [B, W] int32, then indices [B] int64 (2B words), generations [B] int32, weights [B] float32:
    contiguous, in that order, covering the flat tensor exactly, each aligned for its dtype."""
    lay = RowLayout.build(spec)
    flat_sample = FlatSample(lay)
    w = lay.words
    flat = flat_sample.empty(b, device)
    assert flat.shape == (b * (w + 4),) and flat.dtype == torch.int32 and flat.device.type == device.type
    parts = flat_sample.split(flat)
    assert list(parts) == ["rows", "indices", "generations", "weights"]
    want = {
        "rows": ((b, w), torch.int32, 0),
        "indices": ((b,), torch.int64, b * w),
        "generations": ((b,), torch.int32, b * w + 2 * b),
        "weights": ((b,), torch.float32, b * w + 3 * b),
    }
    base = flat.data_ptr()
    for name, (shape, dtype, word) in want.items():
        x = parts[name]
        assert (tuple(x.shape), x.dtype) == (shape, dtype), name
        assert x.data_ptr() - base == 4 * word, f"{name} starts at word {(x.data_ptr() - base) // 4}, not {word}"
        assert x.data_ptr() % x.element_size() == 0 and x.is_contiguous(), name
    end = parts["weights"].data_ptr() + 4 * b
    assert end == base + 4 * flat.numel(), "the parts cover the flat tensor exactly"
    # writes through one part land where the split says
    flat.zero_()
    parts["indices"].fill_(-2)
    assert flat[b * w : b * w + 2 * b].tolist() == [-2, -1] * b, "int64 -2 as two little-endian int32 words"


def test_flat_sample_with_fields_and_batch(device):
    lay = RowLayout.build(SPEC)
    fs = FlatSample(lay)
    flat = fs.empty(5, device)
    flat.zero_()
    parts = fs.with_fields(flat)
    # field views sit under ("field", name), apart from the outputs: a field may be named "weights"
    assert set(parts) == {"rows", "indices", "generations", "weights", *(("field", n) for n in SPEC)}
    for name in SPEC:
        assert torch.equal(parts["field", name], lay.view(parts["rows"], name)), name
    prebuilt = fs.batch(parts, with_fields=True)
    assert isinstance(prebuilt, SampledBatch) and prebuilt["obs"] is parts["field", "obs"], "the slot's own views"
    lazy = fs.batch(fs.split(flat))
    assert lazy.rows.data_ptr() == flat.data_ptr() and lazy.batch_size == 5
    assert lazy["obs"] is lazy["obs"], "a field view is made once"
    assert lazy.indices.data_ptr() == parts["indices"].data_ptr()


def test_sampled_batch_mapping_and_errors():
    lay = RowLayout.build(SPEC)
    rows = torch.zeros(3, lay.words, dtype=torch.int32)
    lay.view(rows, "action")[:] = torch.tensor([4, 5, 6])
    batch = SampledBatch(lay, rows, torch.arange(3), torch.ones(3), torch.zeros(3, dtype=torch.int32))
    assert list(batch) == list(SPEC) and len(batch) == 3 and batch.batch_size == 3
    assert batch["action"].tolist() == [4, 5, 6]
    with pytest.raises(KeyError, match=r"no field 'reward'; the batch has \['obs', 'action', 'done'\]"):
        batch["reward"]
    assert repr(batch).startswith("SampledBatch(batch_size=3, obs: (3,) torch.float32")
