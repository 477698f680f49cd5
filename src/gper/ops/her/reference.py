"""Hindsight relabelling's index kernels in vectorized PyTorch: the reference and the torch back end.

:mod:`gper.ops.her.triton` has the same functions in Triton (one launch each), bit for bit.
Both work on a trajectory buffer's *episode index* (:mod:`gper.replay.episodes` says why it is
exact):

* ``ids``: [E * T] int32: per slot, the id (mod ``R``) of its row's episode;
* ``current``: [E] int64: per stream, the id of the episode in progress;
* ``records``: [E, R, 2] int64: per stream and id, the episode's first row and its end row
  (-1 while it is in progress).

Row ``k`` of stream ``e`` sits in slot ``e * T + k % T``; ``streams`` [E, 2] int64 holds each
stream's rows written and the first row of its episode in progress (as in
:mod:`gper.ops.trajectory.reference`). Nothing here reads a device value on the host.
"""

from __future__ import annotations

import torch

from gper.ops import philox
from gper.ops.trajectory.reference import TERMINATED, TRUNCATED

#: ``her_pick``'s strategies: a row after the start up to the episode's last, the last, any of the episode's
FUTURE, FINAL, EPISODE = 0, 1, 2
STRATEGY = {"future": FUTURE, "final": FINAL, "episode": EPISODE}


def episode_index_add(
    *,
    before: torch.Tensor,
    streams: torch.Tensor,
    ids: torch.Tensor,
    current: torch.Tensor,
    records: torch.Tensor,
    rows_per_env: int,
) -> None:
    """Index the rows one ``stream_add`` wrote, from the stream counts before it and after.

    An add writes one or two rows a stream: a step; an end row alone (a next-step reset step);
    or an end row, then the first step of the next episode. An end row was written exactly where
    the episode start moved. The end row's episode keeps its id unless it had no step (an
    unflagged reset right after a reset step): then the next episode takes that id over.

    Args:
        before: [E, 2] int64, a copy of ``streams`` before the add.
        streams: [E, 2] int64 after it.
        ids, current, records: the index (updated in place).
        rows_per_env: T.
    """
    t, r = rows_per_env, records.shape[1]
    e = torch.arange(streams.shape[0], device=streams.device, dtype=torch.int64)
    k, ep = before[:, 0], before[:, 1]
    n_rows = streams[:, 0] - k
    real = (streams[:, 1] != ep) & (ep < k)
    cur = current.clone()
    nxt = torch.remainder(cur + real.long(), r)
    s1 = e * t + torch.remainder(k, t)
    s2 = e * t + torch.remainder(k + n_rows - 1, t)
    # the first row (a step, or the end row) is the current episode's, a second one (the step
    # after an end row) the next episode's; with one row both entries are the same slot and value
    second = torch.where(n_rows == 2, nxt, cur)
    ids.index_copy_(0, torch.cat((s1, s2)), torch.cat((cur, second)).to(torch.int32))
    flat = records.view(-1, 2)
    at_cur, at_nxt = e * r + cur, e * r + nxt
    flat[at_cur, 1] = torch.where(real, k, flat[at_cur, 1])
    # the episode in progress after the add: its first row (unchanged while it runs), no end yet
    flat[at_nxt, 0] = streams[:, 1]
    # index_fill_ takes the -1 as a kernel argument: an indexed assignment of a Python number
    # copies it from the host, which a CUDA graph capture refuses
    flat.select(1, 1).index_fill_(0, at_nxt, -1)
    current.copy_(nxt)


