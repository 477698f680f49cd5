"""The sample-slot reuse rule, checked on the CPU: a slot is free only when nothing outside it
refers to its outputs (Python references, views of them, tensors saved by autograd)."""

from __future__ import annotations

import torch

from gper.replay.graphs import SampleSlot


def _slot() -> SampleSlot:
    flat = torch.zeros(64)
    tensors = {"rows": flat[:48].view(8, 6), "weights": flat[56:], "obs": flat[:48].view(8, 6)[:, :4]}
    return SampleSlot(None, flat, tensors)


def test_fresh_slot_is_free():
    assert _slot().free()


def test_holding_an_output_makes_the_slot_busy_until_released():
    slot = _slot()
    held = slot.tensors["obs"]
    assert not slot.free()
    del held
    assert slot.free()


def test_a_new_view_of_an_output_makes_the_slot_busy():
    slot = _slot()
    view = slot.tensors["rows"][:, 2]
    assert not slot.free()
    del view
    assert slot.free()


def test_a_batch_like_holder_makes_the_slot_busy():
    slot = _slot()
    holder = dict(slot.tensors)
    assert not slot.free()
    holder.clear()
    assert slot.free()


def test_a_tensor_saved_by_autograd_makes_the_slot_busy():
    slot = _slot()
    w = torch.ones(4, requires_grad=True)
    loss = (slot.tensors["obs"] * w).sum()
    assert not slot.free()
    loss.backward()
    del loss
    assert slot.free()
