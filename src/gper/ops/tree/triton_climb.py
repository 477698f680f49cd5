"""Tree repair in two dependent launches: a counting pass, then one climb in which the last
child to arrive at a node recomputes it and carries on upwards.

The level-by-level repair (one launch per level, ``triton_update._recompute_level``) is race-free
because a launch boundary separates the levels, and its time is that chain of launches
(``docs/performance.md`` has the figures). Here the levels are separated by counters instead:

* ``arrive``: one int64 per inner node (indexed like the tree, by level offset), 0 between calls.
  The high 32 bits count the arrivals a node waits for (its *need*), the low 32 bits the
  arrivals so far in this call.
* **Count pass** (:func:`_count_chain`): every entry (an update's, duplicates included) adds
  ``1 << 32`` to its leaf's parent; the first count at a node (the old value was 0) goes on and
  counts that node once at its own parent, and so on to the top. A launch boundary follows, so
  every need is complete before any climb.
* **Climb**: every entry arrives at its leaf's parent; the one that brings the count to the need
  is the last, so every entry below has been claimed: it writes the node's new leaves (from the
  claims, :func:`_leaf_parent`), recomputes the node from its ``K`` children, resets the counter,
  and climbs on (:func:`_climb`), where each node's last arrival recomputes it from its children.
  No entry writes a leaf before it arrives, so the first arrival waits on no stores.

Ordering: a node's children are written by other programs, so every arrival is an ``acq_rel``
atomic at GPU scope, with a CTA barrier between this program's writes and its arrivals (a lane's
atomic and another lane's store run on different threads), and between the arrival and the loads
of the children, which read past L1 (``.cg``). The CPU interpreter runs programs one after the
other and cannot show a race between programs: the GPU stress tests of ``tests/ops/test_climb.py``
can (``compute-sanitizer``'s racecheck sees shared memory only; its memcheck, out-of-bounds access).

A contiguous ring range (the slots an ``add`` writes) needs no count pass: the number of changed
children of a node is an interval intersection (:func:`_range_need`). The add is two launches:
rows, generations and leaves (bandwidth only), then one lane per changed leaf parent, climbing.
"""

from __future__ import annotations

import torch

from gper._triton import tl, triton
from gper.ops.layout import TreeLayout
from gper.ops.triton_lanes import instance, lanes
from gper.ops.triton_slots import C_CURSOR, C_SIZE, C_TICKET_TOP, S_MAXP


def arrive_counters(claims: torch.Tensor, layout: TreeLayout) -> torch.Tensor:
    """The ``arrive`` counters: the tail of the Triton back end's claim buffer (``make_claims``),
    one int64 per inner node, indexed by the node's offset in the tree."""
    return claims[layout.capacity + layout.arity :]


def arrive_words(layout: TreeLayout) -> int:
    """int64 words the ``arrive`` counters take at the end of the claim buffer."""
    return layout.leaf_offset


@triton.jit
def _count_chain(arrive, level_off, leaf, active, DEPTH: tl.constexpr, LOG2K: tl.constexpr):
    """Count pass: each active leaf (duplicates too) counts one arrival at its parent; the first
    count at a node counts that node once at its parent, up to the top level."""
    node = leaf
    for step in tl.static_range(DEPTH - 1):
        par = node >> LOG2K
        poff = tl.load(level_off + (DEPTH - 2 - step))
        old = tl.atomic_add(arrive + poff + par, 4294967296, mask=active, sem="relaxed")
        active = active & (old == 0)
        node = par


@triton.jit
def _interval(lo, hi, first, last):
    """How many of ``first .. last`` lie in ``lo .. hi`` (inclusive bounds; 0 if disjoint)."""
    return tl.maximum(tl.minimum(hi, last) - tl.maximum(lo, first) + 1, 0)


