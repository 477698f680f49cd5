"""Vectorized PyTorch kernels of the trajectory buffer: the reference and the CPU back end.

Each function here that has a Triton twin (:mod:`gper.ops.trajectory.triton`) has the same
signature and semantics; tests check one against the other, and this one against a plain-Python
oracle. Nothing here reads a device value on the host, so on CUDA nothing synchronises.

The storage is ``num_envs`` streams of ``T`` rows (slot ``e * T + k % T`` holds row ``k`` of
stream ``e``); each row is packed int32 words with one *flags* word at column ``flags_col``:
byte 0 terminated, byte 1 truncated, byte 2 the kind (1 = an end row: its observation is the
final one of the episode before it). ``docs/trajectory.md`` has the rules these functions follow.

Tensors shared with the flat buffer's kernels (:mod:`gper.ops.tree.reference`): ``tree``,
``mintree`` (one trash cell at the end), ``gen``, ``scalars``. Trajectory state:

* ``streams``: [E, 2] int64: rows ever written to each stream, and the first row of the episode
  in progress (``S_COUNT``, ``S_EP_START``);
* ``pending``: [E, W] int32: the ``next_obs`` of each stream's last step, packed as a row;
* ``tcounters``: int64 counters (``T_DISCONTINUITIES``, ``T_STEPS``);
* ``keys``: rank mode's sort keys ([capacity + 1], the last entry takes writes landing nowhere), or None.
"""

from __future__ import annotations

import torch

from gper.ops.state import S_MAXP, SampleOut, TreeState
from gper.ops.tree import reference

# columns of ``streams``
S_COUNT = 0  #: rows ever written to the stream
S_EP_START = 1  #: the first row of the episode in progress
# slots of ``tcounters``
T_DISCONTINUITIES = 0  #: steps whose obs differed from the previous step's next_obs without an episode end
T_STEPS = 1  #: add calls
N_TCOUNTERS = 2
# how a step after an episode end is read (``stream_add``'s ``autoreset``)
AUTO, SAME_STEP, NEXT_STEP = 0, 1, 2
AUTORESET = {"auto": AUTO, "same-step": SAME_STEP, "next-step": NEXT_STEP}

#: bits of the flags word
TERMINATED = 0x1
TRUNCATED = 0x100
ENDED = TERMINATED | TRUNCATED  # the step ended its episode (any bit of bytes 0 and 1)
END_ROW = 0x10000  # byte 2: an end row


def rep_count(window: int, arity: int) -> int:
    """Leaves per stream that :func:`stream_add` reports for the tree repair: enough that every
    tree node above a changed leaf lies above one of them (one every ``arity`` rows of the touched
    range, its last row, and both sides of the ring's wrap)."""
    return (window + 1) // arity + 4


def _rows_slots(base: torch.Tensor, k: torch.Tensor, t: int) -> torch.Tensor:
    return base + torch.remainder(k, t)


def stream_add(
    *,
    state: TreeState,
    keys: torch.Tensor | None,
    rows: torch.Tensor,
    staged: torch.Tensor,
    streams: torch.Tensor,
    pending: torch.Tensor,
    tcounters: torch.Tensor,
    obs_mask: torch.Tensor,
    flags_col: int,
    rows_per_env: int,
    window: int,
    value: float | None,
    autoreset: int = AUTO,
) -> None:
    """Append one step of every stream: its rows, their generations, the starts it makes drawable,
    and the repair of the trees above every changed leaf.

    Args:
        rows: [E * T, W] int32 storage.
        staged: [E, 2W] int32: each stream's step packed as a row (flags word: terminated and
            truncated bytes), then its ``next_obs`` packed as a row (obs columns only).
        obs_mask: [W] int32: the bits of each word that belong to an observation field (a field
            of a few bytes may share a word with another).
        flags_col: the flags word's column.
        rows_per_env: T.
        window: rows after a start that must be written before it is drawable (unless its episode ended).
        value: tree value of a start that becomes drawable: None for the max priority.
        autoreset: how a step after an episode end is read: ``AUTO`` (a next-step reset step if its
            observation is the final one bit for bit, else a new episode's first step),
            ``SAME_STEP`` (always a first step) or ``NEXT_STEP`` (always a reset step).
    """
    t, (e_n, w) = rows_per_env, pending.shape
    base = torch.arange(e_n, device=rows.device, dtype=torch.int64) * t
    k, ep = streams[:, 0].clone(), streams[:, 1].clone()  # copies: streams is written below
    step, nxt = staged[:, :w], staged[:, w:]
    slots, reset_step, insert, jump = _write_step(rows, base, k, step, pending, obs_mask, flags_col, t, autoreset)
    ends = reset_step | insert  # an end row was written first
    n_rows = 1 + insert.long()
    state.gen.index_add_(0, slots, torch.cat((torch.ones_like(k), insert.long())).to(state.gen.dtype))
    lo = state.layout.leaf_offset
    state.tree.index_fill_(0, lo + slots, 0.0)  # a fill (not a copy of a host scalar): capturable
    state.mintree.index_fill_(0, lo + slots, float("inf"))
    _enter_starts(state, keys, base, k, ep, ends, t, window, value)
    streams[:, 0] = k + n_rows
    streams[:, 1] = torch.where(ends, k + 1, ep)
    pending.copy_(nxt)
    tcounters[T_DISCONTINUITIES] += jump.sum()
    tcounters[T_STEPS] += 1
    arity = state.layout.arity
    reps = _reps(base, (k - window).clamp_min(0), k + n_rows - 1, t, arity, rep_count(window, arity))
    reference.recompute(state=state, leaves=reps.reshape(-1))