def her_words(seed: int, counter: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two Philox words (int64 in [0, 2^32)) for each of ``b`` draws: lanes 0 and 1 of block
    ``counter + s`` for draw ``s`` (as ``tl.randint4x``)."""
    offs = counter + torch.arange(b, device=counter.device, dtype=torch.int64)
    if offs.device.type == "cpu":  # NumPy's small-array operators cost a third of torch's here
        c0, c1, _, _ = philox.randint4x(seed, offs.numpy())
        return torch.from_numpy(c0), torch.from_numpy(c1)
    c0, c1, _, _ = philox.randint4x(seed, offs)
    return c0, c1


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
    """Pick a goal row for each drawn start: where its goal comes from if relabelled, and whether it is.

    For the start at slot ``idx[s]`` (row ``k``), with ``first`` its episode's first row still
    stored and ``last`` its end row (the newest row while the episode is in progress), the goal
    row is uniform over ``k + 1 .. last`` (FUTURE), ``last`` (FINAL) or ``first .. last``
    (EPISODE), from Philox word 1 of block ``counter + s`` by multiply-shift (``lo + (w * span) >> 32``:
    uniform to within ``span / 2^32``); the draw is relabelled when word 0 is below
    ``threshold`` (probability ``threshold / 2^32``) and the range is not empty.

    Args:
        idx: [B] int64 drawn start slots (drawable starts).
        streams: [E, 2] int64 stream counts.
        ids, records: the episode index.
        counter: [1] int64 the relabelling's Philox counter (read, not advanced).
        seed: the Philox key.
        strategy: FUTURE, FINAL or EPISODE.
        threshold: in [0, 2^32].
        rows_per_env: T.
        out_goal: [B] int64 out: the goal row's slot.
        out_flag: [B] bool out: relabel this draw.
    """
    t, r = rows_per_env, records.shape[1]
    e = torch.div(idx, t, rounding_mode="floor")
    pos = idx - e * t
    count = streams[e, 0]
    row = count - 1 - torch.remainder(count - 1 - pos, t)
    rec = records.view(-1, 2)[e * r + ids[idx].long()]
    first = torch.maximum(rec[:, 0], count - t)  # rows before the ring's oldest were overwritten
    last = torch.where(rec[:, 1] >= 0, rec[:, 1], count - 1)
    c0, c1 = her_words(seed, counter, idx.numel())
    lo = {FUTURE: row + 1, FINAL: last, EPISODE: first}[strategy]
    span = last - lo + 1
    pick = lo + torch.bitwise_right_shift(c1.to(idx.device) * span.clamp_min(1), 32)
    out_goal.copy_(e * t + torch.remainder(pick, t))
    out_flag.copy_((c0.to(idx.device) < threshold) & (span >= 1))


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
    """Make the relabelled draws (``flag``) of a sample the transitions of their new goals, in place.

    For the start at slot ``idx[s]`` (row ``k``): the return ``r_0 + g r_1 + ... + g^(m-1) r_(m-1)``
    of the new goal's rewards ``reward[s]`` (float32, in that order, ``g^i`` by repeated products,
    as :func:`gper.ops.trajectory.reference.complete_transitions` sums the stored ones) over its
    ``m`` steps: up to ``n``, stopping after a step whose stored flags end the episode, or (with
    ``hit``) after the first step that reaches the new goal. With ``hit``, the flags are the new
    goal's: terminated where the last step reaches it (discount 0), truncated where the episode
    ended there otherwise (a stored termination it does not confirm included), the discount
    ``g^m`` else, and the next row the one ``m`` steps on. The new goal is written as the desired
    goal of the start row and of the next row. Draws not relabelled are left as they are.

    Args:
        rows: [E * T, W] int32 storage.
        idx: [B] int64 drawn start slots.
        flag: [B] bool: the draws to relabel.
        goal: [B, nbytes] uint8: each draw's new goal, as the desired goal field's bytes.
        reward: [B, n] float32: step ``k + i``'s reward for the new goal.
        hit: [B, n] bool: step ``k + i`` reaches the new goal; or None (keep the stored flags).
        gamma: 0-d float32 device tensor (clamped to [0, 1], NaN read as 1).
        reward_col, flags_col: the reward's and the flags word's columns.
        desired_offset: the desired goal field's byte offset in a row.
        out_rows, out_next: [B, W] int32 the drawn rows and the rows ``m`` steps on (patched).
        out_discount: [B] float32 (patched where ``hit`` is given).
    """
    t = rows_per_env
    b, n = reward.shape
    pos = torch.remainder(idx, t)
    base = idx - pos
    off = torch.arange(n, device=idx.device, dtype=torch.int64)
    flags = rows[base[:, None] + torch.remainder(pos[:, None] + off[None, :], t), flags_col]  # [B, n] stored
    ended = (flags & (TERMINATED | TRUNCATED)) != 0
    if hit is not None:
        ended = ended | hit
    g = torch.where(torch.isnan(gamma), 1.0, gamma.clamp(0.0, 1.0)).float()
    ret, power = reward[:, 0].clone(), g.expand(b).clone()
    last_flags = flags[:, 0]
    last_hit = hit[:, 0] if hit is not None else None
    alive = ~ended[:, 0]
    m = torch.ones_like(idx)
    for i in range(1, n):
        ret = torch.where(alive, ret + power * reward[:, i], ret)
        power = torch.where(alive, power * g, power)
        last_flags = torch.where(alive, flags[:, i], last_flags)
        if hit is not None:
            last_hit = torch.where(alive, hit[:, i], last_hit)
        m = m + alive.long()
        alive = alive & ~ended[:, i]
    out_rows[:, reward_col] = torch.where(flag, ret.view(torch.int32), out_rows[:, reward_col])
    if hit is not None:
        # the new goal decides termination; a stored end it does not confirm is a truncation
        stored_term = (last_flags & TERMINATED) != 0
        truncated = ((last_flags & TRUNCATED) != 0) | (stored_term & ~last_hit)
        word = torch.where(last_hit, TERMINATED, 0) | torch.where(truncated, TRUNCATED, 0)
        out_rows[:, flags_col] = torch.where(flag, word.to(torch.int32), out_rows[:, flags_col])
        out_discount.copy_(torch.where(flag, torch.where(last_hit, 0.0, power), out_discount))
        if n > 1:  # the return may stop sooner than the stored one: its next row moves
            out_next.copy_(torch.where(flag[:, None], rows[base + torch.remainder(pos + m, t)], out_next))
    # the goal of the transition: of its observation and of the next one
    lo, hi = desired_offset, desired_offset + goal.shape[1]
    for out in (out_rows, out_next):
        view = out.view(torch.uint8)[:, lo:hi]
        view.copy_(torch.where(flag[:, None], goal, view))
