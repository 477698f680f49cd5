"""Hindsight relabelling's index kernels in vectorized PyTorch: the reference and the torch back end.

:mod:`gper.ops.her_triton` has the same functions in Triton (one launch each), bit for bit.
Both work on a trajectory buffer's *episode index* (:mod:`gper.replay.episodes` says why it is
exact):

* ``ids``: [E * T] int32: per slot, the id (mod ``R``) of its row's episode;
* ``current``: [E] int64: per stream, the id of the episode in progress;
* ``records``: [E, R, 2] int64: per stream and id, the episode's first row and its end row
  (-1 while it is in progress).

Row ``k`` of stream ``e`` sits in slot ``e * T + k % T``; ``streams`` [E, 2] int64 holds each
stream's rows written and the first row of its episode in progress (as in
:mod:`gper.ops.trajectory_reference`). Nothing here reads a device value on the host.
"""

from __future__ import annotations

import torch

from gper.ops import philox

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
    flat[at_nxt, 1] = -1
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
