"""Replay kernels, in families: each a folder of twins with the same functions and signatures.

* :mod:`gper.ops.tree`: the priority tree (add, update, repair, sample), the contract
  :class:`ReplayKernels`; back ends ``reference``, ``cpu`` (NumPy views of CPU tensors) and ``triton``;
* :mod:`gper.ops.trajectory`: the trajectory buffer's stream add and n-step sampling;
* :mod:`gper.ops.her`: hindsight relabelling's episode index and goal picks;
* :mod:`gper.ops.shard`: a sharded buffer's exact-mode draws and exchanges.

``reference`` works on any device and is the semantics; ``triton`` is the fast path on CUDA (and
runs on CPU tensors under ``TRITON_INTERPRET=1``). :func:`kernels` picks a family's back end,
:func:`select_backend` resolves a buffer's ``backend=`` request. The tree kernels take the tree's
tensors as one :class:`~gper.ops.state.TreeState`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch

from gper.ops.state import TreeState
from gper.ops.tree import CONTRACT, ReplayKernels

__all__ = ["BACKENDS", "CONTRACT", "FAMILIES", "ReplayKernels", "TreeState", "kernels", "select_backend"]

BACKENDS = ("auto", "triton", "torch")
#: the kernel families, each a subpackage of gper.ops with a ``reference`` and a ``triton`` module
FAMILIES = ("tree", "trajectory", "her", "shard")


def kernels(family: str, backend: str, device: torch.device | None = None) -> ModuleType:
    """The module of ``family`` (one of :data:`FAMILIES`) that implements ``backend`` ("triton" or
    "torch") on ``device``.

    The torch back end is the family's ``reference``; the tree's on a CPU ``device`` is
    :mod:`gper.ops.tree.cpu`, the same kernels on NumPy views of the tensors (bit for bit the
    reference's results, faster there)."""
    if family not in FAMILIES:
        raise ValueError(f"kernel family must be one of {FAMILIES}, got {family!r}")
    if backend == "triton":
        module = "triton"
    elif backend == "torch":
        on_cpu = device is not None and torch.device(device).type == "cpu"
        module = "cpu" if family == "tree" and on_cpu else "reference"
    else:
        raise ValueError(f"backend must be one of {BACKENDS[1:]}, got {backend!r}")
    return importlib.import_module(f"gper.ops.{family}.{module}")


def select_backend(request: str | ModuleType, device: torch.device) -> tuple[str, ReplayKernels]:
    """The back end's name and tree kernels for ``request`` on ``device``.

    ``auto`` is Triton on CUDA (when installed), torch elsewhere; ``triton`` also runs on CPU
    tensors under ``TRITON_INTERPRET=1``. A module (kernel experiments) is used as it is.
    """
    if not isinstance(request, str):
        missing = [name for name in CONTRACT if not callable(getattr(request, name, None))]
        if missing:
            raise TypeError(f"backend {request!r} lacks the kernels {missing} of gper.ops.ReplayKernels")
        return getattr(request, "__name__", type(request).__name__), request
    from gper._triton import HAS_TRITON

    name = request
    if request == "auto":
        name = "triton" if HAS_TRITON and device.type == "cuda" else "torch"
    elif request == "triton":
        if not HAS_TRITON:
            raise ImportError("backend='triton' needs the triton package: pip install \".[triton]\"")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend='triton' runs on CUDA (or on CPU under TRITON_INTERPRET=1), not {device}")
    return name, kernels("tree", name, device)
