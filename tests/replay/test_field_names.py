"""Fields may be named like the batch's own outputs (``weights``, ``indices``, ``generations``,
``rows``) without replacing them: on the CPU, and on CUDA from the second ``sample`` on, when the
batch comes from a replayed sample slot whose outputs were prebuilt."""

from __future__ import annotations

import pytest
import torch

import gper

RESERVED = ("weights", "indices", "generations", "rows")


@pytest.mark.parametrize("name", RESERVED)
def test_a_field_named_like_a_batch_output_stays_a_field(device, name):
    spec = {name: ((2,), torch.float32), "action": ((), torch.int64)}
    rb = gper.PrioritizedReplayBuffer(16, spec, device=device, alpha=1.0, beta=1.0)
    k = torch.arange(16, device=device)
    rb.add({name: torch.stack([k * 1.0 + 1000, -k * 1.0], 1), "action": k})
    # distinct priorities: IS weights are then not all 1, and would differ from the field
    rb.update_priorities(k, k.float() + 1.0)
    for call in range(4):  # calls 2.. replay the buffer's captured sample on CUDA
        batch = rb.sample(8)
        idx = batch.indices
        assert idx.dtype == torch.int64 and idx.shape == (8,), f"call {call}: batch.indices is {idx.dtype}"
        assert torch.equal(batch["action"], idx), f"call {call}"
        assert torch.equal(batch[name][:, 0], idx.float() + 1000), f"call {call}: batch[{name!r}] is not the field"
        assert batch.weights.dtype == torch.float32 and batch.weights.shape == (8,)
        p = idx.float() + 1.0
        want = (p / 1.0) ** -1.0  # (p_i / p_min) ** -beta, p_min = 1
        torch.testing.assert_close(batch.weights, want, rtol=1e-5, atol=0)
        assert batch.generations.dtype == torch.int32 and torch.equal(batch.generations, torch.ones_like(idx).int())
        assert batch.rows.dtype == torch.int32 and batch.rows.shape[0] == 8
        # the update lands on the sampled slots, not stale, not on the field's values
        before = rb.stats()["stale_updates"]
        rb.update_priorities(batch, torch.full((8,), 3.0, device=device))
        assert rb.stats()["stale_updates"] == before, f"call {call}: the update counted as stale"
        assert torch.equal(rb.priorities(idx), torch.full((8,), 3.0 + rb.eps, device=device)), f"call {call}"
        rb.update_priorities(k, k.float() + 1.0)


@pytest.mark.parametrize("name", RESERVED)
def test_prebuilt_slot_outputs_keep_fields_and_batch_outputs_apart(name):
    """The CPU view of what a replayed sample slot hands out: its prebuilt views."""
    from gper.replay.batch import FlatSample
    from gper.replay.storage import RowLayout

    flat_sample = FlatSample(RowLayout.build({name: ((), torch.float32), "x": ((), torch.int64)}))
    flat = flat_sample.empty(4, torch.device("cpu"))
    parts = flat_sample.split(flat)
    batch = flat_sample.batch(flat_sample.with_fields(flat), with_fields=True)
    for out in ("rows", "indices", "generations", "weights"):
        got = getattr(batch, out)
        assert got.data_ptr() == parts[out].data_ptr() and got.dtype == parts[out].dtype, out
    assert batch[name].dtype == torch.float32 and batch[name].shape == (4,)