def _write_step(rows, base, k, step, pending, obs_mask, flags_col: int, t: int, autoreset: int):
    """Write each stream's step at row ``k`` (after an end row holding the pending ``next_obs``
    where the step does not go on from it), and mark the step before an unflagged reset truncated.

    Returns:
        (slots, reset_step, insert, jump): the [2E] int64 slots written (each stream's first row,
        then its second, the first again where there is none), and [E] bool: the step is a
        next-step reset step (its row became an end row); an end row was inserted before it (the
        step is at row ``k + 1``); the reset had no episode end (counted as a discontinuity).
    """
    has_prev = k > 0
    prev_slot = _rows_slots(base, (k - 1).clamp_min(0), t)
    prev_flags = rows[prev_slot, flags_col]
    prev_ended = has_prev & ((prev_flags & ENDED) != 0)
    prev_end_row = has_prev & ((prev_flags & END_ROW) != 0)
    same = ~has_prev | (((step ^ pending) & obs_mask) == 0).all(dim=1)
    if autoreset == SAME_STEP:
        reset_step, insert = torch.zeros_like(same), has_prev & (prev_ended | ~same)
    elif autoreset == NEXT_STEP:
        reset_step, insert = prev_ended, has_prev & ~prev_ended & ~same
    else:
        reset_step = prev_ended & same  # next-step autoreset: this step is the reset step
        insert = has_prev & ~same  # an end row holding the pending next_obs comes first
    jump = insert & ~prev_ended  # an unflagged reset: the step before becomes truncated
    # the step before a jump is marked truncated (unless it is an end row itself); written back
    # unchanged elsewhere, before this add's rows (row 0's slot may be among both)
    rows[prev_slot, flags_col] = torch.where(jump & ~prev_end_row, prev_flags | TRUNCATED, prev_flags)
    end_row = pending & obs_mask  # the final observation (a reset step's own obs is the same)
    end_row[:, flags_col] = torch.full_like(prev_flags, END_ROW)
    first = torch.where((reset_step | insert)[:, None], end_row, step)
    s1 = _rows_slots(base, k, t)
    s2 = torch.where(insert, _rows_slots(base, k + 1, t), s1)
    second = torch.where(insert[:, None], step, first)
    slots = torch.cat((s1, s2))
    rows.index_copy_(0, slots, torch.cat((first, second)))
    return slots, reset_step, insert, jump


def _enter_starts(state: TreeState, keys, base, k, ep, ends, t: int, window: int, value: float | None) -> None:
    """The starts this add makes drawable enter the trees at ``value`` (None: the max priority):
    after an end row, every pending one of its episode; after a step, the one ``window`` rows back
    (if it lies in the episode in progress)."""
    tree, mintree, scalars = state.tree, state.mintree, state.scalars
    j = torch.arange(window + 1, device=k.device, dtype=torch.int64)
    first_new = torch.where(ends, torch.maximum(k - window, ep), k - window)
    last_new = torch.where(ends, k - 1, torch.where(k - window >= ep, k - window, k - window - 1))
    cand = first_new[:, None] + j[None, :]
    live = cand <= last_new[:, None]
    cslot = _rows_slots(base[:, None], cand, t)
    target = torch.where(live, state.layout.leaf_offset + cslot, tree.numel() - 1).reshape(-1)
    if value is None:
        tree[target] = scalars[S_MAXP].expand(target.shape)
        mintree[target] = scalars[S_MAXP].expand(target.shape)
    else:
        tree.index_fill_(0, target, value)
        mintree.index_fill_(0, target, value)
    if keys is not None:  # rank mode: a new start's key is the max priority (it enters at rank 1)
        keys[torch.where(live, cslot, keys.numel() - 1).reshape(-1)] = scalars[S_MAXP].expand(target.shape)


