"""Compiled loops of the CPU back end (numba, the ``cpu`` extra): a draw's whole descent, its Philox
words included, and an update's bookkeeping, one pass over the batch each.

These are the operations of :mod:`gper.ops.tree.reference`, written as loops over the batch, on the
same values in the same order: each float64 prefix sum accumulates left to right, each product,
quotient and compare is one IEEE operation (numba compiles without fast-math, so nothing is
reassociated or fused), min and max propagate NaN as torch's do. What depends on torch's own
kernels (``pow``, the float32 sum of a node's children) :mod:`gper.ops.tree.cpu` still asks torch
for. Importing this module imports numba; each function compiles on its first call (cached on
disk after that).
"""

from __future__ import annotations

import numba
import numpy as np

#: IEEE division (inf, NaN) as torch, not Python's ZeroDivisionError; no fast-math: nothing reassociated or fused
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


@_jit
def _philox_words(k0, k1, ctr, out, at):
    """The four words of counter ``ctr`` into ``out[at : at + 4]``."""
    c = np.uint64(ctr)
    c0, c1, c2, c3 = c & _MASK32, c >> _SHIFT32, np.uint64(0), np.uint64(0)
    for _ in range(10):
        pa = c0 * np.uint64(0xD2511F53)
        pb = c2 * np.uint64(0xCD9E8D57)
        c0, c1, c2, c3 = (pb >> _SHIFT32) ^ c1 ^ k0, pb & _MASK32, (pa >> _SHIFT32) ^ c3 ^ k1, pa & _MASK32
        k0 = (k0 + np.uint64(0x9E3779B9)) & _MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _MASK32
    out[at] = c0
    out[at + 1] = c1
    out[at + 2] = c2
    out[at + 3] = c3


@_jit
def _minimum(a, b):
    # torch.minimum: NaN if either is
    if a != a or b != b:
        return np.nan
    return a if a < b else b


@_jit
def _clamp_min_zero(a):
    # clamp_min(0.0): NaN stays NaN
    if a != a:
        return a
    return a if a > 0.0 else 0.0


#: draws descended together: their prefix sums are independent, so the loop over them vectorises
#: (and their loads overlap), while each draw's sums still accumulate left to right
_TILE = 64


@_jit
def descend(tree, offsets, bounds, k, depth, stratified, k0, k1, rng, n_blocks, pmin, out_node, out_leaf, out_ratio):
    """Each draw's descent, :func:`gper.ops.tree.reference.descend` (or ``descend_stratified``), from its
    own Philox words (block ``c`` of draw ``s`` at counter ``rng + s * n_blocks + c``).

    Args:
        tree: the float32 sum tree; offsets: [depth] int64 level starts; bounds: [depth] int64,
            the last node above a filled slot at each level.
        k: arity; depth: levels; stratified: one draw per stratum of the mass.
        k0, k1: the Philox key words (uint64 below 2^32); rng: the RNG counter; n_blocks: blocks a draw.
        pmin: the smallest stored priority (float32).
        out_node: [B] int64 slots; out_leaf: [B] float32 their leaves; out_ratio: [B] float32
            ``leaf / pmin``, what the IS weights are powers of.

    Returns:
        True when every ratio is finite (else the weights take the reference's logarithms).
    """
    b = out_node.shape[0]
    n_words = depth + 1 if stratified else depth
    n_used = (n_words + 3) // 4
    words = np.empty((_TILE, 4 * n_used), dtype=np.uint64)
    cs = np.empty((k, _TILE), dtype=np.float64)
    acc = np.empty(_TILE, dtype=np.float64)
    t = np.empty(_TILE, dtype=np.float64)
    parent = np.empty(_TILE, dtype=np.float64)
    first = np.empty(_TILE, dtype=np.int64)
    node = np.empty(_TILE, dtype=np.int64)
    leaf = np.empty(_TILE, dtype=np.float32)
    finite = True
    for lo in range(0, b, _TILE):
        n = min(_TILE, b - lo)
        for r in range(n):
            for c in range(n_used):
                _philox_words(k0, k1, rng + (lo + r) * n_blocks + c, words[r], 4 * c)
            node[r] = 0
        for level in range(depth):
            for r in range(n):
                first[r] = offsets[level] + node[r] * k
                acc[r] = 0.0
            for i in range(k):
                for r in range(n):
                    acc[r] += np.float64(tree[first[r] + i])
                    cs[i, r] = acc[r]
            for r in range(n):
                tot = acc[r]
                if not stratified:
                    t[r] = np.float64(words[r, level]) * 2.0**-32 * tot
                else:
                    if level == 0:
                        jitter = np.float64(words[r, depth]) * 2.0**-32
                        t[r] = (np.float64(lo + r) + jitter) / np.float64(b) * tot
                    else:
                        t[r] = t[r] * (tot / parent[r])
                    t[r] = _minimum(t[r], tot * (1.0 - 2.0**-52))
            for r in range(n):
                j = 0
                for i in range(k):
                    j += cs[i, r] <= t[r]
                if j > k - 1:
                    j = k - 1
                child = node[r] * k + j
                if child > bounds[level]:
                    child = bounds[level]
                j = child - node[r] * k
                leaf[r] = tree[first[r] + j]
                if stratified:
                    below = cs[j - 1, r] if j > 0 else 0.0
                    t[r] = _clamp_min_zero(t[r] - below)
                    parent[r] = np.float64(leaf[r])
                node[r] = child
        for r in range(n):
            out_node[lo + r] = node[r]
            out_leaf[lo + r] = leaf[r]
            ratio = leaf[r] / pmin
            out_ratio[lo + r] = ratio
            finite &= np.isfinite(ratio)
    return finite


