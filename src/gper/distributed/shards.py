"""The math of sharded sampling, as plain tensor functions every rank runs on the same inputs.

Notation (``docs/distributed.md``, *The math*): W ranks; shard k holds ``n_k`` filled slots of
priorities ``p_{k,j}`` with total ``T_k``; ``S = sum_k T_k``, ``C_k = sum_{j<k} T_j``.

* **exact**: draw s picks its owner with a uniform ``u_s`` every rank draws alike (Philox on a
  counter every rank advances by the same amount), ``k(s) = #{k : C_{k+1} <= u_s S}`` capped at
  W - 1, i.e. ``P(k) = T_k / S``: the rule of one level of gper's descent (``gper.ops.tree.reference``),
  with the shards as the children of a root. The owner's own descent then gives
  ``P(j | k) = p_{k,j} / T_k``, so ``P(k, j) = p_{k,j} / S``. Stratified draws carry the threshold
  ``t_s = (s + u_s) / B * S`` into the owner's tree as ``(t_s - C_k) / T_k``.
* **local**: rank k draws from its own shard, ``q_{k,j} = p_{k,j} / (W T_k)`` per draw of the
  global batch; the ratio ``r_k = P / q = W T_k / S`` makes ``E_q[r w f] = E_P[w f]``.

Uniform sampling is the same with every priority 1: masses ``n_k`` instead of ``T_k``.

Every sum here is a float64 ``cumsum`` over the W gathered values in rank order, on tensors that
are bit-identical on every rank, so every rank computes the same owners. The draws themselves
(uniforms, thresholds, owners, fractions) are kernels of :mod:`gper.ops.shard.reference` (and
:mod:`gper.ops.shard.triton`, bit for bit the same, where the shard runs Triton); this module holds
the keys and the masses.
"""

from __future__ import annotations

import torch

#: the per-rank values all-gathered before every draw, by column of the ``[W, 4]`` float64 meta
META_TOTAL, META_SIZE, META_MIN, META_MAX = range(4)
_MASK64 = 0xFFFFFFFFFFFFFFFF


def derive_key(seed: int, stream: int) -> int:
    """A Philox key in ``[0, 2**63)`` for ``stream`` of ``seed`` (SplitMix64 of both): stream 0 is
    the draws every rank shares, stream ``1 + rank`` the descent of that rank's shard."""
    z = (seed * 0x9E3779B97F4A7C15 + (stream + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & (_MASK64 >> 1)


def masses(meta: torch.Tensor, uniform: bool) -> torch.Tensor:
    """[W] float64: each shard's mass, its total priority (or its size in uniform mode)."""
    return meta[:, META_SIZE] if uniform else meta[:, META_TOTAL]
