"""The priority update's and the level-by-level repair's kernels of the tree's Triton back end
(launched by :mod:`gper.ops.tree.triton`).

* ``_update_claim`` + ``_update_leaves`` + one ``_recompute_level`` per remaining level: priority
  update of fewer than ``LAUNCH.climb_min_batch`` entries (more take the climb of
  :mod:`gper.ops.tree.triton_climb`). Last occurrence wins among duplicates (an atomic max of
  ``batch position << 32 | priority bits`` claims each slot); parents are recomputed from their
  children one level per launch, so no walk-up races and no delta drift (``docs/design.md``,
  *Updates*). The leaf write shares a launch with the first parent level (children being written
  in that launch are read from the claims), and the top level shares level 1's launch (its last
  program recomputes it): 4 launches at 2^25 with K = 32.
* ``_add_positions`` + ``_add_commit`` + ``_recompute_level``: new items at max priority, where the
  one-launch add of :mod:`gper.ops.tree.triton_climb` cannot write the rows itself.
"""

from __future__ import annotations

from gper._triton import tl, triton
from gper.ops.tree.triton_climb import _count_chain, _enter_leaves
from gper.ops.triton_lanes import instance, lanes
from gper.ops.triton_slots import C_CURSOR, C_INVALID, C_NONFINITE, C_SIZE, C_STALE, C_TICKET_TOP, S_MAXP


@triton.jit
def _update_claim(
    idx,  # [B] int64
    td,  # [B] float
    expected_gen,  # [B] int32 (read only if HAS_GEN)
    gen,  # [capacity] int32
    claims,  # [capacity + K] int64, -1 between calls
    counters,
    scalars,
    clean,  # [B] int64 out: idx, or -1 where dropped
    arrive,  # the climb's counters (read only if COUNT)
    level_off,
    alpha,  # a float; with INST an [N] float32 pointer (each instance's)
    eps,  # as alpha
    B,
    HAS_GEN: tl.constexpr,
    COUNT: tl.constexpr,
    DEPTH: tl.constexpr,
    LOG2K: tl.constexpr,
    BLOCK: tl.constexpr,
    st_b=0,  # per-instance strides (elements) with INST: of idx, td, expected_gen and clean
    st_gen=0,
    st_claims=0,  # of claims and arrive
    st_ctr=0,
    st_sc=0,
    INST: tl.constexpr = False,
):
    s, m = lanes(B, BLOCK)
    if INST:  # instance k (grid axis 1): its own entries, tensors and alpha, eps
        k = instance(INST)
        idx += k * st_b
        td += k * st_b
        expected_gen += k * st_b
        clean += k * st_b
        gen += k * st_gen
        claims += k * st_claims
        arrive += k * st_claims
        counters += k * st_ctr
        scalars += k * st_sc
        alpha = tl.load(alpha + k)
        eps = tl.load(eps + k)
    i = tl.load(idx + s, mask=m, other=0)
    size = tl.load(counters + C_SIZE)
    in_range = m & (i >= 0) & (i < size)
    valid = in_range
    if HAS_GEN:
        g = tl.load(gen + i, mask=in_range, other=0)
        valid = valid & (g == tl.load(expected_gen + s, mask=m, other=0))
    d = tl.load(td + s, mask=m, other=0.0).to(tl.float32)
    finite = (d == d) & (tl.abs(d) < float("inf"))
    # |td| and the priority clamped to P_MAX = 2^64: no sum of the tree can overflow float32
    p = tl.exp2(alpha * tl.log2(tl.minimum(tl.abs(d), 18446744073709551616.0) + eps))
    p = tl.minimum(p, 18446744073709551616.0)
    # nothing writes the max before the next launch (_update_leaves or _update_apply): nonfinite
    # values all map to the old max
    p = tl.where(finite, p, tl.load(scalars + S_MAXP))
    # claim the slot with (batch position, priority bits): the atomic max keeps the last occurrence
    packed = (s << 32) | p.to(tl.int32, bitcast=True).to(tl.int64)
    tl.atomic_max(claims + i, packed, mask=valid)
    if COUNT:  # every entry arrives at its leaf's parent in the climb: count it there
        _count_chain(arrive, level_off, i, valid, DEPTH, LOG2K)
    tl.store(clean + s, tl.where(valid, i, -1), mask=m)
    n_invalid = tl.sum((m & ~in_range).to(tl.int64), axis=0)
    n_stale = tl.sum((in_range & ~valid).to(tl.int64), axis=0)
    n_nonfinite = tl.sum((valid & ~finite).to(tl.int64), axis=0)
    tl.atomic_add(counters + C_INVALID, n_invalid, mask=n_invalid > 0)
    tl.atomic_add(counters + C_STALE, n_stale, mask=n_stale > 0)
    tl.atomic_add(counters + C_NONFINITE, n_nonfinite, mask=n_nonfinite > 0)


