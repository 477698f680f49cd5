"""The CPU back end's loops in NumPy: the reference's operations on NumPy views, a few calls a level.

Used by :mod:`gper.ops.tree.cpu` when numba (the ``cpu`` extra) is not installed. Each function is
its namesake in :mod:`gper.ops.tree.reference` on NumPy arrays, the same operations on the same values
in the same order; where the bits depend on torch's own kernels (``pow``, the float32 sum of a
node's children, the float64 prefix sums) torch computes them on the same values.
"""

from __future__ import annotations

import numpy as np
import torch

from gper.ops import philox
from gper.ops.layout import TreeLayout
from gper.ops.state import C_INVALID, C_NONFINITE, C_SIZE, C_STALE, P_MAX, S_MAXP

_TWO_M32 = 2.0**-32
F32_P_MAX = np.float32(P_MAX)
#: multiplying by it adds up the 8 bytes of a uint64 into its top byte (while the sum stays below 256)
_BYTE_SUM = np.uint64(0x0101010101010101)


def level_rows(tree: np.ndarray, layout: TreeLayout, level: int) -> np.ndarray:
    """Level ``level`` as rows of K children: row ``p`` holds the children of node ``p`` of the level above."""
    k = layout.arity
    rows = layout.sizes[level - 1] if level > 0 else 1
    lo = layout.offsets[level]
    return tree[lo : lo + rows * k].reshape(rows, k)


def _prefix_sums(v: np.ndarray) -> np.ndarray:
    """[n, K] float64 running sums of each row of ``v`` [n, K] float32, left to right (torch's loop)."""
    return torch.cumsum(torch.from_numpy(v), 1, dtype=torch.float64).numpy()


