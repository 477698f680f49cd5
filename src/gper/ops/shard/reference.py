"""The per-step kernels of a sharded buffer in vectorized PyTorch: the reference and the torch
back end. :mod:`gper.ops.shard.triton` has the same functions in Triton (one launch each), bit
for bit; :mod:`gper.distributed` calls those of its shard's back end.

Notation (``docs/distributed.md``, *The math*): W shards of masses ``m_k`` (total priority, or
size in uniform mode), cumulative masses ``cum[k] = C_{k+1} = m_0 + ... + m_k`` (one torch
``cumsum``, in rank order, so every rank and both back ends hold the same bits) and ``S = cum[W - 1]``.

* :func:`shard_meta`: what each rank all-gathers before every draw (its shard's mass, size, min and max).
* :func:`shared_draws`: the draws every rank shares. Draw ``s`` takes 32 random bits of Philox
  counter ``counter + s`` (:func:`gper.ops.philox.randint4x`, bit for bit ``tl.randint4x``) as a
  uniform ``u_s`` in ``[0, 1 - 2**-32]``, the threshold ``t_s = u_s S`` (or ``(s + u_s) (1 / n) S``
  stratified) and its owner ``k(s) = #{k : C_{k+1} <= t_s}`` capped at W - 1, so a shard of mass 0
  is never picked; stratified draws also carry ``(t_s - C_k) / m_k`` into the owner's tree.
* :func:`pack_rows` / :func:`unpack_rows`: the rows a reduce-scatter routes to the rank that drew them.
* :func:`pack_updates` / :func:`unpack_updates`: the TD errors an all-gather routes to each slot's shard.
* :func:`local_priorities` / :func:`local_weights`: local mode's shard ratio ``W m_rank / S`` around
  the IS weights of this rank's own draws.

The routed words: a drawn row (int32 words) then its slot (int64, two words), generation and
priority (float32 bits); an update entry is the global slot ``owner << 40 | slot`` (two words),
the generation and the TD error (float32 bits).
"""

from __future__ import annotations

import torch

from gper.ops import philox
from gper.ops.state import C_STALE, TreeState

_TWO_M32 = 2.0**-32
#: int32 words each routed row carries after the packed row: slot (int64), generation, priority
ROUTE_EXTRA = 4
#: a global slot is ``owner << OWNER_SHIFT | slot``
OWNER_SHIFT = 40


def shard_meta(*, total: torch.Tensor, mintop: torch.Tensor, size: torch.Tensor, maxp: torch.Tensor) -> torch.Tensor:
    """[4] float64: this shard's total priority, size, min priority and max priority, in the
    columns of ``gper.distributed.shards.META_*``.

    Args:
        total: 0-d float64 sum of the stored priorities (computed by the tree itself, so that the
            gathered total is the tree's own, bit for bit).
        mintop: [K] float32 top level of the min tree (its min is the smallest stored priority).
        size: 0-d int64 filled slots; maxp: 0-d float32 running max priority.
    """
    return torch.stack([total, size.double(), mintop.amin().double(), maxp.double()])


def shared_uniforms(key: int, counter: torch.Tensor, n: int) -> torch.Tensor:
    """[n] float64 uniforms in ``[0, 1 - 2**-32]`` (32 random bits each, as one level of the
    descent) from Philox counters ``counter .. counter + n - 1`` (``counter``: [1] int64)."""
    offs = counter + torch.arange(n, dtype=torch.int64, device=counter.device)
    return philox.randint4x(key, offs)[0].double() * _TWO_M32


def thresholds(cum: torch.Tensor, u: torch.Tensor, stratified: bool) -> torch.Tensor:
    """[n] float64 thresholds in ``[0, S)``: ``u S`` (independent) or ``(s + u) * (1 / n) * S`` (stratified).

    The stratum's scale is a product by ``1 / n`` (rounded once, in float64), not a division:
    torch divides by a host number that way on CUDA and exactly on the CPU, a product is the
    same on every device."""
    total = cum[-1]
    if not stratified:
        return u * total
    n = u.numel()
    return (torch.arange(n, dtype=torch.float64, device=u.device) + u) * (1.0 / n) * total


