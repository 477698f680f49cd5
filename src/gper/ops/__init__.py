"""Replay kernels: a Triton back end and a vectorized PyTorch reference with the same functions.

``reference`` works on any device and is the semantics; ``triton_ops`` is the fast path on CUDA
(and runs on CPU tensors under ``TRITON_INTERPRET=1``). :func:`backend_module` picks one.
"""

from __future__ import annotations

from types import ModuleType

BACKENDS = ("auto", "triton", "torch")


def backend_module(name: str) -> ModuleType:
    """The module that implements back end ``name`` ("triton" or "torch")."""
    if name == "torch":
        from gper.ops import reference

        return reference
    if name == "triton":
        from gper.ops import triton_ops

        return triton_ops
    raise ValueError(f"backend must be one of {BACKENDS[1:]}, got {name!r}")
