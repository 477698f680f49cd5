"""The per-step kernels of a sharded buffer in Triton, with the signatures and semantics of
:mod:`gper.ops.shard.reference` (documented there), bit for bit: one launch each, where the torch
reference takes some 140 operations for the shared draws (Philox alone is ten rounds of a dozen
int64 operations, each a kernel of its own) and three to eight for each of the others.

* ``_shared_draws``: one lane per draw: ``tl.randint4x`` (bit for bit
  :func:`gper.ops.philox.randint4x`), the threshold and its owner from the cumulative masses, and
  (stratified) the fraction of this rank's shard. The counter advances in the launch: every
  program reads it first, and the last program to finish (elected by an atomic ticket after a
  barrier, as ``tree_triton._advance_rng``) writes it, so no program reads a moved counter and
  the kernel can be replayed in a CUDA graph.
* ``_pack_rows`` / ``_unpack_rows``: one lane per draw (per received row): the routed words,
  written straight in the ``[W, b]`` order of the reduce-scatter, and read back into the batch.
* ``_pack_updates`` / ``_unpack_updates``: one lane per update entry.
* ``_shard_meta``: one program: the min over the min tree's top level, the size and the max.
* ``_local_priorities`` / ``_local_weights``: one lane per draw of local mode.

Every float operation is one correctly rounded operation of the reference's, in its order (the
draws compiled without contraction, so no product fuses with the sum after it); the rest moves bits.
"""

from __future__ import annotations

import torch

from gper._triton import tl, triton
from gper.ops.shard.reference import OWNER_SHIFT, ROUTE_EXTRA
from gper.ops.state import TreeState
from gper.ops.triton_lanes import lanes
from gper.ops.triton_slots import C_STALE

_BLOCK = 128
#: shards compared at once in the owners' count (larger worlds loop over chunks of it)
_CHUNK = 32
#: row words moved at once (wider rows loop over chunks of it)
_COLS = 128


@triton.jit
def _shard_meta(total, mintop, size, maxp, out, K: tl.constexpr):
    kk = tl.arange(0, K)
    v = tl.load(mintop + kk)
    low = tl.min(v, axis=0)
    low = tl.where(tl.max((v != v).to(tl.int32), axis=0) > 0, float("nan"), low)  # NaN wins, as in amin
    tl.store(out + 0, tl.load(total))
    tl.store(out + 1, tl.load(size).to(tl.float64))
    tl.store(out + 2, low.to(tl.float64))
    tl.store(out + 3, tl.load(maxp).to(tl.float64))


def shard_meta(*, total: torch.Tensor, mintop: torch.Tensor, size: torch.Tensor, maxp: torch.Tensor) -> torch.Tensor:
    out = torch.empty(4, dtype=torch.float64, device=total.device)
    k = mintop.numel()
    if k & (k - 1):  # the top level holds the arity's K nodes, a power of two
        raise ValueError(f"shard_meta(): the min tree's top level has {k} nodes, not a power of two")
    _shard_meta[(1,)](total, mintop, size, maxp, out, K=k)
    return out


