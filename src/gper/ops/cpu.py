"""The torch back end on CPU tensors: the reference's sampling and priority updates, on NumPy views.

A CPU buffer's PER step is a few hundred operations on arrays of a few hundred entries, where
each torch call costs several microseconds of dispatch and a NumPy call about one. So on the
CPU, :func:`sample`, :func:`update`, :func:`set_keys` and :func:`recompute` run the operations of
:mod:`gper.ops.reference`, in the same order and on the same IEEE values, on NumPy views of the
same tensors (``Tensor.numpy()`` shares their memory), and return the same bits: float64 prefix
sums accumulate left to right in both libraries, and products, quotients, compares, min and max
round the same way everywhere. Where the bits depend on torch's own kernels, torch computes them
on the same values, laid out the same way: ``pow`` (its vectorised and scalar loops may differ
in the last place), the float32 sum of a node's children (a vectorised sum whose order follows
the CPU's vector width), and the float64 prefix sums (NumPy's are several times slower on short
rows). ``tests/ops/test_cpu_vs_reference.py`` checks both modules bit for bit on random trees,
arities, batches, duplicates, stale and invalid entries, NaN and infinite TD errors and every
sampling mode. The other kernels are the reference's own.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gper.ops import philox, reference
from gper.ops.layout import TreeLayout
from gper.ops.reference import add_commit, add_positions, make_claims, rebuild
from gper.ops.state import (
    C_INVALID,
    C_NONFINITE,
    C_RNG,
    C_SIZE,
    C_STALE,
    MODE_STRATIFIED,
    MODE_UNIFORM,
    P_MAX,
    S_MAXP,
    rng_blocks,
)

__all__ = ["add_commit", "add_positions", "make_claims", "rebuild", "recompute", "sample", "set_keys", "update"]

_TWO_M32 = 2.0**-32
_F32_P_MAX = np.float32(P_MAX)
#: multiplying by it adds up the 8 bytes of a uint64 into its top byte (while the sum stays below 256)
_BYTE_SUM = np.uint64(0x0101010101010101)


def _level(tree: np.ndarray, layout: TreeLayout, level: int) -> np.ndarray:
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
    """:func:`gper.ops.reference.descend` on NumPy arrays.

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
            top = _level(tree, layout, 0)
            v = np.broadcast_to(top, (b, layout.arity))
            cs = np.broadcast_to(_prefix_sums(top), v.shape)
        else:
            v = _level(tree, layout, level).take(node, axis=0)
            cs = _prefix_sums(v)
        t = words[level] * _TWO_M32
        t *= cs[:, -1]
        j, node = _pick(layout, cs, t, node, _filled_bound(layout, size, level))
    return node, _row_values(v, j)


