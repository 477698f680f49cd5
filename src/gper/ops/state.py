"""The device tensors that define a replay buffer, and the names of their slots.

Everything that changes from one step to the next lives here, on the device, so that a step
can be captured in a CUDA graph and replayed: the Philox counter, the write cursor, the number
of filled slots, the running max priority, the IS exponent, and counts of dropped input.
The host never reads these on a hot path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from gper.ops.layout import TreeLayout

# int64 ``counters``
C_RNG = 0  #: Philox counter: next unused block of random words
C_CURSOR = 1  #: next slot to write
C_SIZE = 2  #: filled slots
C_INVALID = 3  #: update entries dropped for an index outside [0, size)
C_NONFINITE = 4  #: NaN/Inf TD errors mapped to the max priority
C_STALE = 5  #: update entries ignored because their slot was overwritten since sampling
C_TICKET = 6  #: scratch for the sampling kernel's last-program election (0 between calls)
C_TICKET_TOP = 7  #: scratch for the tree repair's last-program election (0 between calls)
N_COUNTERS = 8
#: the counters a buffer's ``stats()`` reports, by name: where it is, and what it counted
COUNTER_STATS = {
    "size": C_SIZE,
    "cursor": C_CURSOR,
    "rng_offset": C_RNG,
    "invalid_indices": C_INVALID,
    "stale_updates": C_STALE,
    "nonfinite_td": C_NONFINITE,
}
#: the counters that only count up from 0 (a restored state holds none below 0)
COUNTS = (C_RNG, C_INVALID, C_NONFINITE, C_STALE)

# float32 ``scalars``
S_MAXP = 0  #: running max priority (new items enter at this value)
S_BETA = 1  #: IS exponent used when the caller passes a float
N_SCALARS = 2

#: the largest priority stored: TD errors beyond it, and ``(|td| + eps) ** alpha`` beyond it, are
#: clamped to it, so a node of the sum tree (at most ``capacity * P_MAX``) stays finite in float32
#: for any capacity below 2^63 (FLT_MAX is about 2^128)
P_MAX = 2.0**64
#: the smallest priority a buffer stores: eps is at least float32's smallest normal number (a GPU's
#: log2 may flush subnormals to 0), and every priority is at least min(eps ** alpha, 1 / capacity)
P_MIN = 2.0**-126

# sampling modes understood by the kernels
MODE_PROPORTIONAL = 0
MODE_STRATIFIED = 1
MODE_UNIFORM = 2


def rng_blocks(depth: int) -> int:
    """Philox calls (4 words each) per sample: one word per level plus one for the stratum jitter."""
    return (depth + 1 + 3) // 4


class TreeState(NamedTuple):
    """One priority tree's device tensors and its layout: what every tree-touching kernel takes.

    Built once by :class:`gper.replay.tree.PriorityTree` (its tensors never move: a restore copies
    into them), so a captured CUDA graph keeps reading the same addresses. The tensors are those of
    one tree today; a population of ``N`` trees in one set of tensors would add a leading ``[N]``
    dimension to each (the layout, the same for every tree, stays one).

    Attributes:
        layout: the trees' :class:`~gper.ops.layout.TreeLayout` (capacity, arity, level offsets).
        tree: [numel + 1] float32 sum tree, leaves last, one trash cell at the end (writes that
            must land nowhere go there).
        mintree: [numel + 1] float32 min tree (+inf where nothing is stored).
        gen: [capacity] int32 generation of each slot (bumped by every write).
        claims: the update's claim buffer, from the back end's ``make_claims`` (its shape is the
            back end's own; all -1 between calls).
        counters: [N_COUNTERS] int64 device counters, slots ``C_*``.
        scalars: [N_SCALARS] float32 device scalars, slots ``S_*``.
    """

    layout: TreeLayout
    tree: torch.Tensor
    mintree: torch.Tensor
    gen: torch.Tensor
    claims: torch.Tensor
    counters: torch.Tensor
    scalars: torch.Tensor


class SampleOut(NamedTuple):
    """Where a sampling kernel writes a batch of ``B`` draws (``B = len(idx)``): preallocated, so a
    captured CUDA graph writes the same addresses on every replay.

    Attributes:
        rows: [B, W] int32 the drawn slots' packed rows.
        idx: [B] int64 the drawn slots.
        gen: [B] int32 their generations when drawn.
        w: [B] float32 their importance-sampling weights.
    """

    rows: torch.Tensor
    idx: torch.Tensor
    gen: torch.Tensor
    w: torch.Tensor
