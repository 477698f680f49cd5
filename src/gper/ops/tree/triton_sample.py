"""The sampling kernel of the tree's Triton back end (launched by :func:`gper.ops.tree.triton.sample`).

``_sample_kernel`` is the whole of ``sample`` in one launch: per-level Philox descent (or
stratified / uniform draws), gather of every field (one packed row per slot), generations, IS
weights, and the RNG counter advance (the last program to finish bumps it, elected by an atomic
ticket, so the kernel can be replayed in a CUDA graph). ``_draw_rows`` (the draw, then the slots,
weights and generations stored and the rows read) is shared with the trajectory buffer's kernel,
so both draw the same slots.
"""

from __future__ import annotations

from gper._triton import tl, triton
from gper.ops.triton_lanes import instance, lanes
from gper.ops.triton_slots import C_RNG, C_SIZE, C_TICKET, MODE_STRATIFIED, MODE_UNIFORM


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
    Shared (through :func:`_draw_rows`) by the flat buffer's kernel and the trajectory buffer's,
    so both draw the same slots."""
    kk = tl.arange(0, K)
    base = tl.load(counters + C_RNG)
    last_filled = tl.maximum(tl.load(counters + C_SIZE) - 1, 0)
    ctr = base + s * NB
    if MODE == MODE_UNIFORM:  # 53 random bits scaled by the filled size
        a, b, _, _ = tl.randint4x(seed, ctr)
        u = (a >> 5).to(tl.float64) * 67108864.0 + (b >> 6).to(tl.float64)
        size = tl.load(counters + C_SIZE).to(tl.float64)
        node = (u * 1.1102230246251565e-16 * size).to(tl.int64)
        w = tl.full([BLOCK], 1.0, tl.float32)
    else:
        node = tl.zeros([BLOCK], dtype=tl.int64)
        if MODE == MODE_STRATIFIED:  # a float64 threshold in stratum s, rescaled level by level
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
            if MODE == MODE_STRATIFIED:
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
            if MODE == MODE_STRATIFIED:
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
def _draw_rows(
    tree,
    mintree,
    level_off,
    rows,
    gen,
    counters,
    beta_ptr,
    out_idx,
    out_gen,
    out_w,
    seed,
    B,
    s,
    m,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    NB: tl.constexpr,
    MODE: tl.constexpr,
    W: tl.constexpr,
    WP: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG2K: tl.constexpr,
):
    """The draws ``s`` (:func:`_draw`) with their slots, IS weights and generations stored, and their
    rows read: (slots, the RNG counter read, the row's columns, their mask, the [BLOCK, WP] rows).
    The start of both sampling kernels (the flat buffer's and the trajectory buffer's)."""
    node, w, base = _draw(tree, mintree, level_off, counters, beta_ptr, seed, B, s, m, DEPTH, K, NB, MODE, BLOCK, LOG2K)
    tl.store(out_idx + s, node, mask=m)
    tl.store(out_w + s, w, mask=m)
    tl.store(out_gen + s, tl.load(gen + node, mask=m, other=0), mask=m)
    cols = tl.arange(0, WP)
    cm = m[:, None] & (cols[None, :] < W)
    vals = tl.load(rows + node[:, None] * W + cols[None, :], mask=cm, other=0)
    return node, base, cols, cm, vals


@triton.jit
def _advance_rng(counters, base, B, NB: tl.constexpr):
    """The last program of a sampling kernel advances the RNG counter: all have read it by then
    (the barrier: every warp's read, not only the ticket's thread's). In a launch for several
    instances ``counters`` is the instance's own, and axis 0 counts the programs of one instance."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counters + C_TICKET, 1)
    last = ticket == tl.num_programs(0) - 1
    tl.store(counters + C_RNG, base + B * NB, mask=last)
    tl.store(counters + C_TICKET, ticket * 0, mask=last)


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
    st_tree=0,  # per-instance strides (elements) of a launch for several instances (INST)
    st_gen=0,
    st_ctr=0,
    st_rows=0,
    st_beta=0,  # 0: one beta shared by every instance
    st_orows=0,
    st_oidx=0,
    st_ogen=0,
    st_ow=0,
    INST: tl.constexpr = False,
):
    s, m = lanes(B, BLOCK)
    if INST:  # instance k (grid axis 1): its own tensors, and its own Philox key seed + k
        k = instance(INST)
        tree += k * st_tree
        mintree += k * st_tree
        rows += k * st_rows
        gen += k * st_gen
        counters += k * st_ctr
        beta_ptr += k * st_beta
        out_rows += k * st_orows
        out_idx += k * st_oidx
        out_gen += k * st_ogen
        out_w += k * st_ow
        seed = seed + k  # int64 (k is): an int32 seed + k does not overflow
    _, base, cols, cm, vals = _draw_rows(
        tree, mintree, level_off, rows, gen, counters, beta_ptr, out_idx, out_gen, out_w, seed, B, s, m,
        DEPTH, K, NB, MODE, W, WP, BLOCK, LOG2K,
    )  # fmt: skip
    tl.store(out_rows + s[:, None] * W + cols[None, :], vals, mask=cm)
    _advance_rng(counters, base, B, NB)