@triton.jit
def _range_need(par, a, n, cap, sh, K: tl.constexpr):
    """Changed children of node ``par`` when the leaves ``a .. a + n - 1`` (mod ``cap``, n <= cap)
    change; its children are at the level whose nodes span ``2^sh`` leaves."""
    first = par * K
    last = first + K - 1
    e = a + n  # one past the range, before the wrap
    wraps = e > cap
    hi1 = tl.where(wraps, cap - 1, e - 1) >> sh
    need = _interval(a >> sh, hi1, first, last)
    hi2 = (e - cap - 1) >> sh  # the wrapped part: leaves 0 .. e - cap - 1
    both_lo = a >> sh  # a child holding leaves of both parts is counted once
    need2 = _interval(0, hi2, first, last) - _interval(both_lo, hi2, first, last)
    return need + tl.where(wraps, need2, 0)


@triton.jit
def _climb(
    tree,
    mintree,
    arrive,
    level_off,
    node,
    active,
    a,
    n,
    cap,
    FIRST: tl.constexpr,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    RANGE: tl.constexpr,
):
    """The climb from the active nodes of level FIRST (already recomputed): the last arrival at a
    node recomputes it from its children. With RANGE the number of arrivals a node waits for comes
    from the changed leaf range ``a .. a + n - 1``, otherwise from the count pass."""
    kk = tl.arange(0, K)
    for step in tl.static_range(FIRST):
        level = FIRST - 1 - step
        par = node >> LOG2K
        poff = tl.load(level_off + level)
        coff = tl.load(level_off + level + 1)
        tl.debug_barrier()  # this program's writes of the children, before any of its arrivals
        old = tl.atomic_add(arrive + poff + par, 1, mask=active, sem="acq_rel")
        if RANGE:
            need = _range_need(par, a, n, cap, LOG2K * (DEPTH - 2 - level), K)
        else:
            need = old >> 32
        last = active & ((old & 0xFFFFFFFF) + 1 == need)
        tl.debug_barrier()  # the arrivals' acquire, before the children are read by any thread
        c = coff + par[:, None] * K + kk[None, :]
        v = tl.load(tree + c, mask=last[:, None], other=0.0, cache_modifier=".cg")
        tl.store(tree + poff + par, tl.sum(v, axis=1), mask=last)
        mv = tl.load(mintree + c, mask=last[:, None], other=float("inf"), cache_modifier=".cg")
        tl.store(mintree + poff + par, tl.min(mv, axis=1), mask=last)
        tl.store(arrive + poff + par, tl.zeros_like(old), mask=last)
        node = par
        active = last


