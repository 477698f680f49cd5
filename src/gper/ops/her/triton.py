"""Hindsight relabelling's index kernels in Triton, with the signatures and semantics of
:mod:`gper.ops.her.reference` (documented there): one launch each, where the torch reference
takes some twenty operations (``episode_index_add``, in every ``add``) and over a hundred
(``her_pick``: Philox alone is ten rounds of a dozen operations), each a kernel of its own.

* ``_episode_index_add``: one lane per stream: its one or two new rows' ids and its records;
  lanes touch only their own stream's slots and records, so nothing races.
* ``_her_pick``: one lane per draw: the start's episode bounds, ``tl.randint4x`` (bit for bit
  :func:`gper.ops.philox.randint4x`), the goal row and whether the draw is relabelled.
* ``_her_finish``: one lane per draw: the new goal's return, flags, discount and next row, and
  the goal written into both rows (whole words: a goal field that shares a word with another is
  left to the torch reference). Compiled without floating-point contraction, so the return rounds
  as the reference's does.
"""

from __future__ import annotations

import torch

from gper._triton import tl, triton
from gper.ops.her import reference as her_reference
from gper.ops.triton_lanes import lanes

_BLOCK = 256


@triton.jit
def _episode_index_add(before, streams, ids, current, records, E, T, R, BLOCK: tl.constexpr):
    e, m = lanes(E, BLOCK)
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
    s, m = lanes(B, BLOCK)
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


@triton.jit
def _her_finish(
    rows,
    idx,
    flag,
    goal,
    reward,
    hit,
    gamma,
    out_rows,
    out_next,
    out_discount,
    B,
    T,
    W: tl.constexpr,
    WP: tl.constexpr,
    N: tl.constexpr,
    RC: tl.constexpr,
    FC: tl.constexpr,
    GD: tl.constexpr,
    GW: tl.constexpr,
    GWP: tl.constexpr,
    HAS_HIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    s, m = lanes(B, BLOCK)
    rel = m & (tl.load(flag + s, mask=m, other=0) != 0)
    i = tl.load(idx + s, mask=m, other=0)
    pos = i % T
    base = i - pos
    g = tl.load(gamma)
    g = tl.where(g != g, 1.0, tl.minimum(tl.maximum(g, 0.0), 1.0))
    ret = tl.load(reward + s * N, mask=m, other=0.0)
    power = tl.zeros([BLOCK], tl.float32) + g
    last_f = tl.load(rows + i * W + FC, mask=m, other=0)
    ended = (last_f & 0x101) != 0  # TERMINATED | TRUNCATED
    if HAS_HIT:
        last_h = tl.load(hit + s * N, mask=m, other=0) != 0
        ended = ended | last_h
    alive = ~ended
    steps = tl.full([BLOCK], 1, tl.int64)
    for j in tl.static_range(1, N):
        r = tl.load(reward + s * N + j, mask=m, other=0.0)
        ret = tl.where(alive, ret + power * r, ret)  # compiled without contraction: the reference's rounding
        power = tl.where(alive, power * g, power)
        f = tl.load(rows + (base + (pos + j) % T) * W + FC, mask=m, other=0)
        last_f = tl.where(alive, f, last_f)
        ended = (f & 0x101) != 0
        if HAS_HIT:
            h = tl.load(hit + s * N + j, mask=m, other=0) != 0
            last_h = tl.where(alive, h, last_h)
            ended = ended | h
        steps += alive.to(tl.int64)
        alive = alive & ~ended
    tl.store(out_rows + s * W + RC, ret.to(tl.int32, bitcast=True), mask=rel)
    gc = tl.arange(0, GWP)
    gm = rel[:, None] & (gc < GW)[None, :]
    new = tl.load(goal + s[:, None] * GW + gc[None, :], mask=gm, other=0)
    tl.store(out_rows + s[:, None] * W + GD + gc[None, :], new, mask=gm)
    if HAS_HIT:
        # the new goal decides termination; a stored end it does not confirm is a truncation
        truncated = ((last_f & 0x100) != 0) | (((last_f & 0x1) != 0) & ~last_h)
        word = tl.where(last_h, 0x1, 0) | tl.where(truncated, 0x100, 0)
        tl.store(out_rows + s * W + FC, word.to(tl.int32), mask=rel)
        tl.store(out_discount + s, tl.where(last_h, 0.0, power), mask=rel)
    if HAS_HIT and N > 1:
        # the next row moves to the one the return stopped at, with the new goal in it (one store
        # per word: a lane's two stores to one address could land in either order)
        cols = tl.arange(0, WP)
        cm = rel[:, None] & (cols < W)[None, :]
        src = base + (pos + steps) % T
        row = tl.load(rows + src[:, None] * W + cols[None, :], mask=cm, other=0)
        in_goal = (cols >= GD) & (cols < GD + GW)
        gm2 = cm & in_goal[None, :]
        word2 = tl.load(goal + s[:, None] * GW + (cols - GD)[None, :], mask=gm2, other=0)
        tl.store(out_next + s[:, None] * W + cols[None, :], tl.where(in_goal[None, :], word2, row), mask=cm)
    else:
        tl.store(out_next + s[:, None] * W + GD + gc[None, :], new, mask=gm)


def her_finish(
    *,
    rows: torch.Tensor,
    idx: torch.Tensor,
    flag: torch.Tensor,
    goal: torch.Tensor,
    reward: torch.Tensor,
    hit: torch.Tensor | None,
    gamma: torch.Tensor,
    rows_per_env: int,
    reward_col: int,
    flags_col: int,
    desired_offset: int,
    out_rows: torch.Tensor,
    out_next: torch.Tensor,
    out_discount: torch.Tensor,
) -> None:
    b, n = reward.shape
    nbytes = goal.shape[1]
    if desired_offset % 4 or nbytes % 4:  # a goal that shares a word with another field: bytes, in torch
        her_reference.her_finish(
            rows=rows,
            idx=idx,
            flag=flag,
            goal=goal,
            reward=reward,
            hit=hit,
            gamma=gamma,
            rows_per_env=rows_per_env,
            reward_col=reward_col,
            flags_col=flags_col,
            desired_offset=desired_offset,
            out_rows=out_rows,
            out_next=out_next,
            out_discount=out_discount,
        )
        return
    w = rows.shape[1]
    _her_finish[(triton.cdiv(b, _BLOCK),)](
        rows,
        idx,
        flag.view(torch.uint8),
        goal.contiguous().view(torch.int32),
        reward,
        hit.view(torch.uint8) if hit is not None else reward,
        gamma,
        out_rows,
        out_next,
        out_discount,
        b,
        rows_per_env,
        W=w,
        WP=triton.next_power_of_2(w),
        N=n,
        RC=reward_col,
        FC=flags_col,
        GD=desired_offset // 4,
        GW=nbytes // 4,
        GWP=triton.next_power_of_2(nbytes // 4),
        HAS_HIT=hit is not None,
        BLOCK=_BLOCK,
        enable_fp_fusion=False,
    )