@triton.jit
def _shared_draws(
    cum,  # [W] float64 cumulative masses
    mass,  # [W] float64 masses, stride mass_stride (read if STRATIFIED)
    counter,  # [1] int64 Philox counter of the shared draws
    ticket,  # [1] int64, 0 between launches
    out_t,  # [n] float64
    out_owner,  # [n] int64
    out_frac,  # [n] float64 (written if STRATIFIED)
    key,
    n,
    rank,
    mass_stride,
    W: tl.constexpr,
    CHUNK: tl.constexpr,
    STRATIFIED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    s, m = lanes(n, BLOCK)
    base = tl.load(counter)
    word, _, _, _ = tl.randint4x(key, base + s)
    u = word.to(tl.float64) * 2.3283064365386963e-10  # 2^-32: exact
    total = tl.load(cum + (W - 1))
    if STRATIFIED:
        inv_n = 1.0 / (s * 0 + n).to(tl.float64)
        t = (s.to(tl.float64) + u) * inv_n * total
    else:
        t = u * total
    count = tl.zeros([BLOCK], dtype=tl.int64)
    for c0 in tl.static_range(0, W, CHUNK):
        kk = c0 + tl.arange(0, CHUNK)
        cs = tl.load(cum + kk, mask=kk < W, other=0.0)
        count += tl.sum(((cs[None, :] <= t[:, None]) & (kk < W)[None, :]).to(tl.int64), axis=1)
    owner = tl.minimum(count, W - 1)
    tl.store(out_t + s, t, mask=m)
    tl.store(out_owner + s, owner, mask=m)
    if STRATIFIED:
        m_rank = tl.load(mass + rank * mass_stride)
        below = tl.load(cum + rank) - m_rank
        f = (t - below) / m_rank
        f = tl.where(owner == rank, f, 0.0)
        hi = tl.full([BLOCK], 0.9999999999999998, tl.float64)  # 1 - 2^-52, built in float64
        clamped = tl.minimum(tl.maximum(f, 0.0), hi)
        tl.store(out_frac + s, tl.where(f == f, clamped, f), mask=m)  # NaN stays NaN, as torch's clamp
    # every warp has read the counter before its program takes a ticket; the last program moves it
    tl.debug_barrier()
    tk = tl.atomic_add(ticket, 1)
    last = tk == tl.num_programs(0) - 1
    tl.store(counter, base + n, mask=last)
    tl.store(ticket, tk * 0, mask=last)


def shared_draws(
    *,
    cum: torch.Tensor,
    mass: torch.Tensor,
    counter: torch.Tensor,
    ticket: torch.Tensor,
    key: int,
    n: int,
    stratified: bool,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    w = cum.numel()
    t = torch.empty(n, dtype=torch.float64, device=cum.device)
    owner = torch.empty(n, dtype=torch.int64, device=cum.device)
    frac = torch.empty(n, dtype=torch.float64, device=cum.device) if stratified else t
    _shared_draws[(triton.cdiv(n, _BLOCK),)](
        cum,
        mass,
        counter,
        ticket,
        t,
        owner,
        frac,
        key,
        n,
        rank,
        mass.stride(0),
        W=w,
        CHUNK=min(_CHUNK, triton.next_power_of_2(w)),
        STRATIFIED=stratified,
        BLOCK=_BLOCK,
        enable_fp_fusion=False,
    )
    return t, owner, frac if stratified else None


@triton.jit
def _copy_words(src, dst, m, keep, WORDS: tl.constexpr, COLS: tl.constexpr):
    """A row of ``WORDS`` int32 words from each lane's ``src`` to its ``dst`` (row pointers, [BLOCK]
    each) for the lanes ``m``, ``COLS`` words at a time; lanes outside ``keep`` write zeros.
    The row move of ``_pack_rows`` and ``_unpack_rows``."""
    for c0 in range(0, WORDS, COLS):
        cols = c0 + tl.arange(0, COLS)
        cm = m[:, None] & (cols < WORDS)[None, :]
        vals = tl.load(src[:, None] + cols[None, :], mask=keep[:, None] & cm, other=0)
        tl.store(dst[:, None] + cols[None, :], vals, mask=cm)


@triton.jit
def _pack_rows(
    rows,  # [n, WORDS] int32
    idx,  # [n] int64
    gen,  # [n] int32
    leaves,  # [capacity] int32 bits of the stored priorities
    owner,  # [n] int64
    out,  # [WORLD, n / WORLD, WORDS + 4] int32
    n,
    b,
    rank,
    WORLD: tl.constexpr,
    WORDS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    d, m = lanes(n, BLOCK)
    mine = m & (tl.load(owner + d, mask=m, other=-1) == rank)
    # draw d = j * WORLD + k is row j of rank k
    dst = out + ((d % WORLD) * b + d // WORLD) * (WORDS + 4)
    _copy_words(rows + d * WORDS, dst, m, mine, WORDS, COLS)
    slot = tl.load(idx + d, mask=mine, other=0)
    tl.store(dst + WORDS, slot.to(tl.int32), mask=m)  # the low word (little-endian, as the int32 view)
    tl.store(dst + WORDS + 1, (slot >> 32).to(tl.int32), mask=m)
    tl.store(dst + WORDS + 2, tl.load(gen + d, mask=mine, other=0), mask=m)
    tl.store(dst + WORDS + 3, tl.load(leaves + slot, mask=mine, other=0), mask=m)


def pack_rows(
    *,
    rows: torch.Tensor,
    indices: torch.Tensor,
    generations: torch.Tensor,
    leaves: torch.Tensor,
    owner: torch.Tensor,
    rank: int,
    world: int,
) -> torch.Tensor:
    n, words = rows.shape
    out = torch.empty(world, n // world, words + ROUTE_EXTRA, dtype=torch.int32, device=rows.device)
    _pack_rows[(triton.cdiv(n, _BLOCK),)](
        rows.contiguous(),
        indices.contiguous(),
        generations.contiguous(),
        leaves.view(torch.int32),
        owner.contiguous(),
        out,
        n,
        n // world,
        rank,
        WORLD=world,
        WORDS=words,
        COLS=min(_COLS, triton.next_power_of_2(words)),
        BLOCK=_BLOCK,
    )
    return out


@triton.jit
def _unpack_rows(
    recv,  # [b, WORDS + 4] int32
    owner,  # [b * WORLD] int64
    out_rows,  # [b, WORDS] int32
    out_idx,  # [b] int64
    out_gen,  # [b] int32
    out_p,  # [b] int32 bits of float32 priorities
    out_owner,  # [b] int64
    b,
    rank,
    WORLD: tl.constexpr,
    WORDS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    j, m = lanes(b, BLOCK)
    src = recv + j * (WORDS + 4)
    _copy_words(src, out_rows + j * WORDS, m, m, WORDS, COLS)
    lo = tl.load(src + WORDS, mask=m, other=0).to(tl.int64) & 0xFFFFFFFF
    hi = tl.load(src + WORDS + 1, mask=m, other=0).to(tl.int64)
    tl.store(out_idx + j, (hi << 32) | lo, mask=m)
    tl.store(out_gen + j, tl.load(src + WORDS + 2, mask=m, other=0), mask=m)
    tl.store(out_p + j, tl.load(src + WORDS + 3, mask=m, other=0), mask=m)
    tl.store(out_owner + j, tl.load(owner + j * WORLD + rank, mask=m, other=0), mask=m)


def unpack_rows(
    *, recv: torch.Tensor, owner: torch.Tensor, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    b, words = recv.shape[0], recv.shape[1] - ROUTE_EXTRA
    dev = recv.device
    rows = torch.empty(b, words, dtype=torch.int32, device=dev)
    indices = torch.empty(b, dtype=torch.int64, device=dev)
    gens = torch.empty(b, dtype=torch.int32, device=dev)
    p = torch.empty(b, dtype=torch.float32, device=dev)
    mine = torch.empty(b, dtype=torch.int64, device=dev)
    _unpack_rows[(triton.cdiv(b, _BLOCK),)](
        recv.contiguous(),
        owner.contiguous(),
        rows,
        indices,
        gens,
        p.view(torch.int32),
        mine,
        b,
        rank,
        WORLD=world,
        WORDS=words,
        COLS=min(_COLS, triton.next_power_of_2(words)),
        BLOCK=_BLOCK,
    )
    return rows, indices, gens, p, mine


@triton.jit
def _pack_updates(owners, idx, gen, td, out, b, STALE: tl.constexpr, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    s, m = lanes(b, BLOCK)
    if STALE:
        g = tl.full([BLOCK], -1, tl.int64)
    else:
        g = (tl.load(owners + s, mask=m, other=0) << SHIFT) + tl.load(idx + s, mask=m, other=0)
    tl.store(out + 4 * s, g.to(tl.int32), mask=m)
    tl.store(out + 4 * s + 1, (g >> 32).to(tl.int32), mask=m)
    tl.store(out + 4 * s + 2, tl.load(gen + s, mask=m, other=0), mask=m)
    tl.store(out + 4 * s + 3, tl.load(td + s, mask=m, other=0), mask=m)


def pack_updates(
    *, owners: torch.Tensor, indices: torch.Tensor, generations: torch.Tensor, td: torch.Tensor, stale: bool
) -> torch.Tensor:
    b = indices.numel()
    out = torch.empty(b, 4, dtype=torch.int32, device=indices.device)
    _pack_updates[(triton.cdiv(b, _BLOCK),)](
        owners.contiguous(),
        indices.contiguous(),
        generations.contiguous(),
        td.contiguous().view(torch.int32),
        out,
        b,
        STALE=stale,
        SHIFT=OWNER_SHIFT,
        BLOCK=_BLOCK,
    )
    return out


@triton.jit
def _unpack_updates(
    every,  # [n, 4] int32
    gen,  # [capacity] int32
    counters,  # int64 device counters (C_STALE = 5)
    out_slot,  # [n] int64
    out_gen,  # [n] int32
    out_td,  # [n] int32 bits of float32 TD errors
    n,
    rank,
    SHIFT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    s, m = lanes(n, BLOCK)
    lo = tl.load(every + 4 * s, mask=m, other=0).to(tl.int64) & 0xFFFFFFFF
    hi = tl.load(every + 4 * s + 1, mask=m, other=-1).to(tl.int64)
    g = (hi << 32) | lo
    owned = m & ((g >> SHIFT) == rank)
    slot = tl.where(owned, g & ((1 << SHIFT) - 1), 0)
    mask_gen = tl.load(gen + slot, mask=m, other=0) ^ -1  # ~gen: a generation that cannot match
    tl.store(out_slot + s, slot, mask=m)
    tl.store(out_gen + s, tl.where(owned, tl.load(every + 4 * s + 2, mask=m, other=0), mask_gen), mask=m)
    tl.store(out_td + s, tl.where(owned, tl.load(every + 4 * s + 3, mask=m, other=0), 0), mask=m)
    others = tl.sum((m & ~owned).to(tl.int64), axis=0)
    tl.atomic_add(counters + C_STALE, -others, mask=others > 0)


def unpack_updates(
    *, state: TreeState, every: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = every.shape[0]
    dev = every.device
    slot = torch.empty(n, dtype=torch.int64, device=dev)
    expected = torch.empty(n, dtype=torch.int32, device=dev)
    td = torch.empty(n, dtype=torch.float32, device=dev)
    _unpack_updates[(triton.cdiv(n, _BLOCK),)](
        every.contiguous(),
        state.gen,
        state.counters,
        slot,
        expected,
        td.view(torch.int32),
        n,
        rank,
        SHIFT=OWNER_SHIFT,
        BLOCK=_BLOCK,
    )
    return slot, expected, td


@triton.jit
def _local_priorities(
    cum,
    mass,
    leaves,
    idx,
    out_ratio,
    out_p,
    out_owner,
    b,
    rank,
    mass_stride,
    W: tl.constexpr,
    UNIFORM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    s, m = lanes(b, BLOCK)
    # W m_rank / S in float64, then rounded once to float32 (the reference's operations, in order)
    ratio = (W * tl.load(mass + rank * mass_stride) / tl.load(cum + (W - 1))).to(tl.float32)
    p = tl.load(leaves + tl.load(idx + s, mask=m, other=0), mask=m, other=0.0)
    if not UNIFORM:
        p = tl.where(ratio > 0, p, 1.0)
    tl.store(out_p + s, p, mask=m)
    tl.store(out_owner + s, tl.zeros([BLOCK], dtype=tl.int64) + rank, mask=m)
    tl.store(out_ratio, ratio, mask=tl.program_id(0) == 0)


def local_priorities(
    *,
    cum: torch.Tensor,
    mass: torch.Tensor,
    leaves: torch.Tensor,
    indices: torch.Tensor,
    rank: int,
    uniform: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = indices.numel()
    dev = indices.device
    ratio = torch.empty((), dtype=torch.float32, device=dev)
    p = torch.empty(b, dtype=torch.float32, device=dev)
    owners = torch.empty(b, dtype=torch.int64, device=dev)
    _local_priorities[(triton.cdiv(b, _BLOCK),)](
        cum,
        mass,
        leaves,
        indices.contiguous(),
        ratio,
        p,
        owners,
        b,
        rank,
        mass.stride(0),
        W=cum.numel(),
        UNIFORM=uniform,
        BLOCK=_BLOCK,
        enable_fp_fusion=False,
    )
    return ratio, p, owners


@triton.jit
def _local_weights(ratio, weights, out, b, BLOCK: tl.constexpr):
    s, m = lanes(b, BLOCK)
    r = tl.load(ratio)
    tl.store(out + s, tl.where(r > 0, r * tl.load(weights + s, mask=m, other=0.0), 0.0), mask=m)


def local_weights(*, ratio: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    b = weights.numel()
    out = torch.empty(b, dtype=torch.float32, device=weights.device)
    _local_weights[(triton.cdiv(b, _BLOCK),)](ratio, weights.contiguous(), out, b, BLOCK=_BLOCK)
    return out
