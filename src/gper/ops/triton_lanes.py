"""The lanes of a Triton kernel that gives each item (draw, update entry, stream) one lane.

Every family's kernels start the same way: program ``p``'s ``BLOCK`` lanes are items
``p * BLOCK .. p * BLOCK + BLOCK - 1``, numbered in int64 (an int32 product overflows past 2^31
items), and masked to those below the item count. :func:`lanes` is that prologue, written once; a
``@triton.jit`` function is inlined where it is called, so the kernels compile as before.
"""

from __future__ import annotations

from gper._triton import tl, triton


@triton.jit
def lanes(n, BLOCK: tl.constexpr):
    """(items, mask): this program's ``BLOCK`` item numbers (int64) and which of them are below ``n``."""
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return s, s < n


@triton.jit
def instance(INST: tl.constexpr):
    """The instance a program serves in a launch for several instances (``INST``): axis 1 of the
    grid, as int64 (offsets ``instance * stride`` of stacked tensors pass 2^31). 0 in a launch for
    one tree, where the ``if INST`` blocks that use it fold away and the kernel compiles as before."""
    if INST:
        k = tl.program_id(1).to(tl.int64)
    else:
        k = 0
    return k
