"""Vectorized PyTorch implementation of every tree kernel: the reference, on any device.

Each function of the contract (:class:`gper.ops.tree.ReplayKernels`) has a Triton twin in
:mod:`gper.ops.tree.triton` and a CPU twin in :mod:`gper.ops.tree.cpu` with the same signature
and the same semantics; tests check one against the other, and this one against a plain-Python
oracle. Nothing here reads a device value on the host, so on CUDA these functions never
synchronise either.

Conventions shared by both back ends (:class:`~gper.ops.state.TreeState` has the tensors):

* ``state.tree``/``state.mintree``: flat float32 K-ary trees (:class:`~gper.ops.layout.TreeLayout`)
  plus one trash cell at the end, where writes that must not land anywhere go.
* ``state.counters``: int64 device scalars (RNG offset, cursor, size, event counts).
* The descent draws a fresh 32-bit uniform per level from Philox and picks child ``j`` with
  probability ``v_j / sum(v)`` of the children *as loaded*, comparing in float64: a child can
  only be picked if its value is positive, and a child 10^6 times smaller than its siblings
  keeps its probability to about 2^-32 of the parent's mass (a single float32 threshold
  cannot address more than 2^24 leaves; ``docs/design.md``, *Sampling*).
"""

from __future__ import annotations

import torch

from gper.ops import philox
from gper.ops.layout import TreeLayout
from gper.ops.state import (
    C_CURSOR,
    C_INVALID,
    C_NONFINITE,
    C_RNG,
    C_SIZE,
    C_STALE,
    MODE_STRATIFIED,
    MODE_UNIFORM,
    P_MAX,
    S_MAXP,
    SampleOut,
    TreeState,
    rng_blocks,
)

_TWO_M32 = 2.0**-32
_TWO_M53 = 2.0**-53


