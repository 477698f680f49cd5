"""Shape of the K-ary sum tree: how many nodes each level has and where it starts.

The tree is stored level by level in one flat float32 tensor, top level first, leaves last.
The top level holds at most ``K`` nodes (the root itself is never stored: it is the sum of the
top level). Every level starts on a 128-byte boundary and is followed by at least ``K`` padding
entries, so that loading the ``K`` children of any node is one unmasked, aligned vector load
(padding holds the neutral element: 0 in the sum tree, +inf in the min tree).

With ``K = 32`` a buffer of 2^25 slots needs 5 levels; the extra memory is about 3%.
"""

from __future__ import annotations

from dataclasses import dataclass

#: children per node: 32 float32 children are one 128-byte load, so a level of the descent
#: is one aligned vector load per draw
DEFAULT_ARITY = 32
_ALIGN_BYTES = 128


@dataclass(frozen=True)
class TreeLayout:
    """Level sizes and offsets of a K-ary tree over ``capacity`` leaves.

    Attributes:
        capacity: number of leaves (slots), any integer >= 1.
        arity: children per node ``K``, a power of two >= 2.
        sizes: nodes per level, top level first; ``sizes[-1] == capacity``.
        offsets: start of each level in the flat tensor, in elements.
        numel: elements of the flat tensor, padding included.
    """

    capacity: int
    arity: int
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    numel: int

    @staticmethod
    def build(capacity: int, arity: int = DEFAULT_ARITY) -> TreeLayout:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if arity < 2 or arity & (arity - 1):
            raise ValueError(f"arity must be a power of two >= 2, got {arity}")
        sizes = [capacity]
        while sizes[-1] > arity:
            sizes.append(-(-sizes[-1] // arity))
        sizes.reverse()
        align = max(arity, _ALIGN_BYTES // 4)
        offsets, end = [], 0
        for n in sizes:
            offsets.append(end)
            end += -(-(n + arity) // align) * align
        return TreeLayout(capacity, arity, tuple(sizes), tuple(offsets), end)

    @property
    def depth(self) -> int:
        """Number of stored levels (the descent makes one step per level)."""
        return len(self.sizes)

    @property
    def log2_arity(self) -> int:
        return self.arity.bit_length() - 1

    @property
    def leaf_offset(self) -> int:
        return self.offsets[-1]

    def shift(self, level: int) -> int:
        """Right shift that maps a leaf index to its ancestor at ``level``."""
        return self.log2_arity * (self.depth - 1 - level)
