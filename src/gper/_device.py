"""One place that turns a device request into a concrete ``torch.device``."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def canonical_device(request: str | torch.device | None = "auto") -> torch.device:
    """``auto``/None -> the current CUDA device when there is one, else the CPU; ``cuda`` -> ``cuda:N``.

    Raises:
        ValueError: a CUDA device was asked for but torch sees no GPU.
    """
    if request is None or request == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(request)
    if device.type == "cpu":
        return torch.device("cpu")  # one CPU device: "cpu:0" would not compare equal to tensors' "cpu"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(request)!r} asked for, but torch sees no CUDA GPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def on_own_device(method: Callable) -> Callable:
    """Run ``method`` with its object's GPU (``self.device``) current: Triton launches (and graph
    captures) go to the current device, not to the device of the tensors passed, so an object
    on ``cuda:1`` needs it."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        device = self.device
        # the object's device exists, so CUDA is initialised: ask the runtime directly (no lazy-init check)
        if device.type != "cuda" or torch._C._cuda_getDevice() == device.index:
            return method(self, *args, **kwargs)
        with torch.cuda.device(device.index):
            return method(self, *args, **kwargs)

    return wrapper