@_jit
def check_update(idx, gen, expected, check_gen, size, td, p_max, eps, shifted, valid, finite, counts):
    """The checks of an update and the input of its ``pow``: ``valid`` (index in [0, size), and
    the generation sampled is the slot's, where ``check_gen``), ``finite`` (td), ``shifted``
    ``min(|td|, P_MAX) + eps`` (float32); ``counts`` += [invalid, stale, nonfinite and valid]."""
    for s in range(idx.shape[0]):
        i = idx[s]
        in_range = i >= 0 and i < size
        ok = in_range
        if check_gen and in_range:
            ok = gen[i] == expected[s]
        valid[s] = ok
        d = td[s]
        fin = np.isfinite(d)
        finite[s] = fin
        a = abs(d)
        shifted[s] = (a if a < p_max else p_max) + eps  # NaN: replaced by the max priority below
        if not in_range:
            counts[0] += 1
        elif not ok:
            counts[1] += 1
        if ok and not fin:
            counts[2] += 1


@_jit
def write_priorities(tree, mintree, keys_only, claims, idx, valid, finite, powered, p_max, maxp, base, cap, p_out):
    """The rest of ``_set_priorities``: priorities ``min(powered, P_MAX)`` (the max priority where
    td was not finite), the last valid occurrence of each slot written to both trees (everything
    else to the trash cell), claims back to -1. Returns the new max priority."""
    b = idx.shape[0]
    trash = tree.shape[0] - 1
    for s in range(b):
        q = powered[s]
        p_out[s] = (q if q < p_max or q != q else p_max) if finite[s] else maxp
        claims[idx[s] if valid[s] else cap] = s  # in batch order: the largest position claims last
    top = np.float32(0.0)
    for s in range(b):
        c = idx[s] if valid[s] else cap
        winner = claims[c]
        wp = p_out[winner]
        if valid[s]:
            tree[base + idx[s]] = wp
            if not keys_only:
                mintree[base + idx[s]] = wp
            if winner == s:
                q = p_out[s]
                if q != q or top != top:
                    top = np.float32(np.nan)
                elif q > top:
                    top = q
        else:
            tree[trash] = wp
            if not keys_only:
                mintree[trash] = wp
    for s in range(b):
        claims[idx[s] if valid[s] else cap] = -1
    if maxp != maxp or top != top:
        return np.float32(np.nan)
    return maxp if maxp >= top else top


@_jit
def _ancestors(leaves, valid, shift, level_size, dedupe, out):
    """The nodes ``shift`` bits above the batch's leaves (leaf 0 for an invalid entry), of a level
    of ``level_size`` nodes, into ``out``: each once, in increasing order, with ``dedupe``, else
    one per entry. Returns how many. Shared by :func:`gather_children` and :func:`repair`."""
    b = leaves.shape[0]
    if not dedupe:
        for s in range(b):
            out[s] = (leaves[s] if valid[s] else 0) >> shift
        return b
    mark = np.zeros(level_size, dtype=np.bool_)
    for s in range(b):
        mark[(leaves[s] if valid[s] else 0) >> shift] = True
    n = 0
    for p in range(level_size):
        if mark[p]:
            out[n] = p
            n += 1
    return n