def _reps(base: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, t: int, arity: int, n: int) -> torch.Tensor:
    """[E, n] leaves covering rows ``lo .. hi`` of each stream for the tree repair (see :func:`rep_count`)."""
    j = torch.arange(n - 3, device=lo.device, dtype=torch.int64)
    steps = torch.minimum(lo[:, None] + j[None, :] * arity, hi[:, None])
    wrap_end = torch.div(hi + 1, t, rounding_mode="floor") * t - 1  # the last row before the ring's wrap
    wrapped = wrap_end >= lo
    w_end = torch.where(wrapped, wrap_end, hi)
    w_start = torch.where(wrapped & (wrap_end + 1 <= hi), wrap_end + 1, hi)
    q = torch.cat((steps, hi[:, None], w_end[:, None], w_start[:, None]), dim=1)
    return _rows_slots(base[:, None], q, t)


def sample_transitions(
    *,
    state: TreeState,
    rows: torch.Tensor,
    seed: int,
    mode: int,
    beta: torch.Tensor,
    gamma: torch.Tensor,
    n_step: int,
    rows_per_env: int,
    reward_col: int,
    flags_col: int,
    out_rows: torch.Tensor,
    out_next: torch.Tensor,
    out_idx: torch.Tensor,
    out_gen: torch.Tensor,
    out_w: torch.Tensor,
    out_discount: torch.Tensor,
) -> None:
    """Draw ``len(out_idx)`` starts as the flat buffer's :func:`gper.ops.tree.reference.sample` draws
    slots (``mode`` proportional or stratified: uniform buffers hold 1 on every drawable start),
    then make each an n-step transition (:func:`complete_transitions`)."""
    reference.sample(
        state=state,
        rows=rows,
        seed=seed,
        mode=mode,
        beta=beta,
        out=SampleOut(out_rows, out_idx, out_gen, out_w),
    )
    complete_transitions(
        rows=rows,
        rows_per_env=rows_per_env,
        n_step=n_step,
        gamma=gamma,
        reward_col=reward_col,
        flags_col=flags_col,
        idx=out_idx,
        out_rows=out_rows,
        out_next=out_next,
        out_discount=out_discount,
    )


def complete_transitions(
    *,
    rows: torch.Tensor,
    rows_per_env: int,
    n_step: int,
    gamma: torch.Tensor,
    reward_col: int,
    flags_col: int,
    idx: torch.Tensor,
    out_rows: torch.Tensor,
    out_next: torch.Tensor,
    out_discount: torch.Tensor,
) -> None:
    """Turn drawn start rows into n-step transitions, in place.

    For the start at slot ``idx[s]`` (its row already gathered into ``out_rows[s]``), with ``m`` the
    steps up to ``n_step`` before its episode's end: ``out_rows[s]``'s reward becomes the return
    ``r_0 + g r_1 + ... + g^(m-1) r_(m-1)`` (float32, in that order, ``g^i`` by repeated
    multiplication) and its flags the terminated / truncated of those m steps; ``out_next[s]`` gets
    the row ``m`` steps on (its observation is the next one); ``out_discount[s]`` is ``g^m``, or 0
    where the episode terminated.

    Args:
        rows: [E * T, W] int32 storage.
        gamma: 0-d float32 device tensor (clamped to [0, 1], NaN read as 1).
        reward_col: the reward's column (a float32 field).
        idx: [B] int64 drawn start slots.
        out_rows: [B, W] int32 the drawn start rows (patched in place).
        out_next: [B, W] int32 out.
        out_discount: [B] float32 out.
    """
    t = rows_per_env
    g = torch.where(torch.isnan(gamma), 1.0, gamma.clamp(0.0, 1.0)).float()
    base = idx - torch.remainder(idx, t)
    pos = idx - base
    ret = out_rows[:, reward_col].view(torch.float32).clone()
    flags = out_rows[:, flags_col]
    power = g.expand(idx.shape).clone()
    alive = (flags & ENDED) == 0
    m = torch.ones_like(idx)
    for i in range(1, n_step):
        slot = base + torch.remainder(pos + i, t)
        r = rows[slot, reward_col].view(torch.float32)
        f = rows[slot, flags_col]
        ret = torch.where(alive, ret + power * r, ret)
        power = torch.where(alive, power * g, power)
        flags = torch.where(alive, f, flags)
        m = m + alive.long()
        alive = alive & ((f & ENDED) == 0)
    out_next.copy_(rows[base + torch.remainder(pos + m, t)])
    out_rows[:, reward_col] = ret.view(torch.int32)
    out_rows[:, flags_col] = flags & ENDED
    out_discount.copy_(torch.where((flags & TERMINATED) != 0, 0.0, power))


