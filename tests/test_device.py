"""``gper._device``: one place that turns a device request into a concrete ``torch.device``."""

from __future__ import annotations

import pytest
import torch

import gper
from gper._device import canonical_device, on_own_device


@pytest.mark.parametrize("request_", [None, "auto"])
def test_auto_is_the_current_gpu_or_the_cpu(request_):
    want = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert canonical_device(request_) == want
    assert canonical_device() == want, "auto is the default"


@pytest.mark.parametrize("request_", ["cpu", torch.device("cpu"), "meta"])
def test_other_devices_pass_through(request_):
    assert canonical_device(request_) == torch.device(request_)


def test_cuda_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for request_ in ["cuda", "cuda:1", torch.device("cuda", 0)]:
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            canonical_device(request_)
    assert canonical_device("auto") == torch.device("cpu")


def test_a_bad_name_is_torchs_error():
    with pytest.raises(RuntimeError):
        canonical_device("gpu")


@pytest.mark.gpu
def test_cuda_gets_the_current_index():
    index = torch.cuda.current_device()
    assert canonical_device("cuda") == torch.device("cuda", index)
    assert canonical_device(torch.device("cuda")) == torch.device("cuda", index)
    assert canonical_device("cuda:0") == torch.device("cuda", 0), "an explicit index is kept"


class _OnDevice:
    def __init__(self, device):
        self.device = torch.device(device)

    @on_own_device
    def current(self, x, scale=1):
        """The current CUDA device while the method runs (None on a CPU object)."""
        return (torch.cuda.current_device() if self.device.type == "cuda" else None), x * scale


def test_on_own_device_passes_arguments_and_keeps_the_name():
    obj = _OnDevice("cpu")
    assert obj.current(3, scale=2) == (None, 6)
    assert _OnDevice.current.__name__ == "current" and "current CUDA device" in _OnDevice.current.__doc__


@pytest.mark.gpu
def test_on_own_device_makes_the_objects_gpu_current():
    last = torch.cuda.device_count() - 1
    before = torch.cuda.current_device()
    assert _OnDevice(f"cuda:{last}").current(1) == (last, 1)
    assert torch.cuda.current_device() == before, "the caller's device is restored"


def test_a_numbered_cpu_is_the_cpu():
    """Tensors made on "cpu:0" report device "cpu": a buffer on "cpu:0" must accept them."""
    assert canonical_device("cpu:0") == torch.device("cpu")
    rb = gper.PrioritizedReplayBuffer(8, {"x": ((), torch.float32)}, device="cpu:0")
    rb.add({"x": torch.arange(4.0)})
    rb.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, 2.0]))
    assert rb.device == torch.device("cpu")