@_jit
def gather_children(tree, mintree, leaves, valid, shift, level_size, dedupe, child_lo, parent_lo, k, parents, rows):
    """One level of the repair: the nodes above the batch's leaves (leaf 0 for an invalid entry)
    into ``parents`` (each once with ``dedupe``, in increasing order, else one per entry), their
    children in the sum tree into ``rows`` [n, K] (torch sums them), and their new value in the
    min tree (exact: no order to follow; NaN wins, as in torch's amin). Returns ``n``."""
    n = _ancestors(leaves, valid, shift, level_size, dedupe, parents)
    low = np.empty(n, dtype=np.float32)
    nan = np.zeros(n, dtype=np.bool_)
    for r in range(n):
        low[r] = mintree[child_lo + parents[r] * k]
    # child by child across the rows: the rows' loads are independent, so they overlap
    for i in range(k):
        for r in range(n):
            at = child_lo + parents[r] * k + i
            rows[r, i] = tree[at]
            x = mintree[at]
            if x != x:
                nan[r] = True
            elif x < low[r]:
                low[r] = x
    for r in range(n):
        mintree[parent_lo + parents[r]] = np.float32(np.nan) if nan[r] else low[r]
    return n


@_jit
def row_sum(tree, first, k, lanes):
    """The float32 sum of ``tree[first : first + k]`` in the order of torch's CPU ``sum`` over a
    contiguous row (its ``cascade_sum`` on vectors of ``lanes`` floats: four vector accumulators,
    each starting at 0, take the row's vectors in turn, the last ones all to the first; the four
    are added up, then their lanes one by one after the elements past the last whole vector; a
    row shorter than a vector is summed the same way on scalars). :func:`gper.ops.tree.cpu.torch_sum_lanes`
    checks that this is torch's order before it is used."""
    zero = np.float32(0.0)
    if k < lanes:  # four scalar accumulators over the row's groups of four, the rest to the first
        q0, q1, q2, q3 = zero, zero, zero, zero
        whole = k // 4 * 4
        for i in range(whole):
            x = tree[first + i]
            if i % 4 == 0:
                q0 = q0 + x
            elif i % 4 == 1:
                q1 = q1 + x
            elif i % 4 == 2:
                q2 = q2 + x
            else:
                q3 = q3 + x
        for i in range(whole, k):
            q0 = q0 + tree[first + i]
        return ((q0 + q1) + q2) + q3
    n_vec = k // lanes
    whole = n_vec // 4 * 4
    total = zero
    for i in range(n_vec * lanes, k):
        total = total + tree[first + i]
    for lane in range(lanes):
        q0, q1, q2, q3 = zero, zero, zero, zero
        for v in range(n_vec):
            x = tree[first + v * lanes + lane]
            a = v % 4 if v < whole else 0
            if a == 0:
                q0 = q0 + x
            elif a == 1:
                q1 = q1 + x
            elif a == 2:
                q2 = q2 + x
            else:
                q3 = q3 + x
        total = total + (((q0 + q1) + q2) + q3)
    return total


@_jit
def row_sums(rows, lanes, out):
    """:func:`row_sum` of each row of ``rows`` [n, K] float32 into ``out`` [n] (for the check)."""
    k = rows.shape[1]
    flat = rows.reshape(-1)
    for r in range(rows.shape[0]):
        out[r] = row_sum(flat, r * k, k, lanes)


@_jit
def repair(tree, mintree, leaves, valid, offsets, sizes, k, log2k, lanes, out_nodes):
    """:func:`gper.ops.tree.reference.recompute` of the ancestors of ``leaves`` (leaf 0 where not
    ``valid``), level by level from the bottom: each node's sum in torch's order (:func:`row_sum`)
    and its min (NaN wins, as in torch's amin). ``out_nodes``: [B] int64 scratch."""
    b = leaves.shape[0]
    depth = offsets.shape[0]
    for level in range(depth - 2, -1, -1):
        shift = log2k * (depth - 1 - level)
        # many leaves share an ancestor where the level holds few nodes: each node once there
        n = _ancestors(leaves, valid, shift, sizes[level], sizes[level] <= 4 * b, out_nodes)
        child_lo, parent_lo = offsets[level + 1], offsets[level]
        for r in range(n):
            first = child_lo + out_nodes[r] * k
            low = mintree[first]
            nan = False
            for i in range(k):
                x = mintree[first + i]
                nan |= x != x
                low = x if x < low else low
            tree[parent_lo + out_nodes[r]] = row_sum(tree, first, k, lanes)
            mintree[parent_lo + out_nodes[r]] = np.float32(np.nan) if nan else low