def steps_taken(
    *, rows: torch.Tensor, idx: torch.Tensor, rows_per_env: int, n_step: int, flags_col: int
) -> torch.Tensor:
    """[B] int64: the steps ``m`` of each drawn start's n-step transition (up to ``n_step``, fewer
    where its episode ended first): the row ``m`` steps on holds its next observation, as in
    :func:`complete_transitions`."""
    t = rows_per_env
    base = idx - torch.remainder(idx, t)
    pos = idx - base
    alive = (rows[idx, flags_col] & ENDED) == 0
    m = torch.ones_like(idx)
    for i in range(1, n_step):
        m = m + alive.long()
        alive = alive & ((rows[base + torch.remainder(pos + i, t), flags_col] & ENDED) == 0)
    return m


def stack_frames(
    *,
    rows: torch.Tensor,
    streams: torch.Tensor,
    rows_per_env: int,
    n_step: int,
    flags_col: int,
    col0: int,
    idx: torch.Tensor,
    out_obs: torch.Tensor,
    out_next: torch.Tensor,
) -> None:
    """The frame stacks of drawn n-step transitions: each start's last ``S`` observations and
    those of the row ``m`` steps on (``docs/trajectory.md``, *Frame stacks*).

    Position ``j`` of a stack holds the observation ``S - 1 - j`` rows before its anchor (the start
    row ``k``; for ``out_next`` the row ``k + m``, :func:`steps_taken`), or zeros where that row is
    not a step of the start's episode: before the stream's first row, overwritten by the ring, an
    end row (the previous episode's final observation) or behind one. The rows from ``k`` to
    ``k + m`` are the episode's by construction.

    Args:
        rows: [E * T, W] int32 storage.
        streams: [E, 2] int64 stream counts.
        col0: the first word of the stacked observation words in a row (``out_obs.shape[-1]`` of them).
        idx: [B] int64 drawn start slots.
        out_obs: [B, S, F] int32 out: the start's stack, the oldest frame first.
        out_next: [B, S, F] int32 out: the stack of its next observation.
    """
    t, s_n, f = rows_per_env, out_obs.shape[1], out_obs.shape[2]
    base = idx - torch.remainder(idx, t)
    count = streams[torch.div(idx, t, rounding_mode="floor"), 0]
    k = count - 1 - torch.remainder(count - 1 - (idx - base), t)  # the start's row number
    m = steps_taken(rows=rows, idx=idx, rows_per_env=t, n_step=n_step, flags_col=flags_col)
    back = torch.arange(1, s_n, device=idx.device, dtype=torch.int64)
    q = k[:, None] - back[None, :]  # the rows 1 .. S - 1 before the start
    stored = (q >= 0) & (q >= (count - t)[:, None])
    own = stored & ((rows[base[:, None] + torch.remainder(q, t), flags_col] & END_ROW) == 0)
    # ok[:, d]: the row d before the start is the episode's (it and every row between are)
    ok = torch.cat((torch.ones_like(k[:, None], dtype=torch.bool), torch.cumprod(own, dim=1).bool()), dim=1)
    d = torch.arange(s_n - 1, -1, -1, device=idx.device, dtype=torch.int64)  # position j: d = S - 1 - j
    for anchor, shift, out in ((k, torch.zeros_like(m), out_obs), (k + m, m, out_next)):
        back_of_start = (d[None, :] - shift[:, None]).clamp_min(0)  # the rows up to the start are the episode's
        valid = torch.gather(ok, 1, back_of_start)
        slot = base[:, None] + torch.remainder(anchor[:, None] - d[None, :], t)
        frames = rows[slot.reshape(-1), col0 : col0 + f].view(-1, s_n, f)
        out.copy_(torch.where(valid[..., None], frames, 0))


