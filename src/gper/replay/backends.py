"""Which kernels a buffer runs on its device: the back end asked for, after the Triton probe."""

from __future__ import annotations

from types import ModuleType

import torch

from gper.ops import ReplayKernels, kernels, select_backend
from gper.ops.probe import triton_problem
from gper.replay.checks import warn_triton_fallback
from gper.replay.graphs import capturing


def choose_backend(request: str | ModuleType, device: torch.device) -> tuple[str, ReplayKernels]:
    """The back end's name and kernels for ``request`` on ``device``.

    Before Triton is used on a device, a small run of its kernels is checked against the torch
    back end (once per device and process, :mod:`gper.ops.probe`; not while the caller captures a
    graph): if they fail, "auto" warns and takes the torch back end on the same device, and
    "triton" raises RuntimeError.
    """
    name, chosen = select_backend(request, device)
    if name == "triton" and not (device.type == "cuda" and capturing()):
        problem = triton_problem(device)  # once per device and process
        if problem is not None and request == "auto":
            warn_triton_fallback(device, problem)
            return "torch", kernels("tree", "torch", device)
        if problem is not None:
            raise RuntimeError(f"backend='triton' does not work on {device}: {problem}")
    return name, chosen