@triton.jit
def _unpack_priority(packed):
    return (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _update_leaves(
    tree,
    mintree,
    claims,
    scalars,
    clean,
    leaf_off,
    par_off,
    B,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    PARENT: tl.constexpr,
    WITH_MIN: tl.constexpr,
    BLOCK: tl.constexpr,
    st_tree=0,
    st_claims=0,
    st_sc=0,
    st_b=0,
    INST: tl.constexpr = False,
):
    """Write the claimed leaves and, if PARENT, their parents: children still being written in
    this launch are read from ``claims``, which holds the same values, so there is no race.
    INST: instance ``k`` of grid axis 1 at ``k * st_*`` of each stacked tensor."""
    s, m = lanes(B, BLOCK)
    if INST:
        k = instance(INST)
        tree += k * st_tree
        mintree += k * st_tree
        claims += k * st_claims
        scalars += k * st_sc
        clean += k * st_b
    i = tl.load(clean + s, mask=m, other=-1)
    valid = i >= 0
    i = tl.maximum(i, 0)
    packed = tl.load(claims + i, mask=valid, other=-1)
    win = valid & ((packed >> 32) == s)
    p = _unpack_priority(packed)
    tl.store(tree + leaf_off + i, p, mask=win)
    if WITH_MIN:
        tl.store(mintree + leaf_off + i, p, mask=win)
    pmax = tl.max(tl.where(win, p, 0.0), axis=0)
    tl.atomic_max(scalars + S_MAXP, pmax, mask=pmax > 0)
    if PARENT:
        kk = tl.arange(0, K)
        par = i >> LOG2K
        c = par[:, None] * K + kk[None, :]
        claimed = tl.load(claims + c, mask=valid[:, None], other=-1)
        new = _unpack_priority(claimed)
        v = tl.load(tree + leaf_off + c, mask=valid[:, None], other=0.0)
        tl.store(tree + par_off + par, tl.sum(tl.where(claimed >= 0, new, v), axis=1), mask=valid)
        mv = tl.load(mintree + leaf_off + c, mask=valid[:, None], other=float("inf"))
        tl.store(mintree + par_off + par, tl.min(tl.where(claimed >= 0, new, mv), axis=1), mask=valid)


@triton.jit
def _reset_claims(claims, clean, B, BLOCK: tl.constexpr, st_claims=0, st_b=0, INST: tl.constexpr = False):
    s, m = lanes(B, BLOCK)
    if INST:
        k = instance(INST)
        claims += k * st_claims
        clean += k * st_b
    i = tl.load(clean + s, mask=m, other=-1)
    tl.store(claims + i, tl.full([BLOCK], -1, tl.int64), mask=i >= 0)


@triton.jit
def _recompute_level(
    tree,
    mintree,
    leaves,  # [n] int64 leaf indices; entries < 0 are skipped
    claims,  # reset to -1 at ``leaves`` if RESET
    counters,  # ticket for the TOP election
    par_off,
    ch_off,
    shift,
    n,
    top_off,
    top_n,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    RESET: tl.constexpr,
    TOP: tl.constexpr,
    st_tree=0,
    st_leaves=0,
    st_claims=0,
    st_ctr=0,
    INST: tl.constexpr = False,
):
    """Recompute the parents of ``leaves`` at one level from their children; with TOP (this is
    level 1), the last program to finish also recomputes all of level 0 (at most K nodes). INST:
    instance ``k`` of grid axis 1; the election is then each instance's own (its ticket)."""
    if INST:
        k = instance(INST)
        tree += k * st_tree
        mintree += k * st_tree
        leaves += k * st_leaves
        claims += k * st_claims
        counters += k * st_ctr
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    kk = tl.arange(0, K)
    raw = tl.load(leaves + s, mask=s < n, other=-1)
    m = raw >= 0
    par = tl.maximum(raw, 0) >> shift
    c = ch_off + par[:, None] * K + kk[None, :]
    v = tl.load(tree + c, mask=m[:, None], other=0.0)
    tl.store(tree + par_off + par, tl.sum(v, axis=1), mask=m)
    mv = tl.load(mintree + c, mask=m[:, None], other=float("inf"))
    tl.store(mintree + par_off + par, tl.min(mv, axis=1), mask=m)
    if RESET:
        tl.store(claims + raw, tl.full([BLOCK], -1, tl.int64), mask=m)
    if TOP:
        # last-program election: every program's level-1 stores are released by its ticket (the
        # barrier first: the stores of every warp, not only the ticket's), and the winner reads
        # them back past L1 (.cg)
        tl.debug_barrier()
        ticket = tl.atomic_add(counters + C_TICKET_TOP, 1)
        rows = tl.arange(0, K)
        # the election's outcome as a [K] mask (the interpreter rejects a scalar bool in a 2-D mask)
        last = (rows * 0 + ticket) == tl.num_programs(0) - 1
        rm = (rows < top_n) & last
        cc = par_off + rows[:, None] * K + kk[None, :]
        tv = tl.load(tree + cc, mask=rm[:, None], other=0.0, cache_modifier=".cg")
        tl.store(tree + top_off + rows, tl.sum(tv, axis=1), mask=rm)
        tm = tl.load(mintree + cc, mask=rm[:, None], other=float("inf"), cache_modifier=".cg")
        tl.store(mintree + top_off + rows, tl.min(tm, axis=1), mask=rm)
        tl.store(counters + C_TICKET_TOP + rows * 0, rows * 0, mask=last & (rows == 0))


@triton.jit
def _add_positions(counters, pos, n, skip, cap, BLOCK: tl.constexpr):
    s, m = lanes(n, BLOCK)
    cursor = tl.load(counters + C_CURSOR)
    tl.store(pos + s, (cursor + skip + s) % cap, mask=m)


@triton.jit
def _add_commit(
    tree,
    mintree,
    gen,
    counters,
    scalars,
    pos,
    leaf_off,
    n,
    total,
    cap,
    value,
    USE_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    s = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < n
    i = tl.load(pos + s, mask=m, other=0)
    _enter_leaves(tree, mintree, gen, scalars, leaf_off, i, m, value, USE_MAX, BLOCK)
    # only this kernel writes cursor and size, and _add_positions read them before it
    first = pid == 0
    cursor = tl.load(counters + C_CURSOR)
    size = tl.load(counters + C_SIZE)
    tl.store(counters + C_CURSOR, (cursor + total) % cap, mask=first)
    tl.store(counters + C_SIZE, tl.minimum(size + total, cap), mask=first)
