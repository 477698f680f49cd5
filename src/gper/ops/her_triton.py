"""Hindsight relabelling's index kernels in Triton, with the signatures and semantics of
:mod:`gper.ops.her_reference` (documented there): one launch each, where the torch reference
takes some twenty operations (``episode_index_add``, in every ``add``) and over a hundred
(``her_pick``: Philox alone is ten rounds of a dozen operations), each a kernel of its own.

* ``_episode_index_add``: one lane per stream: its one or two new rows' ids and its records;
  lanes touch only their own stream's slots and records, so nothing races.
* ``_her_pick``: one lane per draw: the start's episode bounds, ``tl.randint4x`` (bit for bit
  :func:`gper.ops.philox.randint4x`), the goal row and whether the draw is relabelled.
"""

from __future__ import annotations

import torch

from gper._triton import tl, triton
from gper.ops.her_reference import EPISODE, FINAL, FUTURE, her_words  # noqa: F401 (her_words: the reference's)

_BLOCK = 256


@triton.jit
def _episode_index_add(before, streams, ids, current, records, E, T, R, BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = e < E
    k = tl.load(before + 2 * e, mask=m, other=0)
    ep = tl.load(before + 2 * e + 1, mask=m, other=0)
    count = tl.load(streams + 2 * e, mask=m, other=1)
    ep_after = tl.load(streams + 2 * e + 1, mask=m, other=0)
    n_rows = count - k
    real = (ep_after != ep) & (ep < k)
    cur = tl.load(current + e, mask=m, other=0)
    nxt = cur + real.to(tl.int64)
    nxt = tl.where(nxt == R, 0, nxt)
    tl.store(ids + e * T + k % T, cur.to(tl.int32), mask=m)
    tl.store(ids + e * T + (k + n_rows - 1) % T, tl.where(n_rows == 2, nxt, cur).to(tl.int32), mask=m)
    tl.store(records + (e * R + cur) * 2 + 1, k, mask=m & real)
    tl.store(records + (e * R + nxt) * 2, ep_after, mask=m)
    tl.store(records + (e * R + nxt) * 2 + 1, tl.full([BLOCK], -1, tl.int64), mask=m)
    tl.store(current + e, nxt, mask=m)


def episode_index_add(
    *,
    before: torch.Tensor,
    streams: torch.Tensor,
    ids: torch.Tensor,
    current: torch.Tensor,
    records: torch.Tensor,
    rows_per_env: int,
) -> None:
    e = streams.shape[0]
    _episode_index_add[(triton.cdiv(e, _BLOCK),)](
        before, streams, ids, current, records, e, rows_per_env, records.shape[1], BLOCK=_BLOCK
    )


@triton.jit
def _her_pick(
    idx,
    streams,
    ids,
    records,
    counter,
    out_goal,
    out_flag,
    B,
    seed,
    T,
    R,
    threshold,
    STRATEGY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = s < B
    i = tl.load(idx + s, mask=m, other=0)
    e = i // T
    base = e * T
    count = tl.load(streams + 2 * e, mask=m, other=1)
    row = count - 1 - (count - 1 - (i - base)) % T  # a drawn slot was written: count - 1 >= its position
    at = (e * R + tl.load(ids + i, mask=m, other=0).to(tl.int64)) * 2
    first = tl.maximum(tl.load(records + at, mask=m, other=0), count - T)
    end = tl.load(records + at + 1, mask=m, other=0)
    last = tl.where(end >= 0, end, count - 1)
    c0, c1, _, _ = tl.randint4x(seed, tl.load(counter) + s)
    if STRATEGY == 0:  # FUTURE
        lo = row + 1
    elif STRATEGY == 1:  # FINAL
        lo = last
    else:  # EPISODE
        lo = first
    span = last - lo + 1
    pick = lo + ((c1.to(tl.int64) * tl.maximum(span, 1)) >> 32)
    tl.store(out_goal + s, base + pick % T, mask=m)
    tl.store(out_flag + s, ((c0.to(tl.int64) < threshold) & (span >= 1)).to(tl.uint8), mask=m)


def her_pick(
    *,
    idx: torch.Tensor,
    streams: torch.Tensor,
    ids: torch.Tensor,
    records: torch.Tensor,
    counter: torch.Tensor,
    seed: int,
    strategy: int,
    threshold: int,
    rows_per_env: int,
    out_goal: torch.Tensor,
    out_flag: torch.Tensor,
) -> None:
    b = idx.numel()
    _her_pick[(triton.cdiv(b, _BLOCK),)](
        idx,
        streams,
        ids,
        records,
        counter,
        out_goal,
        out_flag.view(torch.uint8),
        b,
        seed,
        rows_per_env,
        records.shape[1],
        threshold,
        STRATEGY=strategy,
        BLOCK=_BLOCK,
    )