def owners(cum: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[n] int64: the shard whose interval ``[C_k, C_{k+1})`` holds each threshold ``t`` [n] float64,
    capped at W - 1; a shard of mass 0 has an empty interval and is never picked."""
    return (cum[None, :] <= t[:, None]).sum(1).clamp_max(cum.numel() - 1)


def local_fractions(
    cum: torch.Tensor, mass: torch.Tensor, t: torch.Tensor, owner: torch.Tensor, rank: int
) -> torch.Tensor:
    """[n] float64: where each threshold shard ``rank`` owns lies in it, as a fraction of its mass
    in ``[0, 1)`` (0 for draws of other shards, whose descents are discarded)."""
    below = cum[rank] - mass[rank]  # C_rank
    f = (t - below) / mass[rank]
    return torch.where(owner == rank, f, 0.0).clamp(0.0, 1.0 - 2.0**-52)


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
    """The ``n`` draws every rank shares; ``counter`` then moves on by ``n``, on the device.

    Args:
        cum: [W] float64 cumulative masses (``mass.cumsum(0)``).
        mass: [W] float64 masses (any stride; read for the fractions only).
        counter: [1] int64 Philox counter of the shared draws.
        ticket: [1] int64 scratch, 0 between calls (the Triton kernel's; unused here).
        key: Philox key in ``[0, 2**63)``.
        n: draws, >= 1.
        stratified: ``(s + u) / n`` thresholds, and this rank's fractions.
        rank: the shard whose fractions are returned.

    Returns:
        ``(t, owner, fractions)``: [n] float64 thresholds, [n] int64 owners, and (stratified only,
        else None) [n] float64 :func:`local_fractions` of shard ``rank``.
    """
    u = shared_uniforms(key, counter, n)
    counter += n
    t = thresholds(cum, u, stratified)
    owner = owners(cum, t)
    fractions = local_fractions(cum, mass, t, owner, rank) if stratified else None
    return t, owner, fractions


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
    """The words this rank sends in exact mode's reduce-scatter: its own draws, zero elsewhere.

    Draw ``j * W + k`` goes to rank ``k`` as its row ``j`` (each rank's rows span every stratum),
    so the words are laid out ``[W, b]``: the sum over ranks is each draw's owner's words, bit for bit.

    Args:
        rows: [n, words] int32 drawn rows; indices: [n] int64 slots; generations: [n] int32.
        leaves: [capacity] float32 stored priorities of this shard.
        owner: [n] int64 owners (:func:`shared_draws`); rank: this shard; world: W (n = W b).

    Returns:
        [W, b, words + ROUTE_EXTRA] int32, contiguous.
    """
    n, words = rows.shape
    packed = torch.cat(
        [
            rows,
            indices.view(torch.int32).view(n, 2),
            generations.view(n, 1),
            leaves[indices].view(torch.int32).view(n, 1),
        ],
        1,
    )
    packed = torch.where((owner == rank)[:, None], packed, 0)
    return packed.view(n // world, world, words + ROUTE_EXTRA).transpose(0, 1).contiguous()


def unpack_rows(
    *, recv: torch.Tensor, owner: torch.Tensor, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's routed draws, from the words it received.

    Args:
        recv: [b, words + ROUTE_EXTRA] int32; owner: [W b] int64 owners; rank: this rank; world: W.

    Returns:
        ``(rows, indices, generations, priorities, owners)``: [b, words] int32, [b] int64, [b]
        int32, [b] float32, [b] int64 (the shard of each row: ``owner[j * W + rank]``), contiguous.
    """
    b, words = recv.shape[0], recv.shape[1] - ROUTE_EXTRA
    rows = recv[:, :words].contiguous()
    indices = recv[:, words : words + 2].contiguous().view(torch.int64).view(b)
    gens = recv[:, words + 2].contiguous()
    p = recv[:, words + 3].contiguous().view(torch.float32)
    return rows, indices, gens, p, owner.view(b, world)[:, rank].contiguous()


def pack_updates(
    *, owners: torch.Tensor, indices: torch.Tensor, generations: torch.Tensor, td: torch.Tensor, stale: bool
) -> torch.Tensor:
    """The words this rank sends in exact mode's update all-gather.

    Args:
        owners, indices: [b] int64 each row's shard and slot there; generations: [b] int32.
        td: [b] float32 TD errors; stale: the batch is from before a restore (its slots are sent as -1).

    Returns:
        [b, 4] int32: global slot (two words, -1 if stale), generation, TD error bits.
    """
    g = owners * 2**OWNER_SHIFT + indices if not stale else torch.full_like(indices, -1)
    return torch.cat([g.view(torch.int32).view(-1, 2), generations.view(-1, 1), td.view(torch.int32)[:, None]], 1)


def unpack_updates(
    *, state: TreeState, every: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The update entries of the whole group, for this rank's shard: entries of other shards (or
    stale ones, slot -1) go to slot 0 with a generation that cannot match, so the update drops
    them as stale; they are not counted there (the state's stale count is lowered by their number).

    Args:
        state: this shard's tree (its generations are read, its stale count lowered).
        every: [n, 4] int32 every rank's :func:`pack_updates`, rank-major.
        rank: this shard.

    Returns:
        ``(slot, expected_gen, td)``: [n] int64, [n] int32, [n] float32.
    """
    g = every[:, :2].contiguous().view(torch.int64).view(-1)
    owned = (g >> OWNER_SHIFT) == rank
    slot = torch.where(owned, g & ((1 << OWNER_SHIFT) - 1), 0)
    expected = torch.where(owned, every[:, 2], ~state.gen[slot])
    td = torch.where(owned, every[:, 3].contiguous().view(torch.float32), 0.0)
    state.counters[C_STALE] -= (~owned).sum()
    return slot, expected, td


def local_priorities(
    *,
    cum: torch.Tensor,
    mass: torch.Tensor,
    leaves: torch.Tensor,
    indices: torch.Tensor,
    rank: int,
    uniform: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Local mode's shard ratio and the priorities its IS weights are computed from.

    Args:
        cum: [W] float64 cumulative masses; mass: [W] float64 masses (any stride).
        leaves: [capacity] float32 stored priorities; indices: [b] int64 slots this rank drew.
        rank: this shard; uniform: uniform sampling (the priorities are returned as stored).

    Returns:
        ``(ratio, p, owners)``: 0-d float32 ``W m_rank / S``; [b] float32 priorities of the draws
        (1 where the ratio is 0: an empty shard draws slot 0 of priority 0); [b] int64 ``rank``.
    """
    ratio = (cum.numel() * mass[rank] / cum[-1]).float()
    p = leaves[indices]
    if not uniform:
        p = torch.where(ratio > 0, p, 1.0)
    return ratio, p, torch.full(indices.shape, rank, dtype=torch.int64, device=indices.device)


def local_weights(*, ratio: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[b] float32 final weights ``ratio * weights`` (0 where the ratio is 0: an empty shard's draws).

    Args:
        ratio: 0-d float32 (:func:`local_priorities`); weights: [b] float32 IS weights of the draws.
    """
    return torch.where(ratio > 0, ratio * weights, 0.0)
