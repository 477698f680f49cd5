"""The one place gper imports Triton.

Set ``TRITON_INTERPRET=1`` before this import to run the kernels on CPU tensors (how CI tests
them). ``HAS_TRITON`` is False when Triton is not installed; the torch back end then serves.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "tl", "triton"]