def _arange(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(n, device=like.device, dtype=torch.int64)


def _children(tree: torch.Tensor, layout: TreeLayout, level: int, parent: torch.Tensor) -> torch.Tensor:
    """The K children at ``level`` of each node in ``parent`` [n] (nodes of the level above): [n, K].

    A node's children are K contiguous entries, so the level is viewed as rows of K and whole
    rows are gathered (``index_select`` of 128-byte rows, far faster on the CPU than
    ``torch.take`` of single entries: ``docs/performance.md`` has the figures). The rows past
    the level's last node lie in its padding, which holds the neutral element (TreeLayout
    guarantees at least K of it)."""
    k = layout.arity
    rows = layout.sizes[level - 1] if level > 0 else 1
    lo = layout.offsets[level]
    return tree[lo : lo + rows * k].view(rows, k).index_select(0, parent)


def make_claims(*, layout: TreeLayout, device: torch.device) -> torch.Tensor:
    """Claims of an update in progress: [capacity + 1] int32 batch positions, -1 between calls."""
    return torch.full((layout.capacity + 1,), -1, dtype=torch.int32, device=device)


def recompute(*, state: TreeState, leaves: torch.Tensor) -> None:
    """Recompute every ancestor of ``leaves`` from its children, level by level, bottom up.

    Args:
        state: the tree (its sum and min trees change; the Triton twin also uses a ticket in
            its counters and scratch in its claims).
        leaves: [n] int64 leaf indices in [0, capacity); duplicates are fine (each writer
            computes the same value from the same final children).
    """
    tree, mintree, layout = state.tree, state.mintree, state.layout
    for level in range(layout.depth - 2, -1, -1):
        parent = leaves >> layout.shift(level)
        tree[layout.offsets[level] + parent] = _children(tree, layout, level + 1, parent).sum(1)
        mintree[layout.offsets[level] + parent] = _children(mintree, layout, level + 1, parent).amin(1)


def rebuild(*, state: TreeState) -> None:
    """Recompute every inner node of both trees from the leaves (O(capacity); not on a hot path)."""
    rebuild_trees(state.tree, state.mintree, state.layout)


def rebuild_trees(tree: torch.Tensor, mintree: torch.Tensor, layout: TreeLayout) -> None:
    """:func:`rebuild` on a sum and a min tree of ``layout`` that belong to no tree state (a
    checkpoint's tensors while they are checked)."""
    k = layout.arity
    for level in range(layout.depth - 2, -1, -1):
        n, lo = layout.sizes[level], layout.offsets[level + 1]
        tree[layout.offsets[level] : layout.offsets[level] + n] = tree[lo : lo + n * k].view(n, k).sum(1)
        mintree[layout.offsets[level] : layout.offsets[level] + n] = mintree[lo : lo + n * k].view(n, k).amin(1)


def priority_from_td(
    td: torch.Tensor, maxp: torch.Tensor, alpha: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|td| + eps) ** alpha`` in float32, ``|td|`` and the result clamped to ``P_MAX``; NaN and
    ±Inf map to ``maxp``.

    Returns:
        (priorities [B] float32, nonfinite mask [B] bool)
    """
    td = td.float()
    finite = torch.isfinite(td)
    p = (td.abs().clamp_max(P_MAX) + eps).pow(alpha).clamp_max(P_MAX)
    return torch.where(finite, p, maxp), ~finite


def update(
    *,
    state: TreeState,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    alpha: float,
    eps: float,
) -> None:
    """Set the priorities of slots ``idx`` from TD errors and repair the trees.

    Entries whose index is outside ``[0, size)`` are dropped and counted; entries whose slot was
    overwritten since it was sampled (``expected_gen`` differs from ``gen``) are ignored and
    counted; for duplicates the last valid occurrence wins. The running max priority grows to
    cover the values stored.

    Args:
        state: the tree (its claims from :func:`make_claims`, all -1 between calls).
        idx: [B] int64 slot indices.
        td: [B] floating TD errors.
        expected_gen: [B] int32 generations seen at sampling, or None (no stale check).
        alpha, eps: priority exponent and offset.
    """
    _set_priorities(state, state.tree, state.mintree, idx, td, expected_gen, alpha, eps, False)


def set_keys(
    *,
    state: TreeState,
    keys: torch.Tensor,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    eps: float,
) -> None:
    """Rank mode: write the sort keys ``|td| + eps`` of slots ``idx`` into a flat key array.

    The same checks, counts, last-wins rule and max-priority update as :func:`update`, but no
    tree is touched: ranks, and from them the tree, are recomputed at the next refresh.

    Args:
        state: the tree (its trees are not touched).
        keys: [capacity + 1] float32 keys (the last entry takes writes that must land nowhere).
        the rest: as :func:`update`.
    """
    _set_priorities(state, keys, keys, idx, td, expected_gen, 1.0, eps, True)


def _set_priorities(state: TreeState, tree, mintree, idx, td, expected_gen, alpha, eps, keys_only) -> None:
    # keys_only: ``tree`` is a flat key array (rank mode); no min tree, no repair
    layout, claims, gen, counters, scalars = state.layout, state.claims, state.gen, state.counters, state.scalars
    cap = layout.capacity
    b = idx.numel()
    size = counters[C_SIZE]
    valid_range = (idx >= 0) & (idx < size)
    safe = torch.where(valid_range, idx, 0)
    valid = valid_range
    if expected_gen is not None:
        valid = valid & (gen[safe] == expected_gen)
    p, nonfinite = priority_from_td(td, scalars[S_MAXP], alpha, eps)
    pos = _arange(b, idx).int()
    claim = torch.where(valid, idx, cap)
    claims.scatter_reduce_(0, claim, pos, reduce="amax")
    winner = claims[claim]
    won = valid & (winner == pos)
    winner_p = p[winner.clamp_min(0).long()]
    base = 0 if keys_only else layout.leaf_offset
    trash = tree.numel() - 1
    target = torch.where(valid, base + idx, trash)
    tree[target] = winner_p
    if not keys_only:
        mintree[target] = winner_p
    claims.index_fill_(0, claim, -1)
    # the max covers the priorities actually stored: those of the winning duplicates
    scalars[S_MAXP : S_MAXP + 1] = torch.maximum(scalars[S_MAXP], torch.where(won, p, 0.0).amax()).reshape(1)
    counters[C_INVALID] += (~valid_range).sum()
    counters[C_STALE] += (valid_range & ~valid).sum()
    counters[C_NONFINITE] += (nonfinite & valid).sum()
    if not keys_only:
        recompute(state=state, leaves=torch.where(valid, idx, 0))


def add_positions(*, state: TreeState, n: int, skip: int) -> torch.Tensor:
    """Slots for ``n`` new items after skipping ``skip`` (items that a too-large batch overwrites).

    Returns:
        [n] int64 slot indices ``(cursor + skip + arange(n)) % capacity``.
    """
    counters = state.counters
    return (counters[C_CURSOR] + skip + _arange(n, counters)) % state.layout.capacity


def add_commit(*, state: TreeState, pos: torch.Tensor, total: int, leaf_value: float | None) -> None:
    """Give the new slots ``pos`` their priority, bump their generations, advance cursor and size.

    Args:
        pos: [n] int64 distinct slots just written.
        total: items the caller added (``n`` plus those it skipped).
        leaf_value: priority of the new items, or None for the running max priority.
    """
    tree, mintree, layout, counters, scalars = state.tree, state.mintree, state.layout, state.counters, state.scalars
    if leaf_value is None:
        tree[layout.leaf_offset + pos] = scalars[S_MAXP]
        mintree[layout.leaf_offset + pos] = scalars[S_MAXP]
    else:
        tree.index_fill_(0, layout.leaf_offset + pos, leaf_value)
        mintree.index_fill_(0, layout.leaf_offset + pos, leaf_value)
    state.gen[pos] += 1
    recompute(state=state, leaves=pos)
    counters[C_CURSOR] = (counters[C_CURSOR] + total) % layout.capacity
    counters[C_SIZE] = torch.clamp(counters[C_SIZE] + total, max=layout.capacity)


def random_words(seed: int, counters: torch.Tensor, b: int, n_blocks: int) -> list[torch.Tensor]:
    """The Philox words of a batch: word ``w`` of sample ``s`` is the same in both back ends."""
    # all blocks of the batch in one Philox call: [B, n_blocks] counters, block c of sample s at
    # base + s * n_blocks + c (as the kernel); word 4c + lane of sample s is lane `lane` of block c
    offs = counters[C_RNG] + _arange(b * n_blocks, counters).view(b, n_blocks)
    if offs.device.type == "cpu":  # NumPy's small-array operators cost a third of torch's here
        lanes = tuple(torch.from_numpy(x) for x in philox.randint4x(seed, offs.numpy()))
    else:
        lanes = philox.randint4x(seed, offs)
    return [lanes[lane][:, c] for c in range(n_blocks) for lane in range(4)]


def _filled_bound(layout: TreeLayout, size: torch.Tensor, level: int) -> torch.Tensor:
    """The last node at ``level`` above a filled slot: no draw may go past it, whatever the tree holds."""
    return (size - 1).clamp_min(0) >> layout.shift(level)


def _pick(layout: TreeLayout, cs: torch.Tensor, t: torch.Tensor, node: torch.Tensor, bound: torch.Tensor):
    """Child ``j`` of ``node`` whose cumulative mass first exceeds ``t``, and the node it leads to,
    kept inside the filled range (a no-op on a consistent tree: only an ``inf`` or NaN planted in
    the tree can push a draw past the filled slots, and then the draw stops at the last one)."""
    k = layout.arity
    j = (cs <= t[:, None]).sum(1).clamp_max(k - 1)
    child = torch.minimum(node * k + j, bound)
    return child - node * k, child


def descend(
    tree: torch.Tensor, layout: TreeLayout, words: list[torch.Tensor], size: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent proportional draws over the ``size`` filled slots: one fresh uniform per level.

    Returns:
        (slots [B] int64, leaf values [B] float32)
    """
    node = torch.zeros_like(words[0])
    for level in range(layout.depth):
        v = _children(tree, layout, level, node)
        cs = v.double().cumsum(1)
        t = words[level].double() * _TWO_M32 * cs[:, -1]
        j, node = _pick(layout, cs, t, node, _filled_bound(layout, size, level))
        leaf = v.gather(1, j[:, None])[:, 0]
    return node, leaf


def descend_stratified(
    tree: torch.Tensor, layout: TreeLayout, words: list[torch.Tensor], size: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per equal-mass stratum: sample ``s`` lies in ``[s/B, (s+1)/B)`` of the total mass."""
    b = words[0].numel()
    s = _arange(b, words[0]).double()
    return descend_from(tree, layout, (s + words[layout.depth].double() * _TWO_M32) / b, size)


def descend_from(
    tree: torch.Tensor, layout: TreeLayout, start: torch.Tensor, size: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot at fraction ``start`` of the total mass, for each entry: the stratified descent
    with thresholds of the caller's (a sharded buffer's stratum that landed in this tree).

    A float64 threshold ``start * total`` is carried down the tree; at each level it is rescaled
    by ``sum(children) / parent`` so that the stored sums need not agree to the last bit.

    Args:
        tree: the sum tree; layout: its layout; size: 0-d int64 filled slots.
        start: [B] float64 fractions in [0, 1) of the mass of the tree as loaded.

    Returns:
        (slots [B] int64, leaf values [B] float32)
    """
    node = torch.zeros(start.shape, dtype=torch.int64, device=start.device)
    t = None
    parent = None
    for level in range(layout.depth):
        v = _children(tree, layout, level, node)
        cs = v.double().cumsum(1)
        tot = cs[:, -1]
        if t is None:
            t = start * tot
        else:
            t = t * (tot / parent)
        t = torch.minimum(t, tot * (1.0 - 2.0**-52))
        j, child = _pick(layout, cs, t, node, _filled_bound(layout, size, level))
        below = torch.where(j > 0, cs.gather(1, (j - 1).clamp_min(0)[:, None])[:, 0], 0.0)
        t = (t - below).clamp_min(0.0)
        leaf = v.gather(1, j[:, None])[:, 0]
        parent = leaf.double()
        node = child
    return node, leaf


def is_weights(leaf: torch.Tensor, pmin: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``(leaf / pmin) ** -beta`` (beta clamped to [0, 1], NaN read as 1); where the ratio
    overflows float32 (a priority near 2^64 over one near 2^-126), the same value from the logarithms."""
    beta = torch.where(torch.isnan(beta), 1.0, beta.clamp(0.0, 1.0))
    ratio = leaf / pmin
    wide = torch.exp2(-beta * (torch.log2(leaf) - torch.log2(pmin)))
    return torch.where(torch.isinf(ratio), wide, ratio.pow(-beta))


def sample(*, state: TreeState, rows: torch.Tensor, seed: int, mode: int, beta: torch.Tensor, out: SampleOut) -> None:
    """Draw ``b = len(out.idx)`` slots, gather their rows, compute IS weights, advance the RNG counter.

    Args:
        state: the tree (its RNG counter advances).
        rows: [capacity, W] int32 storage (every field of a slot packed in one row).
        seed: Philox key.
        mode: MODE_PROPORTIONAL, MODE_STRATIFIED or MODE_UNIFORM.
        beta: 0-d float32 tensor, the IS exponent.
        out: where the draws go (:class:`~gper.ops.state.SampleOut`).
    """
    out_rows, out_idx, out_gen, out_w = out
    b = out_idx.numel()
    tree, layout, counters = state.tree, state.layout, state.counters
    n_blocks = rng_blocks(layout.depth)
    words = random_words(seed, counters, b, n_blocks)
    if mode == MODE_UNIFORM:
        # 53 random bits in float64, as the kernel: float32 (what int64 words times a Python float
        # give) would round some draws up to the filled size, and could not address 2^24 slots
        u = ((words[0] >> 5).double() * 2.0**26 + (words[1] >> 6).double()) * _TWO_M53
        node = (u * counters[C_SIZE].double()).long()
        w = torch.ones(b, device=rows.device)
    else:
        descent = descend_stratified if mode == MODE_STRATIFIED else descend
        node, leaf = descent(tree, layout, words, counters[C_SIZE])
        pmin = state.mintree[layout.offsets[0] : layout.offsets[0] + layout.arity].amin()
        w = is_weights(leaf, pmin, beta)
    out_idx.copy_(node)
    out_w.copy_(w)
    torch.index_select(rows, 0, node, out=out_rows)
    torch.index_select(state.gen, 0, node, out=out_gen)
    counters[C_RNG] += b * n_blocks


def make_add_plan(*, fields: tuple[tuple[int, int], ...], words: int, device: torch.device) -> None:
    """What :func:`add_rows` needs prepared for rows of ``fields`` (``(byte offset, bytes)`` each):
    nothing here (a Triton back end makes its packing plan)."""
    return None


def write_fields(
    rows: torch.Tensor, fields: tuple[tuple[int, int], ...], values: tuple[torch.Tensor, ...], pos: torch.Tensor
) -> None:
    """Each value copied into its field (``(byte offset, bytes)``) of ``rows`` [capacity, W] at ``pos``."""
    r8 = rows.view(torch.uint8)
    for (offset, nbytes), x in zip(fields, values, strict=True):
        # the field's own dtype and shape over its bytes of every row (offsets are aligned to it)
        col = r8[:, offset : offset + nbytes].view(x.dtype).view(r8.shape[0], *x.shape[1:])
        col.index_copy_(0, pos, x)


def add_rows(
    *,
    state: TreeState,
    rows: torch.Tensor,
    fields: tuple[tuple[int, int], ...],
    values: tuple[torch.Tensor, ...],
    plan: object,
    skip: int,
    total: int,
    leaf_value: float | None,
) -> torch.Tensor:
    """The whole ``add``: :func:`add_positions`, each value copied into its field of the rows at
    those slots, then :func:`add_commit`.

    Args:
        state: the tree.
        rows: [capacity, W] int32 packed storage.
        fields: ``(byte offset, bytes)`` of each value's field in a row.
        values: one tensor per field, ``[n, *shape]`` on the rows' device.
        plan: from :func:`make_add_plan`.
        skip, total, leaf_value: as in :func:`add_positions` and :func:`add_commit`.

    Returns:
        [n] int64 slots written.
    """
    pos = add_positions(state=state, n=values[0].shape[0], skip=skip)
    write_fields(rows, fields, values, pos)
    add_commit(state=state, pos=pos, total=total, leaf_value=leaf_value)
    return pos