def _count_true(mask: np.ndarray) -> np.ndarray:
    """[n] int64: the True entries of each row of a C-contiguous [n, K] bool mask.

    ``mask.sum(1)`` costs NumPy a loop per row; with K a multiple of 8 the row's bytes (each 0 or
    1) are read as K / 8 uint64 words instead, added, and their bytes summed by one multiply."""
    k = mask.shape[1]
    if k % 8 or not mask.flags.c_contiguous:
        return mask.sum(1, dtype=np.int64)
    words = mask.view(np.uint64)
    total = words[:, 0].copy()
    for c in range(1, k // 8):
        total += words[:, c]
    return ((total * _BYTE_SUM) >> np.uint64(56)).astype(np.int64)


def _pick(layout: TreeLayout, cs: np.ndarray, t: np.ndarray, node: np.ndarray, bound: int):
    """As the reference's ``_pick``: the child whose cumulative mass first exceeds ``t``, inside the filled range."""
    k = layout.arity
    j = _count_true(cs <= t[:, None])
    np.minimum(j, k - 1, out=j)
    first = node * k
    child = np.minimum(first + j, bound)
    return child - first, child


def _filled_bound(layout: TreeLayout, size: int, level: int) -> int:
    return max(size - 1, 0) >> layout.shift(level)


def _row_values(v: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``v[s, j[s]]`` for each row ``s`` of ``v`` [n, K]."""
    if v.strides[0] == 0:  # a broadcast row
        return v[0].take(j)
    return v.reshape(-1)[np.arange(0, v.size, v.shape[1]) + j]


def descend(tree: np.ndarray, layout: TreeLayout, words: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gper.ops.tree.reference.descend` on NumPy arrays.

    Args:
        tree: the sum tree as a float32 array.
        words: [n_words, B] uint32 Philox words, word ``w`` of sample ``s`` at ``[w, s]``.
        size: filled slots.

    Returns:
        (slots [B] int64, leaf values [B] float32)
    """
    b = words.shape[1]
    node = np.zeros(b, dtype=np.int64)
    for level in range(layout.depth):
        if level == 0:  # every draw starts at the root: its children's sums once, not B times
            top = level_rows(tree, layout, 0)
            v = np.broadcast_to(top, (b, layout.arity))
            cs = np.broadcast_to(_prefix_sums(top), v.shape)
        else:
            v = level_rows(tree, layout, level).take(node, axis=0)
            cs = _prefix_sums(v)
        t = words[level] * _TWO_M32
        t *= cs[:, -1]
        j, node = _pick(layout, cs, t, node, _filled_bound(layout, size, level))
    return node, _row_values(v, j)


def descend_stratified(
    tree: np.ndarray, layout: TreeLayout, words: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gper.ops.tree.reference.descend_stratified` on NumPy arrays (arguments as :func:`descend`)."""
    b = words.shape[1]
    node = np.zeros(b, dtype=np.int64)
    s = np.arange(b, dtype=np.float64)
    t = parent = None
    for level in range(layout.depth):
        v = level_rows(tree, layout, level).take(node, axis=0)
        cs = _prefix_sums(v)
        tot = cs[:, -1]
        if t is None:
            t = (s + words[layout.depth] * _TWO_M32) / np.float64(b) * tot
        else:
            t = t * (tot / parent)
        t = np.minimum(t, tot * (1.0 - 2.0**-52))
        j, child = _pick(layout, cs, t, node, _filled_bound(layout, size, level))
        below = np.where(j > 0, _row_values(cs, np.maximum(j - 1, 0)), 0.0)
        t = np.maximum(t - below, 0.0)
        leaf = _row_values(v, j)
        parent = leaf.astype(np.float64)
        node = child
    return node, leaf


def random_words(seed: int, rng: int, b: int, n_blocks: int, n_words: int) -> np.ndarray:
    """[n_words, B] uint32: words ``0 .. n_words - 1`` of each sample, as :func:`gper.ops.tree.reference.random_words`
    draws them (block ``c`` of sample ``s`` at counter ``rng + s * n_blocks + c``).

    Small batches read them from :class:`_WordCache` (Philox costs NumPy about 30 calls whatever
    the batch); large ones compute only the blocks that hold the words asked for."""
    if b * n_blocks <= _WordCache.MAX_CALL:
        return _WORDS.get(seed, rng, b * n_blocks).reshape(b, n_blocks * 4)[:, :n_words].T
    blocks = -(-n_words // 4)
    offs = rng + np.arange(blocks, dtype=np.int64)[:, None] + np.arange(0, b * n_blocks, n_blocks, dtype=np.int64)
    lanes = philox.randint4x_u32(seed, offs)  # four [blocks, B]
    return np.stack(lanes, axis=1).reshape(blocks * 4, b)[:n_words]


class _WordCache:
    """Philox blocks of consecutive counters, computed :attr:`CHUNK` at a time for each of the
    last few seeds: the same words as computed one call at a time (a block depends only on its
    seed and counter), for a fraction of the calls."""

    #: counters computed at once (a chunk is 16 bytes a counter: 1 MiB)
    CHUNK = 1 << 16
    #: calls that need more counters compute their own
    MAX_CALL = 1 << 12
    SEEDS = 4

    def __init__(self) -> None:
        self._chunks: dict[int, tuple[int, np.ndarray]] = {}

    def get(self, seed: int, start: int, n: int) -> np.ndarray:
        """[n, 4] uint32: the four words of counters ``start .. start + n - 1``."""
        first, words = self._chunks.get(seed, (0, None))
        if words is None or not first <= start or start + n > first + len(words):
            words = np.stack(philox.randint4x_u32(seed, np.arange(start, start + self.CHUNK, dtype=np.int64)), axis=1)
            self._chunks.pop(seed, None)
            while len(self._chunks) >= self.SEEDS:
                self._chunks.pop(next(iter(self._chunks)))
            self._chunks[seed] = first, words = start, words
        return words[start - first : start - first + n]


_WORDS = _WordCache()


def uniform(words: np.ndarray, size: int) -> np.ndarray:
    """The reference's uniform draws: 53 random bits in float64 times the filled size."""
    u = (words[0] >> np.uint32(5)) * 2.0**26 + (words[1] >> np.uint32(6)) * 1.0
    u *= 2.0**-53
    u *= np.float64(size)
    return u.astype(np.int64)


def priority_from_td(td: np.ndarray, maxp: np.float32, alpha: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gper.ops.tree.reference.priority_from_td` on a float32 array: (priorities, nonfinite mask)."""
    finite = np.isfinite(td)
    shifted = np.minimum(np.abs(td), F32_P_MAX)
    shifted += np.float32(eps)
    p = torch.from_numpy(shifted).pow(alpha).numpy()
    np.minimum(p, F32_P_MAX, out=p)
    return np.where(finite, p, maxp), ~finite


def recompute(tree: np.ndarray, mintree: np.ndarray, layout: TreeLayout, leaves: np.ndarray) -> None:
    """:func:`gper.ops.tree.reference.recompute` on arrays: each ancestor of ``leaves`` [n] int64 from its children."""
    b = leaves.size
    for level in range(layout.depth - 2, -1, -1):
        parent = leaves >> layout.shift(level)
        if layout.sizes[level] <= 4 * b:
            # many leaves share an ancestor here: each node once (the same values, fewer rows)
            dirty = np.zeros(layout.sizes[level], dtype=bool)
            dirty[parent] = True
            parent = np.flatnonzero(dirty)
        at = layout.offsets[level] + parent
        # torch's row reductions: the float32 sum in torch's order; min is exact (NumPy's is slower on short rows)
        tree[at] = torch.from_numpy(level_rows(tree, layout, level + 1).take(parent, axis=0)).sum(1).numpy()
        mintree[at] = torch.from_numpy(level_rows(mintree, layout, level + 1).take(parent, axis=0)).amin(1).numpy()


def set_priorities(
    tree: np.ndarray,
    mintree: np.ndarray | None,
    layout: TreeLayout,
    claims: np.ndarray,
    gen: np.ndarray,
    counters: np.ndarray,
    scalars: np.ndarray,
    idx: np.ndarray,
    td: np.ndarray,
    expected_gen: np.ndarray | None,
    alpha: float,
    eps: float,
) -> None:
    """The reference's ``_set_priorities`` on arrays, step by step (``mintree`` None: ``tree`` is
    rank mode's flat key array, and no tree is repaired).

    Args:
        idx: [B] int64; td: [B] float32; expected_gen: [B] int32 or None; the rest the state's arrays.
    """
    b = idx.size
    valid_range = (idx >= 0) & (idx < counters[C_SIZE])
    valid = valid_range
    if expected_gen is not None:
        valid = valid & (gen[np.where(valid_range, idx, 0)] == expected_gen)
    p, nonfinite = priority_from_td(td, scalars[S_MAXP], alpha, eps)
    # the last valid occurrence of a slot wins: the largest batch position that claims it
    pos = np.arange(b, dtype=np.int32)
    claim = np.where(valid, idx, layout.capacity)
    np.maximum.at(claims, claim, pos)
    winner = claims[claim]
    won = valid & (winner == pos)
    winner_p = p[np.maximum(winner, 0)]
    base = 0 if mintree is None else layout.leaf_offset
    target = np.where(valid, base + idx, tree.size - 1)
    tree[target] = winner_p  # duplicates write the same value
    if mintree is not None:
        mintree[target] = winner_p
    claims[claim] = -1
    scalars[S_MAXP] = np.maximum(scalars[S_MAXP], np.where(won, p, np.float32(0.0)).max())
    counters[C_INVALID] += b - np.count_nonzero(valid_range)
    counters[C_STALE] += np.count_nonzero(valid_range & ~valid)
    counters[C_NONFINITE] += np.count_nonzero(nonfinite & valid)
    if mintree is not None:
        recompute(tree, mintree, layout, np.where(valid, idx, 0))
