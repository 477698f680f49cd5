"""The math of sharded sampling, as plain tensor functions every rank runs on the same inputs.

Notation (``docs/distributed.md``, *The math*): W ranks; shard k holds ``n_k`` filled slots of
priorities ``p_{k,j}`` with total ``T_k``; ``S = sum_k T_k``, ``C_k = sum_{j<k} T_j``.

* **exact**: draw s picks its owner with a uniform ``u_s`` every rank draws alike (Philox on a
  counter every rank advances by the same amount), ``k(s) = #{k : C_{k+1} <= u_s S}`` capped at
  W - 1, i.e. ``P(k) = T_k / S``: the rule of one level of gper's descent (``gper.ops.reference``),
  with the shards as the children of a root. The owner's own descent then gives
  ``P(j | k) = p_{k,j} / T_k``, so ``P(k, j) = p_{k,j} / S``. Stratified draws carry the threshold
  ``t_s = (s + u_s) / B * S`` into the owner's tree as ``(t_s - C_k) / T_k``.
* **local**: rank k draws from its own shard, ``q_{k,j} = p_{k,j} / (W T_k)`` per draw of the
  global batch; the ratio ``r_k = P / q = W T_k / S`` makes ``E_q[r w f] = E_P[w f]``.

Uniform sampling is the same with every priority 1: masses ``n_k`` instead of ``T_k``.

Every sum here is a float64 ``cumsum`` over the W gathered values in rank order, on tensors that
are bit-identical on every rank, so every rank computes the same owners.
"""

from __future__ import annotations

import torch

from gper.ops import philox

#: the per-rank values all-gathered before every draw, by column of the ``[W, 4]`` float64 meta
META_TOTAL, META_SIZE, META_MIN, META_MAX = range(4)
_MASK64 = 0xFFFFFFFFFFFFFFFF
_TWO_M32 = 2.0**-32


def derive_key(seed: int, stream: int) -> int:
    """A Philox key in ``[0, 2**63)`` for ``stream`` of ``seed`` (SplitMix64 of both): stream 0 is
    the draws every rank shares, stream ``1 + rank`` the descent of that rank's shard."""
    z = (seed * 0x9E3779B97F4A7C15 + (stream + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & (_MASK64 >> 1)


def shared_uniforms(key: int, counter: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` float64 uniforms in ``[0, 1 - 2**-32]`` (32 random bits each, as one level of the
    descent) from Philox counters ``counter .. counter + n - 1``; ``counter`` ([1] int64 on the
    device) then moves on by ``n``, on the device (no host sync)."""
    offs = counter + torch.arange(n, dtype=torch.int64, device=counter.device)
    word = philox.randint4x(key, offs)[0]
    counter += n
    return word.double() * _TWO_M32


def masses(meta: torch.Tensor, uniform: bool) -> torch.Tensor:
    """[W] float64: each shard's mass, its total priority (or its size in uniform mode)."""
    return meta[:, META_SIZE] if uniform else meta[:, META_TOTAL]


def owners(mass: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B] int64: the shard whose cumulative mass interval ``[C_k, C_{k+1})`` holds each threshold
    ``t`` [B] float64 (in ``[0, S)``); a shard of mass 0 is never picked."""
    cs = mass.cumsum(0)
    return (cs[None, :] <= t[:, None]).sum(1).clamp_max(mass.numel() - 1)


def thresholds(mass: torch.Tensor, u: torch.Tensor, stratified: bool) -> torch.Tensor:
    """[B] float64 thresholds in ``[0, S)``: ``u S`` (independent) or ``(s + u) / B * S`` (stratified)."""
    total = mass.cumsum(0)[-1]
    if not stratified:
        return u * total
    b = u.numel()
    return (torch.arange(b, dtype=torch.float64, device=u.device) + u) / b * total


def local_fractions(mass: torch.Tensor, t: torch.Tensor, owner: torch.Tensor, rank: int) -> torch.Tensor:
    """[B] float64: where each threshold this rank owns lies in its shard, as a fraction of ``T_rank``
    in [0, 1) (0 for draws of other shards, whose descents are discarded)."""
    below = mass.cumsum(0) - mass  # C_k
    f = (t - below[rank]) / mass[rank]
    return torch.where(owner == rank, f, 0.0).clamp(0.0, 1.0 - 2.0**-52)


def ratios(mass: torch.Tensor) -> torch.Tensor:
    """[W] float64 local mode's shard ratios ``r_k = W m_k / sum m`` (1 for equal shards)."""
    return mass.numel() * mass / mass.cumsum(0)[-1]
