"""One place that turns a device request into a concrete ``torch.device``."""

from __future__ import annotations

import torch


def canonical_device(request: str | torch.device | None = "auto") -> torch.device:
    """``auto``/None -> the current CUDA device when there is one, else the CPU; ``cuda`` -> ``cuda:N``.

    Raises:
        ValueError: a CUDA device was asked for but torch sees no GPU.
    """
    if request is None or request == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(request)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(request)!r} asked for, but torch sees no CUDA GPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device
