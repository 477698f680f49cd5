"""Triton kernels for the replay buffer, with launchers of the same signatures as
:mod:`gper.ops.reference` (the semantics are documented there).

Kernels:

* ``_sample_kernel``: the whole of ``sample`` in one launch: per-level Philox descent (or
  stratified / uniform draws), gather of every field (one packed row per slot), generations,
  IS weights, and the RNG counter advance (the last program to finish bumps it, elected by an
  atomic ticket, so the kernel can be replayed in a CUDA graph).
* ``_update_claim`` + ``_update_apply`` (:mod:`gper.ops.triton_tree`, the climb): priority
  update of ``LAUNCH.climb_min_batch`` entries or more, in two launches whatever the depth.
* ``_update_claim`` + ``_update_leaves`` + one ``_recompute_level`` per remaining level:
  priority update of fewer entries. Last occurrence wins among duplicates (an atomic max of
  ``batch position << 32 | priority bits`` claims each slot); parents are recomputed from their
  children one level per launch, so no walk-up races and no delta drift (``docs/design.md``, *Updates*).
  The leaf write shares a launch with the first parent level (children being written in that
  launch are read from the claims), and the top level shares level 1's launch (its last
  program recomputes it): 4 launches at 2^25 with K = 32.
* ``_add_write`` + ``_add_repair`` (:mod:`gper.ops.triton_tree`): the buffer's ``add``; and
  ``_add_positions`` + ``_add_commit`` + ``_recompute_level``, new items at max priority, where the
  add kernel cannot write the rows itself (more than six fields, or a field wider than 512 words).

Triton 3.6 (GPU image) and 3.9 (CI) both compile these: ``tl.load``/``tl.store`` arguments after
the mask are passed by keyword, and nothing uses block pointers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import torch

from gper._triton import tl, triton
from gper.ops import reference
from gper.ops.layout import TreeLayout
from gper.ops.state import rng_blocks
from gper.ops.triton_tree import (
    _add_repair,
    _add_write,
    _climb_leaves,
    _count_chain,
    _count_leaves,
    _update_apply,
    arrive_counters,
    arrive_words,
)

# kernels address the device counters by literal index: C_RNG=0, C_CURSOR=1, C_SIZE=2,
# C_INVALID=3, C_NONFINITE=4, C_STALE=5, C_TICKET=6; scalars: S_MAXP=0; P_MAX = 2^64 (gper.ops.state)


@dataclass
class LaunchConfig:
    """Launch shapes of the kernels: draws (or update entries) per program, and warps per program.

    The defaults were swept on the H200 (``benchmarks/results/kernel-sweep-h200-2e25-*.txt``);
    change them only through :func:`launch_config`."""

    sample_block: int = 16
    sample_warps: int = 4
    update_block: int = 64
    level_block: int = 32
    level_warps: int = 4
    #: tree repair by the two-launch climb (``gper.ops.triton_tree``); False: one launch per level
    climb: bool = True
    #: updates of fewer entries repair level by level: on the H200 the climb's chain of dependent
    #: atomics was slower there at 2^20 and 2^25 slots (9.6-11.0 against 8.2-9.8 us at B = 256),
    #: faster at B = 16384 (8.1 against 13.9 us at 2^20; 15.4 against 16.2 at 2^25)
    climb_min_batch: int = 1024
    climb_block: int = 32
    climb_warps: int = 4
    add_block: int = 16
    add_warps: int = 4


#: the launch shapes in force (read at every launch)
LAUNCH = LaunchConfig()


@contextlib.contextmanager
def launch_config(**shapes: int) -> Iterator[LaunchConfig]:
    """Launch with other shapes inside the block (a sweep's hook: ``benchmarks/kernel_sweep.py``).

    Graphs captured inside keep the shapes they were captured with, also after the block.

    Example::

        with triton_ops.launch_config(sample_block=32, sample_warps=2):
            graph = capture_graph(lambda: rb.sample(16384))
    """
    unknown = sorted(set(shapes) - {f.name for f in fields(LaunchConfig)})
    if unknown:
        raise TypeError(f"launch_config(): unknown launch shapes {unknown}")
    saved = replace(LAUNCH)
    for name, value in shapes.items():
        setattr(LAUNCH, name, int(value))
    try:
        yield LAUNCH
    finally:
        for f in fields(LaunchConfig):
            setattr(LAUNCH, f.name, getattr(saved, f.name))


@triton.jit
def _pick(r0, r1, r2, r3, lane: tl.constexpr):
    if lane == 0:
        r = r0
    elif lane == 1:
        r = r1
    elif lane == 2:
        r = r2
    else:
        r = r3
    return r


@triton.jit
def _draw(
    tree,
    mintree,
    level_off,
    counters,
    beta_ptr,
    seed,
    B,
    s,
    m,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    NB: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG2K: tl.constexpr,
):
    """The draws ``s`` (masked by ``m``) of a sample: (slots, IS weights, the RNG counter read).
    Shared by the flat buffer's kernel and the trajectory buffer's, so both draw the same slots."""
    kk = tl.arange(0, K)
    base = tl.load(counters + 0)  # C_RNG
    last_filled = tl.maximum(tl.load(counters + 2) - 1, 0)  # C_SIZE
    ctr = base + s * NB
    if MODE == 2:  # MODE_UNIFORM: 53 random bits scaled by the filled size
        a, b, _, _ = tl.randint4x(seed, ctr)
        u = (a >> 5).to(tl.float64) * 67108864.0 + (b >> 6).to(tl.float64)
        size = tl.load(counters + 2).to(tl.float64)  # C_SIZE
        node = (u * 1.1102230246251565e-16 * size).to(tl.int64)
        w = tl.full([BLOCK], 1.0, tl.float32)
    else:
        node = tl.zeros([BLOCK], dtype=tl.int64)
        if MODE == 1:  # MODE_STRATIFIED: a float64 threshold in stratum s, rescaled level by level
            q0, q1, q2, q3 = tl.randint4x(seed, ctr + DEPTH // 4)
            jitter = _pick(q0, q1, q2, q3, DEPTH % 4).to(tl.float64) * 2.3283064365386963e-10
            t = (s.to(tl.float64) + jitter) / B
            parent = tl.full([BLOCK], 1.0, tl.float64)
        r0 = tl.zeros([BLOCK], dtype=tl.uint32)
        r1 = r0
        r2 = r0
        r3 = r0
        j = tl.zeros([BLOCK], dtype=tl.int32)
        v = tl.zeros([BLOCK, K], dtype=tl.float32)
        for level in tl.static_range(DEPTH):
            if level % 4 == 0:
                r0, r1, r2, r3 = tl.randint4x(seed, ctr + level // 4)
            off = tl.multiple_of(tl.load(level_off + level), 32)
            # levels are zero-padded past their end: a row-only mask keeps 16-byte vector loads
            v = tl.load(tree + off + node[:, None] * K + kk[None, :], mask=m[:, None], other=0.0)
            cs = tl.cumsum(v.to(tl.float64), axis=1)
            tot = tl.max(cs, axis=1)
            if MODE == 1:
                if level == 0:
                    t = t * tot
                else:
                    t = t * (tot / tl.where(m, parent, 1.0))  # masked lanes: no 0/0
                t = tl.minimum(t, tot * 0.9999999999999998)
            else:
                r = _pick(r0, r1, r2, r3, level % 4)
                t = r.to(tl.float64) * 2.3283064365386963e-10 * tot
            # t < tot, so the count is < K and the chosen child has positive mass
            j = tl.minimum(tl.sum((cs <= t[:, None]).to(tl.int32), axis=1), K - 1)
            # never past the filled range, whatever the tree holds (a no-op on a consistent tree;
            # an inf or NaN planted in it would otherwise send the draw past the storage)
            child = tl.minimum(node * K + j, last_filled >> (LOG2K * (DEPTH - 1 - level)))
            j = (child - node * K).to(tl.int32)
            if MODE == 1:
                below = tl.sum(tl.where(kk[None, :] == j[:, None] - 1, cs, 0.0), axis=1)
                t = tl.maximum(t - below, 0.0)
                parent = tl.sum(tl.where(kk[None, :] == j[:, None], v, 0.0), axis=1).to(tl.float64)
            node = child
        leaf = tl.sum(tl.where(kk[None, :] == j[:, None], v, 0.0), axis=1)
        off0 = tl.load(level_off)
        pmin = tl.min(tl.load(mintree + off0 + kk), axis=0)
        beta = tl.load(beta_ptr)  # clamped to [0, 1], NaN read as 1 (as the reference)
        beta = tl.where(beta == beta, tl.minimum(tl.maximum(beta, 0.0), 1.0), 1.0)
        # w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (p_i / p_min)^-beta; where the ratio
        # overflows float32 (p_i near 2^64, p_min near 2^-126), the difference of the logarithms
        lf = tl.where(m, leaf, pmin)
        ratio = lf / pmin
        lg = tl.where(ratio < float("inf"), tl.log2(ratio), tl.log2(lf) - tl.log2(pmin))
        w = tl.exp2(-beta * lg)
    return node, w, base


@triton.jit
def _advance_rng(counters, base, B, NB: tl.constexpr):
    """The last program of a sampling kernel advances the RNG counter: all have read it by then
    (the barrier: every warp's read, not only the ticket's thread's)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counters + 6, 1)  # C_TICKET
    last = ticket == tl.num_programs(0) - 1
    tl.store(counters + 0, base + B * NB, mask=last)
    tl.store(counters + 6, ticket * 0, mask=last)


@triton.jit
def _sample_kernel(
    tree,  # [numel + 1] float32 sum tree
    mintree,  # [numel + 1] float32 min tree
    level_off,  # [DEPTH] int64 start of each level
    rows,  # [capacity, W] int32 packed storage
    gen,  # [capacity] int32
    counters,  # int64 device counters
    beta_ptr,  # 0-d float32
    out_rows,  # [B, W] int32
    out_idx,  # [B] int64
    out_gen,  # [B] int32
    out_w,  # [B] float32
    seed,
    B,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    NB: tl.constexpr,
    MODE: tl.constexpr,
    W: tl.constexpr,
    WP: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG2K: tl.constexpr,
):
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < B
    node, w, base = _draw(tree, mintree, level_off, counters, beta_ptr, seed, B, s, m, DEPTH, K, NB, MODE, BLOCK, LOG2K)
    tl.store(out_idx + s, node, mask=m)
    tl.store(out_w + s, w, mask=m)
    tl.store(out_gen + s, tl.load(gen + node, mask=m, other=0), mask=m)
    cols = tl.arange(0, WP)
    cm = m[:, None] & (cols[None, :] < W)
    vals = tl.load(rows + node[:, None] * W + cols[None, :], mask=cm, other=0)
    tl.store(out_rows + s[:, None] * W + cols[None, :], vals, mask=cm)
    _advance_rng(counters, base, B, NB)


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
    alpha,
    eps,
    B,
    HAS_GEN: tl.constexpr,
    COUNT: tl.constexpr,
    DEPTH: tl.constexpr,
    LOG2K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < B
    i = tl.load(idx + s, mask=m, other=0)
    size = tl.load(counters + 2)  # C_SIZE
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
    p = tl.where(finite, p, tl.load(scalars + 0))  # S_MAXP
    # claim the slot with (batch position, priority bits): the atomic max keeps the last occurrence
    packed = (s << 32) | p.to(tl.int32, bitcast=True).to(tl.int64)
    tl.atomic_max(claims + i, packed, mask=valid)
    if COUNT:  # every entry arrives at its leaf's parent in the climb: count it there
        _count_chain(arrive, level_off, i, valid, DEPTH, LOG2K)
    tl.store(clean + s, tl.where(valid, i, -1), mask=m)
    n_invalid = tl.sum((m & ~in_range).to(tl.int64), axis=0)
    n_stale = tl.sum((in_range & ~valid).to(tl.int64), axis=0)
    n_nonfinite = tl.sum((valid & ~finite).to(tl.int64), axis=0)
    tl.atomic_add(counters + 3, n_invalid, mask=n_invalid > 0)  # C_INVALID
    tl.atomic_add(counters + 5, n_stale, mask=n_stale > 0)  # C_STALE
    tl.atomic_add(counters + 4, n_nonfinite, mask=n_nonfinite > 0)  # C_NONFINITE


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
):
    """Write the claimed leaves and, if PARENT, their parents: children still being written in
    this launch are read from ``claims``, which holds the same values, so there is no race."""
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < B
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
    tl.atomic_max(scalars + 0, pmax, mask=pmax > 0)  # S_MAXP
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
def _reset_claims(claims, clean, B, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < B
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
):
    """Recompute the parents of ``leaves`` at one level from their children; with TOP (this is
    level 1), the last program to finish also recomputes all of level 0 (at most K nodes)."""
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
        ticket = tl.atomic_add(counters + 7, 1)  # C_TICKET_TOP
        rows = tl.arange(0, K)
        # the election's outcome as a [K] mask (the interpreter rejects a scalar bool in a 2-D mask)
        last = (rows * 0 + ticket) == tl.num_programs(0) - 1
        rm = (rows < top_n) & last
        cc = par_off + rows[:, None] * K + kk[None, :]
        tv = tl.load(tree + cc, mask=rm[:, None], other=0.0, cache_modifier=".cg")
        tl.store(tree + top_off + rows, tl.sum(tv, axis=1), mask=rm)
        tm = tl.load(mintree + cc, mask=rm[:, None], other=float("inf"), cache_modifier=".cg")
        tl.store(mintree + top_off + rows, tl.min(tm, axis=1), mask=rm)
        tl.store(counters + 7 + rows * 0, rows * 0, mask=last & (rows == 0))


@triton.jit
def _add_positions(counters, pos, n, skip, cap, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < n
    cursor = tl.load(counters + 1)  # C_CURSOR
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
    if USE_MAX:
        p = tl.load(scalars + 0) + tl.zeros([BLOCK], tl.float32)  # S_MAXP
    else:
        p = value + tl.zeros([BLOCK], tl.float32)
    tl.store(tree + leaf_off + i, p, mask=m)
    tl.store(mintree + leaf_off + i, p, mask=m)
    tl.store(gen + i, tl.load(gen + i, mask=m, other=0) + 1, mask=m)
    # only this kernel writes cursor and size, and _add_positions read them before it
    first = pid == 0
    cursor = tl.load(counters + 1)
    size = tl.load(counters + 2)
    tl.store(counters + 1, (cursor + total) % cap, mask=first)
    tl.store(counters + 2, tl.minimum(size + total, cap), mask=first)


def _grid(n: int, block: int) -> tuple[int]:
    return (triton.cdiv(n, block),)


def make_claims(*, layout: TreeLayout, device: torch.device) -> torch.Tensor:
    """Claims of an update in progress: [capacity + K] int64, -1 between calls, followed by the
    climb's ``arrive`` counters (:func:`gper.ops.triton_tree.arrive_counters`), 0 between calls.

    Called when a buffer is built; it also makes the level-offset table the sampling kernel
    reads, so that no host-to-device copy happens later inside a caller's graph capture.
    """
    _level_offsets(layout, device)
    n = layout.capacity + layout.arity
    claims = torch.full((n + arrive_words(layout),), -1, dtype=torch.int64, device=device)
    claims[n:] = 0
    return claims


def _levels(tree, mintree, layout: TreeLayout, leaves: torch.Tensor, top: int, claims=None, counters=None) -> None:
    """Recompute levels ``top`` .. 0 above ``leaves``; level 0 rides on level 1's launch."""
    n = leaves.numel()
    levels = list(range(top, -1, -1))
    fold_top = len(levels) >= 2
    if fold_top:
        levels.pop()
    for j, level in enumerate(levels):
        is_top = fold_top and level == 1
        _recompute_level[_grid(n, LAUNCH.level_block)](
            tree,
            mintree,
            leaves,
            claims if claims is not None else leaves,
            counters if is_top else leaves,
            layout.offsets[level],
            layout.offsets[level + 1],
            layout.shift(level),
            n,
            layout.offsets[0],
            layout.sizes[0],
            K=layout.arity,
            BLOCK=LAUNCH.level_block,
            RESET=claims is not None and j == 0,
            TOP=is_top,
            num_warps=LAUNCH.level_warps,
        )
    if claims is not None and not levels:
        _reset_claims[_grid(n, LAUNCH.update_block)](claims, leaves, n, BLOCK=LAUNCH.update_block)


def recompute(*, tree, mintree, layout: TreeLayout, leaves: torch.Tensor, counters: torch.Tensor, claims=None) -> None:
    """Every ancestor of ``leaves`` recomputed: the count pass and the climb (with the claim
    buffer's counters), or without ``claims`` (or with ``LAUNCH.climb`` off) one launch per level."""
    if claims is None or not LAUNCH.climb or layout.depth < 2:
        _levels(tree, mintree, layout, leaves, layout.depth - 2, counters=counters)
        return
    n, off = leaves.numel(), _level_offsets(layout, tree.device)
    arrive = arrive_counters(claims, layout)
    grid, block = _grid(n, LAUNCH.climb_block), LAUNCH.climb_block
    _count_leaves[grid](arrive, off, leaves, n, DEPTH=layout.depth, LOG2K=layout.log2_arity, BLOCK=block)
    _climb_leaves[grid](
        tree,
        mintree,
        arrive,
        off,
        leaves,
        n,
        K=layout.arity,
        LOG2K=layout.log2_arity,
        DEPTH=layout.depth,
        BLOCK=block,
        num_warps=LAUNCH.climb_warps,
    )


def rebuild(*, tree, mintree, layout: TreeLayout) -> None:
    # a dense O(capacity) pass, never on a hot path: the torch twin's runs on CUDA tensors as well
    reference.rebuild(tree=tree, mintree=mintree, layout=layout)


def update(*, tree, mintree, layout, claims, gen, counters, scalars, idx, td, expected_gen, alpha, eps):
    _set_priorities(tree, mintree, layout, claims, gen, counters, scalars, idx, td, expected_gen, alpha, eps, False)


def set_keys(*, keys, layout, claims, gen, counters, scalars, idx, td, expected_gen, eps):
    _set_priorities(keys, keys, layout, claims, gen, counters, scalars, idx, td, expected_gen, 1.0, eps, True)


def _set_priorities(
    tree, mintree, layout, claims, gen, counters, scalars, idx, td, expected_gen, alpha, eps, leaf_only
):
    b = idx.numel()
    clean = torch.empty(b, dtype=torch.int64, device=idx.device)
    has_gen = expected_gen is not None
    climb = LAUNCH.climb and not leaf_only and b >= LAUNCH.climb_min_batch
    off = _level_offsets(layout, tree.device)
    block = LAUNCH.climb_block if climb else LAUNCH.update_block
    _update_claim[_grid(b, block)](
        idx,
        td,
        expected_gen if has_gen else gen,
        gen,
        claims,
        counters,
        scalars,
        clean,
        arrive_counters(claims, layout) if climb else claims,
        off,
        float(alpha),
        float(eps),
        b,
        HAS_GEN=has_gen,
        COUNT=climb and layout.depth >= 2,
        DEPTH=layout.depth,
        LOG2K=layout.log2_arity,
        BLOCK=block,
    )
    if climb:
        _update_apply[_grid(b, block)](
            tree,
            mintree,
            claims,
            arrive_counters(claims, layout),
            scalars,
            clean,
            off,
            layout.leaf_offset,
            b,
            K=layout.arity,
            LOG2K=layout.log2_arity,
            DEPTH=layout.depth,
            BLOCK=block,
            num_warps=LAUNCH.climb_warps,
        )
        return
    grid = _grid(b, LAUNCH.update_block)
    parent = not leaf_only and layout.depth >= 2
    _update_leaves[_grid(b, LAUNCH.level_block)](
        tree,
        mintree,
        claims,
        scalars,
        clean,
        0 if leaf_only else layout.leaf_offset,
        layout.offsets[layout.depth - 2] if parent else 0,
        b,
        K=layout.arity,
        LOG2K=layout.log2_arity,
        PARENT=parent,
        WITH_MIN=not leaf_only,
        BLOCK=LAUNCH.level_block,
        num_warps=LAUNCH.level_warps,
    )
    if parent:
        _levels(tree, mintree, layout, clean, layout.depth - 3, claims=claims, counters=counters)
    else:
        _reset_claims[grid](claims, clean, b, BLOCK=LAUNCH.update_block)


def add_positions(*, counters: torch.Tensor, capacity: int, n: int, skip: int) -> torch.Tensor:
    pos = torch.empty(n, dtype=torch.int64, device=counters.device)
    _add_positions[_grid(n, LAUNCH.update_block)](counters, pos, n, skip, capacity, BLOCK=LAUNCH.update_block)
    return pos


def add_commit(*, tree, mintree, layout, gen, counters, scalars, pos, total, leaf_value, claims=None):
    n = pos.numel()
    _add_commit[_grid(n, LAUNCH.update_block)](
        tree,
        mintree,
        gen,
        counters,
        scalars,
        pos,
        layout.leaf_offset,
        n,
        total,
        layout.capacity,
        0.0 if leaf_value is None else float(leaf_value),
        USE_MAX=leaf_value is None,
        BLOCK=LAUNCH.update_block,
    )
    recompute(tree=tree, mintree=mintree, layout=layout, leaves=pos, counters=counters, claims=claims)


#: the most fields a row may have for the add kernel to write them itself
MAX_ADD_SOURCES = 6
#: the widest field it writes (as a [add_block, width] tile of int32 words, or of bytes for a field
#: read by bytes); wider ones (images, frame stacks) are copied field by field
MAX_ADD_WIDTH = 512


def make_add_plan(*, fields, words, device) -> tuple | None:
    """How the add kernel writes rows of ``fields`` (``(byte offset, bytes)`` each): per field
    ``(offset, bytes, power of two, by bytes)``, where a field that is not whole words (a bool,
    three float16) moves byte by byte. None where the kernel cannot write them (more than
    :data:`MAX_ADD_SOURCES` fields): then ``add_rows`` copies field by field."""
    if len(fields) > MAX_ADD_SOURCES:
        return None
    plan = []
    for offset, nbytes in fields:
        by_bytes = offset % 4 != 0 or nbytes % 4 != 0
        width = triton.next_power_of_2(nbytes if by_bytes else nbytes // 4)
        if width > MAX_ADD_WIDTH:
            return None
        plan.append((offset, nbytes, width, by_bytes))
    return tuple(plan)


def add_rows(
    *, tree, mintree, layout, claims, gen, counters, scalars, rows, fields, values, plan, skip, total, leaf_value
):
    """As the reference's; with a plan (and the climb on), the whole add is one launch."""
    n = values[0].shape[0]
    if plan is None or not LAUNCH.climb:
        pos = add_positions(counters=counters, capacity=layout.capacity, n=n, skip=skip)
        reference.write_fields(rows, fields, values, pos)
        add_commit(
            tree=tree,
            mintree=mintree,
            layout=layout,
            gen=gen,
            counters=counters,
            scalars=scalars,
            pos=pos,
            total=total,
            leaf_value=leaf_value,
            claims=claims,
        )
        return pos
    srcs = []
    for x, (_, _, _, by_bytes) in zip(values, plan, strict=True):
        flat = x.contiguous().reshape(n, -1)
        if flat.dtype == torch.bool:
            flat = flat.view(torch.uint8)
        if not by_bytes and flat.storage_offset() * flat.element_size() % 4:
            flat = flat.clone()  # a view that starts inside a word (a slice of bytes) reads as words once copied
        srcs.append(flat.view(torch.uint8 if by_bytes else torch.int32))
    srcs += [srcs[0]] * (MAX_ADD_SOURCES - len(srcs))
    specs = list(plan) + [None] * (MAX_ADD_SOURCES - len(plan))
    pos = torch.empty(n, dtype=torch.int64, device=rows.device)
    _add_write[_grid(n, LAUNCH.add_block)](
        tree,
        mintree,
        gen,
        counters,
        scalars,
        rows,
        rows.view(torch.uint8),
        pos,
        *srcs,
        layout.leaf_offset,
        n,
        skip,
        layout.capacity,
        0.0 if leaf_value is None else float(leaf_value),
        F0=specs[0],
        F1=specs[1],
        F2=specs[2],
        F3=specs[3],
        F4=specs[4],
        F5=specs[5],
        W=rows.shape[1],
        USE_MAX=leaf_value is None,
        BLOCK=LAUNCH.add_block,
        num_warps=LAUNCH.add_warps,
    )
    # one lane per leaf parent of the range: at most n / K + 2 of them (its two ends, and a wrap)
    _add_repair[_grid(n // layout.arity + 3, LAUNCH.climb_block)](
        tree,
        mintree,
        counters,
        arrive_counters(claims, layout),
        _level_offsets(layout, tree.device),
        n,
        skip,
        total,
        layout.capacity,
        DEPTH=layout.depth,
        K=layout.arity,
        LOG2K=layout.log2_arity,
        BLOCK=LAUNCH.climb_block,
        num_warps=LAUNCH.climb_warps,
    )
    return pos


_LEVEL_OFFSETS: dict[tuple[TreeLayout, torch.device], torch.Tensor] = {}


def _level_offsets(layout: TreeLayout, device: torch.device) -> torch.Tensor:
    key = (layout, device)
    if key not in _LEVEL_OFFSETS:
        _LEVEL_OFFSETS[key] = torch.tensor(layout.offsets, dtype=torch.int64, device=device)
    return _LEVEL_OFFSETS[key]


def sample(*, tree, mintree, layout, rows, gen, counters, seed, b, mode, beta, out_rows, out_idx, out_gen, out_w):
    w = rows.shape[1]
    _sample_kernel[_grid(b, LAUNCH.sample_block)](
        tree,
        mintree,
        _level_offsets(layout, tree.device),
        rows,
        gen,
        counters,
        beta,
        out_rows,
        out_idx,
        out_gen,
        out_w,
        seed,
        b,
        DEPTH=layout.depth,
        K=layout.arity,
        NB=rng_blocks(layout.depth),
        MODE=mode,
        W=w,
        WP=triton.next_power_of_2(w),
        BLOCK=LAUNCH.sample_block,
        LOG2K=layout.log2_arity,
        num_warps=LAUNCH.sample_warps,
    )