@triton.jit
def _leaf_parent(
    tree,
    mintree,
    claims,
    arrive,
    scalars,
    level_off,
    leaf,
    active,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    FROM_CLAIMS: tl.constexpr,
):
    """Every active entry arrives at its leaf's parent; the last recomputes it. FROM_CLAIMS (an
    update): the last also writes the parent's claimed leaves in both trees from the claims, resets
    those claims and raises the max priority. Returns (parent, last) for :func:`_climb`."""
    kk = tl.arange(0, K)
    par = leaf >> LOG2K
    poff = tl.load(level_off + (DEPTH - 2))
    loff = tl.load(level_off + (DEPTH - 1))
    old = tl.atomic_add(arrive + poff + par, 1, mask=active, sem="acq_rel")
    last = active & ((old & 0xFFFFFFFF) + 1 == (old >> 32))
    tl.debug_barrier()  # the arrivals' acquire, before the children are read by any thread
    c = par[:, None] * K + kk[None, :]
    lm = last[:, None]
    # only this lane touches these leaves (and claims) in this launch: plain loads suffice
    v = tl.load(tree + loff + c, mask=lm, other=0.0)
    mv = tl.load(mintree + loff + c, mask=lm, other=float("inf"))
    if FROM_CLAIMS:
        cl = tl.load(claims + c, mask=lm, other=-1)
        claimed = cl >= 0
        new = (cl & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        v = tl.where(claimed, new, v)
        mv = tl.where(claimed, new, mv)
        tl.store(tree + loff + c, new, mask=claimed)
        tl.store(mintree + loff + c, new, mask=claimed)
        tl.store(claims + c, tl.zeros_like(cl) - 1, mask=claimed)
        pmax = tl.max(tl.max(tl.where(claimed, new, 0.0), axis=1), axis=0)
        tl.atomic_max(scalars + S_MAXP, pmax, mask=pmax > 0)
    tl.store(tree + poff + par, tl.sum(v, axis=1), mask=last)
    tl.store(mintree + poff + par, tl.min(mv, axis=1), mask=last)
    tl.store(arrive + poff + par, tl.zeros_like(old), mask=last)
    return par, last


@triton.jit
def _update_apply(
    tree,
    mintree,
    claims,
    arrive,
    scalars,
    clean,  # [B] int64 from the claim pass: the slot, or -1 where the entry was dropped
    level_off,
    leaf_off,
    B,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    DEPTH: tl.constexpr,
    BLOCK: tl.constexpr,
    st_tree=0,
    st_claims=0,  # of claims and arrive
    st_sc=0,
    st_b=0,
    INST: tl.constexpr = False,
):
    """The update's second launch: the last entry under each leaf parent writes its claimed leaves,
    recomputes it and climbs (the count pass ran in the claim launch). A tree of one level: each
    slot's winning entry writes its leaf. INST: instance ``k`` of grid axis 1, whose arrivals
    count in its own counters (the instances' climbs never meet)."""
    s, m = lanes(B, BLOCK)
    if INST:
        k = instance(INST)
        tree += k * st_tree
        mintree += k * st_tree
        claims += k * st_claims
        arrive += k * st_claims
        scalars += k * st_sc
        clean += k * st_b
    i = tl.load(clean + s, mask=m, other=-1)
    valid = i >= 0
    i = tl.maximum(i, 0)
    if DEPTH == 1:
        packed = tl.load(claims + i, mask=valid, other=-1)
        # a loser reads the winner's claim or, once the winner has reset it, -1: never its own position
        win = valid & ((packed >> 32) == s)
        p = (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        tl.store(tree + leaf_off + i, p, mask=win)
        tl.store(mintree + leaf_off + i, p, mask=win)
        tl.store(claims + i, tl.full([BLOCK], -1, tl.int64), mask=win)
        pmax = tl.max(tl.where(win, p, 0.0), axis=0)
        tl.atomic_max(scalars + S_MAXP, pmax, mask=pmax > 0)
    else:
        par, last = _leaf_parent(tree, mintree, claims, arrive, scalars, level_off, i, valid, DEPTH, K, LOG2K, True)
        _climb(tree, mintree, arrive, level_off, par, last, 0, 0, 1, DEPTH - 2, DEPTH, K, LOG2K, False)


@triton.jit
def _count_leaves(arrive, level_off, leaves, n, DEPTH: tl.constexpr, LOG2K: tl.constexpr, BLOCK: tl.constexpr):
    """Count pass for :func:`recompute`: every entry >= 0 of ``leaves`` (duplicates allowed)."""
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    i = tl.load(leaves + s, mask=s < n, other=-1)
    _count_chain(arrive, level_off, tl.maximum(i, 0), i >= 0, DEPTH, LOG2K)


@triton.jit
def _climb_leaves(
    tree,
    mintree,
    arrive,
    level_off,
    leaves,
    n,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    DEPTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Climb for :func:`recompute`: every entry >= 0 of ``leaves`` (written before this launch)
    arrives once at its parent, as it was counted."""
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    i = tl.load(leaves + s, mask=s < n, other=-1)
    par, last = _leaf_parent(
        tree, mintree, leaves, arrive, leaves, level_off, tl.maximum(i, 0), i >= 0, DEPTH, K, LOG2K, False
    )
    _climb(tree, mintree, arrive, level_off, par, last, 0, 0, 1, DEPTH - 2, DEPTH, K, LOG2K, False)


@triton.jit
def _write_field(
    rows,
    rows8,
    pos,
    s,
    m,
    src,
    OFF: tl.constexpr,
    NB: tl.constexpr,
    NP: tl.constexpr,
    IS_BYTE: tl.constexpr,
    W: tl.constexpr,
):
    """One field of rows ``s`` written at slots ``pos``: ``NB`` bytes at byte ``OFF`` of a row, from
    ``src`` (its items contiguous). Whole-word fields move as int32 words (``NP``: the word count
    rounded up to a power of two), others byte by byte (``NP``: the byte count rounded up)."""
    k = tl.arange(0, NP)
    if IS_BYTE:
        km = m[:, None] & (k < NB)[None, :]
        x = tl.load(src + s[:, None] * NB + k[None, :], mask=km, other=0)
        tl.store(rows8 + pos[:, None] * (4 * W) + OFF + k[None, :], x, mask=km)
    else:
        km = m[:, None] & (k < NB // 4)[None, :]
        x = tl.load(src + s[:, None] * (NB // 4) + k[None, :], mask=km, other=0)
        tl.store(rows + pos[:, None] * W + OFF // 4 + k[None, :], x, mask=km)


@triton.jit
def _enter_leaves(tree, mintree, gen, scalars, leaf_off, pos, m, value, USE_MAX: tl.constexpr, BLOCK: tl.constexpr):
    """New items at slots ``pos`` (masked by ``m``): their leaves at the max priority (or ``value``)
    in both trees, their generations advanced. Shared by the add's kernels (``_add_write`` here,
    ``triton_update._add_commit``)."""
    if USE_MAX:
        p = tl.load(scalars + S_MAXP) + tl.zeros([BLOCK], tl.float32)
    else:
        p = value + tl.zeros([BLOCK], tl.float32)
    tl.store(tree + leaf_off + pos, p, mask=m)
    tl.store(mintree + leaf_off + pos, p, mask=m)
    tl.store(gen + pos, tl.load(gen + pos, mask=m, other=0) + 1, mask=m)


@triton.jit
def _source_stride(n, F: tl.constexpr):
    """Elements of one instance's ``n`` items of a contiguous [N, n, ...] source of field ``F``
    (bytes where the field is read by bytes, int32 words otherwise)."""
    if F[3]:
        st = n * F[1]
    else:
        st = n * (F[1] // 4)
    return st


@triton.jit
def _add_write(
    tree,
    mintree,
    gen,
    counters,
    scalars,
    rows,  # [capacity, W] int32
    rows8,  # the same memory as uint8
    out_pos,  # [n] int64: the slots written
    s0,
    s1,
    s2,
    s3,
    s4,
    s5,
    leaf_off,
    n,  # items written: the last n of the batch
    skip,  # items of the batch before them (a batch larger than the buffer)
    cap,
    value,
    F0: tl.constexpr,  # per field (byte offset, bytes, power of two, read by bytes), or None
    F1: tl.constexpr,
    F2: tl.constexpr,
    F3: tl.constexpr,
    F4: tl.constexpr,
    F5: tl.constexpr,
    W: tl.constexpr,
    USE_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    st_tree=0,
    st_gen=0,
    st_ctr=0,
    st_sc=0,
    st_rows=0,  # in int32 words
    st_pos=0,
    INST: tl.constexpr = False,
):
    """The add's first launch: rows from the caller's tensors at the cursor, leaves at the max
    priority (or ``value``), generations advanced. Nothing here waits on another program. INST:
    instance ``k`` of grid axis 1; each source is then [N, n, ...] contiguous (its stride
    follows from n and the field's size)."""
    s, m = lanes(n, BLOCK)
    if INST:
        k = instance(INST)
        tree += k * st_tree
        mintree += k * st_tree
        gen += k * st_gen
        counters += k * st_ctr
        scalars += k * st_sc
        rows += k * st_rows
        rows8 += k * (4 * st_rows)
        out_pos += k * st_pos
        s0 += k * _source_stride(n, F0)
        if F1 is not None:
            s1 += k * _source_stride(n, F1)
        if F2 is not None:
            s2 += k * _source_stride(n, F2)
        if F3 is not None:
            s3 += k * _source_stride(n, F3)
        if F4 is not None:
            s4 += k * _source_stride(n, F4)
        if F5 is not None:
            s5 += k * _source_stride(n, F5)
    cursor = tl.load(counters + C_CURSOR)  # advanced by _add_repair
    pos = (cursor + skip + s) % cap
    tl.store(out_pos + s, pos, mask=m)
    _write_field(rows, rows8, pos, s, m, s0, F0[0], F0[1], F0[2], F0[3], W)
    if F1 is not None:
        _write_field(rows, rows8, pos, s, m, s1, F1[0], F1[1], F1[2], F1[3], W)
    if F2 is not None:
        _write_field(rows, rows8, pos, s, m, s2, F2[0], F2[1], F2[2], F2[3], W)
    if F3 is not None:
        _write_field(rows, rows8, pos, s, m, s3, F3[0], F3[1], F3[2], F3[3], W)
    if F4 is not None:
        _write_field(rows, rows8, pos, s, m, s4, F4[0], F4[1], F4[2], F4[3], W)
    if F5 is not None:
        _write_field(rows, rows8, pos, s, m, s5, F5[0], F5[1], F5[2], F5[3], W)
    _enter_leaves(tree, mintree, gen, scalars, leaf_off, pos, m, value, USE_MAX, BLOCK)


@triton.jit
def _add_repair(
    tree,
    mintree,
    counters,
    arrive,
    level_off,
    n,
    skip,
    total,  # the batch's size: cursor and size move on by it
    cap,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    BLOCK: tl.constexpr,
    st_tree=0,
    st_ctr=0,
    st_arrive=0,
    INST: tl.constexpr = False,
):
    """The add's second launch: one lane per leaf parent of the written range recomputes it from
    its leaves, then climbs (the range gives every node's number of arrivals); the last program
    advances cursor and size (every program has read the cursor before it takes its ticket).
    INST: instance ``k`` of grid axis 1, with its own cursor, counters and election."""
    if INST:
        k = instance(INST)
        tree += k * st_tree
        mintree += k * st_tree
        counters += k * st_ctr
        arrive += k * st_arrive
    kk = tl.arange(0, K)
    cursor = tl.load(counters + C_CURSOR)
    a = (cursor + skip) % cap
    if DEPTH >= 2:
        j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        e = a + n
        lo1 = a >> LOG2K
        n1 = ((tl.minimum(e, cap) - 1) >> LOG2K) - lo1 + 1
        # after a wrap, the parents of leaves 0 .. e - cap - 1 that the first part did not hold
        hi2 = tl.minimum((e - cap - 1) >> LOG2K, lo1 - 1)
        n2 = tl.where(e > cap, tl.maximum(hi2 + 1, 0), 0)
        par = tl.where(j < n1, lo1 + j, j - n1)
        active = j < n1 + n2
        poff = tl.load(level_off + (DEPTH - 2))
        loff = tl.load(level_off + (DEPTH - 1))
        c = loff + par[:, None] * K + kk[None, :]
        v = tl.load(tree + c, mask=active[:, None], other=0.0)
        tl.store(tree + poff + par, tl.sum(v, axis=1), mask=active)
        mv = tl.load(mintree + c, mask=active[:, None], other=float("inf"))
        tl.store(mintree + poff + par, tl.min(mv, axis=1), mask=active)
        _climb(tree, mintree, arrive, level_off, par, active, a, n, cap, DEPTH - 2, DEPTH, K, LOG2K, True)
    tl.debug_barrier()  # every warp's read of the cursor, before this program's ticket
    ticket = tl.atomic_add(counters + C_TICKET_TOP, 1)  # this launch's election
    last = ticket == tl.num_programs(0) - 1
    size = tl.load(counters + C_SIZE)  # only this program writes it
    tl.store(counters + C_CURSOR, (cursor + total) % cap, mask=last)
    tl.store(counters + C_SIZE, tl.minimum(size + total, cap), mask=last)
    tl.store(counters + C_TICKET_TOP, ticket * 0, mask=last)