def gather_sequences(
    *,
    rows: torch.Tensor,
    streams: torch.Tensor,
    rows_per_env: int,
    length: int,
    burn_in: int,
    obs_mask: torch.Tensor,
    flags_col: int,
    idx: torch.Tensor,
    out_rows: torch.Tensor,
    out_mask: torch.Tensor,
) -> None:
    """Gather the rows ``k - burn_in .. k + length`` of each drawn start ``k``, masked and zeroed.

    The same function serves both back ends (sequences have no Triton kernel of their own).

    Args:
        streams: [E, 2] int64 stream counts.
        idx: [B] int64 drawn start slots.
        out_rows: [B, burn_in + length + 1, W] int32 out: row ``k + i - burn_in`` at position ``i``;
            position ``i`` serves as the observation of step ``i`` and the next observation of step ``i - 1``.
        out_mask: [B, burn_in + length] bool out: step ``i`` is a step of the start's episode.
    """
    t = rows_per_env
    base = idx - torch.remainder(idx, t)
    pos = idx - base
    count = streams[torch.div(idx, t, rounding_mode="floor"), 0]
    start = count - 1 - torch.remainder(count - 1 - pos, t)  # the start's row number
    off = torch.arange(-burn_in, length + 1, device=idx.device, dtype=torch.int64)
    q = start[:, None] + off[None, :]
    stored = (q >= 0) & (q >= (count - t)[:, None]) & (q < count[:, None])
    g = rows[base[:, None] + torch.remainder(q, t)]  # [B, S + 1, W]
    f = g[..., flags_col]
    ended, end_row = (f & ENDED) != 0, (f & END_ROW) != 0
    # after the start: step i is the episode's while no step before it ended
    fwd = torch.ones(idx.shape[0], length, dtype=torch.bool, device=idx.device)
    if length > 1:
        fwd[:, 1:] = torch.cumprod(~ended[:, burn_in : burn_in + length - 1], dim=1).bool()
    # before it: row k - j is the episode's while it and every row after it are stored steps
    back = stored[:, :burn_in] & ~end_row[:, :burn_in]
    back = torch.flip(torch.cumprod(torch.flip(back, (1,)), dim=1), (1,)).bool()
    mask = torch.cat((back, fwd), dim=1)
    keep = torch.cat((mask, torch.zeros_like(mask[:, :1])), dim=1)
    after = torch.cat((torch.zeros_like(mask[:, :1]), mask), dim=1)  # the next observation of a step
    g = torch.where(keep[..., None], g, torch.where(after[..., None], g & obs_mask, 0))
    out_rows.copy_(g)
    out_mask.copy_(mask)


def expected_drawable(*, flags: torch.Tensor, streams: torch.Tensor, rows_per_env: int, window: int) -> torch.Tensor:
    """[E * T] bool: the slots that must be drawable starts, recomputed from the rows' flags words
    (``flags`` [E * T] int32) and the stream counts: what :func:`stream_add` maintains step by
    step, for a checkpoint's check and for tests."""
    t = rows_per_env
    e_n = streams.shape[0]
    count = streams[:, 0]
    held = count.clamp(max=t)
    i = torch.arange(t, device=flags.device, dtype=torch.int64)
    q = (count - held)[:, None] + i[None, :]  # row numbers in time order, the oldest first
    present = i[None, :] < held[:, None]
    base = torch.arange(e_n, device=flags.device, dtype=torch.int64)[:, None] * t
    slot = base + torch.remainder(q, t)
    f = flags[slot]
    end_row = present & ((f & END_ROW) != 0)
    big = torch.full_like(q, 2**62)
    next_end = torch.where(end_row, q, big)
    # the first end row at or after each position: a reverse running minimum
    next_end = torch.flip(torch.cummin(torch.flip(next_end, (1,)), dim=1).values, (1,))
    after = torch.cat((next_end[:, 1:], big[:, :1]), dim=1)  # the first end row after each row
    complete = (q + window <= (count - 1)[:, None]) | (after - q <= window)
    ok = present & ~end_row & complete
    out = torch.zeros(e_n * t, dtype=torch.bool, device=flags.device)
    out[slot.reshape(-1)] = ok.reshape(-1)
    return out