def descend_stratified(
    tree: np.ndarray, layout: TreeLayout, words: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gper.ops.reference.descend_stratified` on NumPy arrays (arguments as :func:`descend`)."""
    b = words.shape[1]
    node = np.zeros(b, dtype=np.int64)
    s = np.arange(b, dtype=np.float64)
    t = parent = None
    for level in range(layout.depth):
        v = _level(tree, layout, level).take(node, axis=0)
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
    """[n_words, B] uint32: words ``0 .. n_words - 1`` of each sample, as :func:`gper.ops.reference.random_words`
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


def _uniform(words: np.ndarray, size: int) -> np.ndarray:
    """The reference's uniform draws: 53 random bits in float64 times the filled size."""
    u = (words[0] >> np.uint32(5)) * 2.0**26 + (words[1] >> np.uint32(6)) * 1.0
    u *= 2.0**-53
    u *= np.float64(size)
    return u.astype(np.int64)


def is_weights(leaf: np.ndarray, pmin: np.float32, beta: torch.Tensor) -> np.ndarray:
    """:func:`gper.ops.reference.is_weights` for a float32 array of leaves and the smallest priority."""
    ratio = leaf / pmin
    if np.isinf(ratio).any():  # the logarithms' branch: the reference's own operations
        return reference.is_weights(torch.from_numpy(leaf), torch.tensor(pmin), beta).numpy()
    b = float(beta)
    clamped = 1.0 if math.isnan(b) else min(max(b, 0.0), 1.0)
    # a 0-d float32 tensor exponent, as the reference's (a Python float would take pow's scalar paths)
    return torch.from_numpy(ratio).pow(torch.tensor(-clamped, dtype=torch.float32)).numpy()


def sample(
    *,
    tree: torch.Tensor,
    mintree: torch.Tensor,
    layout: TreeLayout,
    rows: torch.Tensor,
    gen: torch.Tensor,
    counters: torch.Tensor,
    seed: int,
    b: int,
    mode: int,
    beta: torch.Tensor,
    out_rows: torch.Tensor,
    out_idx: torch.Tensor,
    out_gen: torch.Tensor,
    out_w: torch.Tensor,
) -> None:
    """:func:`gper.ops.reference.sample` (same arguments, same results) on CPU tensors."""
    if tree.device.type != "cpu":
        reference.sample(
            tree=tree, mintree=mintree, layout=layout, rows=rows, gen=gen, counters=counters, seed=seed, b=b,
            mode=mode, beta=beta, out_rows=out_rows, out_idx=out_idx, out_gen=out_gen, out_w=out_w,
        )  # fmt: skip
        return
    with np.errstate(all="ignore"):  # inf * 0 and the like: NaN, as in torch, without a warning
        _sample(tree, mintree, layout, rows, gen, counters, seed, b, mode, beta, out_rows, out_idx, out_gen, out_w)


def _sample(tree, mintree, layout, rows, gen, counters, seed, b, mode, beta, out_rows, out_idx, out_gen, out_w):
    c = counters.numpy()
    n_blocks = rng_blocks(layout.depth)
    size = int(c[C_SIZE])
    n_words = 2 if mode == MODE_UNIFORM else layout.depth + (mode == MODE_STRATIFIED)
    words = random_words(seed, int(c[C_RNG]), b, n_blocks, n_words)
    if mode == MODE_UNIFORM:
        node = _uniform(words, size)
        w = np.float32(1.0)
    else:
        descent = descend_stratified if mode == MODE_STRATIFIED else descend
        node, leaf = descent(tree.numpy(), layout, words, size)
        top = layout.offsets[0]
        pmin = mintree.numpy()[top : top + layout.arity].min()  # exact, NaN first, as amin
        w = is_weights(leaf, pmin, beta)
    # every draw is a filled slot (the descent keeps inside them, uniform draws are below size):
    # "clip" only spares take its bounds check, which makes it copy through a buffer
    rows.numpy().take(node, axis=0, out=out_rows.numpy(), mode="clip")
    gen.numpy().take(node, out=out_gen.numpy(), mode="clip")
    out_idx.numpy()[:] = node
    out_w.numpy()[:] = w
    c[C_RNG] += b * n_blocks


def priority_from_td(td: np.ndarray, maxp: np.float32, alpha: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gper.ops.reference.priority_from_td` on a float32 array: (priorities, nonfinite mask)."""
    finite = np.isfinite(td)
    shifted = np.minimum(np.abs(td), _F32_P_MAX)
    shifted += np.float32(eps)
    p = torch.from_numpy(shifted).pow(alpha).numpy()
    np.minimum(p, _F32_P_MAX, out=p)
    return np.where(finite, p, maxp), ~finite


def recompute(
    *, tree: torch.Tensor, mintree: torch.Tensor, layout: TreeLayout, leaves: torch.Tensor, counters: torch.Tensor
) -> None:
    """:func:`gper.ops.reference.recompute` (same arguments, same trees) on CPU tensors."""
    if tree.device.type != "cpu":
        reference.recompute(tree=tree, mintree=mintree, layout=layout, leaves=leaves, counters=counters)
        return
    with np.errstate(all="ignore"):
        _recompute(tree.numpy(), mintree.numpy(), layout, leaves.numpy())


def _recompute(tree: np.ndarray, mintree: np.ndarray, layout: TreeLayout, leaves: np.ndarray) -> None:
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
        tree[at] = torch.from_numpy(_level(tree, layout, level + 1).take(parent, axis=0)).sum(1).numpy()
        mintree[at] = torch.from_numpy(_level(mintree, layout, level + 1).take(parent, axis=0)).amin(1).numpy()


def update(
    *,
    tree: torch.Tensor,
    mintree: torch.Tensor,
    layout: TreeLayout,
    claims: torch.Tensor,
    gen: torch.Tensor,
    counters: torch.Tensor,
    scalars: torch.Tensor,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    alpha: float,
    eps: float,
) -> None:
    """:func:`gper.ops.reference.update` (same arguments, same results) on CPU tensors."""
    if tree.device.type != "cpu":
        reference.update(
            tree=tree, mintree=mintree, layout=layout, claims=claims, gen=gen, counters=counters, scalars=scalars,
            idx=idx, td=td, expected_gen=expected_gen, alpha=alpha, eps=eps,
        )  # fmt: skip
        return
    with np.errstate(all="ignore"):
        _set_priorities(tree, mintree, layout, claims, gen, counters, scalars, idx, td, expected_gen, alpha, eps, False)


def set_keys(
    *,
    keys: torch.Tensor,
    layout: TreeLayout,
    claims: torch.Tensor,
    gen: torch.Tensor,
    counters: torch.Tensor,
    scalars: torch.Tensor,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    eps: float,
) -> None:
    """:func:`gper.ops.reference.set_keys` (same arguments, same results) on CPU tensors."""
    if keys.device.type != "cpu":
        reference.set_keys(
            keys=keys, layout=layout, claims=claims, gen=gen, counters=counters, scalars=scalars, idx=idx, td=td,
            expected_gen=expected_gen, eps=eps,
        )  # fmt: skip
        return
    with np.errstate(all="ignore"):
        _set_priorities(keys, keys, layout, claims, gen, counters, scalars, idx, td, expected_gen, 1.0, eps, True)


def _set_priorities(
    tree, mintree, layout, claims, gen, counters, scalars, idx, td, expected_gen, alpha, eps, keys_only
):
    # the reference's _set_priorities, step by step; keys_only: ``tree`` is rank mode's flat key array
    tree_np, c, sc = tree.numpy(), counters.numpy(), scalars.numpy()
    i = idx.detach().numpy().astype(np.int64, copy=False)
    d = (td if td.dtype == torch.float32 else td.float()).detach().numpy()
    b = i.size
    valid_range = (i >= 0) & (i < c[C_SIZE])
    valid = valid_range
    if expected_gen is not None:
        valid = valid & (gen.numpy()[np.where(valid_range, i, 0)] == expected_gen.numpy())
    p, nonfinite = priority_from_td(d, sc[S_MAXP], alpha, eps)
    # the last valid occurrence of a slot wins: the largest batch position that claims it
    pos = np.arange(b, dtype=np.int32)
    claim = np.where(valid, i, layout.capacity)
    cl = claims.numpy()
    np.maximum.at(cl, claim, pos)
    winner = cl[claim]
    won = valid & (winner == pos)
    winner_p = p[np.maximum(winner, 0)]
    base = 0 if keys_only else layout.leaf_offset
    target = np.where(valid, base + i, tree_np.size - 1)
    tree_np[target] = winner_p  # duplicates write the same value
    if not keys_only:
        mintree.numpy()[target] = winner_p
    cl[claim] = -1
    sc[S_MAXP] = np.maximum(sc[S_MAXP], np.where(won, p, np.float32(0.0)).max())
    c[C_INVALID] += b - np.count_nonzero(valid_range)
    c[C_STALE] += np.count_nonzero(valid_range & ~valid)
    c[C_NONFINITE] += np.count_nonzero(nonfinite & valid)
    if not keys_only:
        _recompute(tree_np, mintree.numpy(), layout, np.where(valid, i, 0))
