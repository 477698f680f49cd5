"""Triton kernels of the trajectory buffer, with the signatures and semantics of
:mod:`gper.ops.trajectory.reference` (documented there).

* ``_stream_add``: one program per stream: the four cases of ``add`` (the episode goes on, a
  next-step reset step, a same-step reset, an unflagged reset), the rows, their generations and
  leaves, the starts made drawable, the stream state, the step gathered from the caller's own
  tensors by a word plan (or read packed), and the leaf parents above the changed leaves where
  each lies inside the stream's block. Each program touches only its own stream's slots, so
  programs never race; the levels above are the flat buffer's level-by-level ``_levels``,
  launched after it.
* ``_sample_transitions``: the whole of a transition ``sample`` in one launch: the flat buffer's
  draw (``triton_sample._draw_rows``: the same slots, IS weights and rows as its sampling kernel),
  then per draw the return over the steps up to the episode's end, the flags, the discount, and
  the row m steps on. Compiled without floating-point contraction, so its multiply-then-add rounds
  as the torch reference's does (bit-identical returns).

Sequences have no kernel of their own: :func:`gather_sequences` is the torch reference's. Frame
stacks have theirs in :mod:`gper.ops.trajectory.triton_stack`.
"""

from __future__ import annotations

import torch

from gper._triton import tl, triton
from gper.ops.state import TreeState
from gper.ops.trajectory import reference
from gper.ops.trajectory.reference import gather_sequences, rep_count  # noqa: F401 (gather_sequences: the contract's)
from gper.ops.trajectory.triton_stack import stack_frames  # noqa: F401 (the contract's)
from gper.ops.tree.triton import LAUNCH, _draw_args, _draw_inputs, _level_offsets, _shape, levels, sample_block
from gper.ops.tree.triton_sample import _advance_rng, _draw_rows
from gper.ops.triton_lanes import lanes
from gper.ops.triton_slots import S_MAXP

T_DISCONTINUITIES = tl.constexpr(reference.T_DISCONTINUITIES)
T_STEPS = tl.constexpr(reference.T_STEPS)


@triton.jit
def _source(words, plan, e, which: tl.constexpr, src, stride):
    """The words of ``plan`` that come from source ``which`` (``src``, ``stride`` words a row)."""
    take = (plan >> 24) == which
    return tl.where(take, tl.load(src + e * stride + (plan & 0xFFFFFF), mask=take, other=0), words)


@triton.jit
def _gather_step(plan, e, s0, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5, N_SRC: tl.constexpr, WP: tl.constexpr):
    """A staged row gathered from the step's own tensors by the add's word plan (see StepPacker.word_plan)."""
    words = tl.zeros([WP], tl.int32)
    words = _source(words, plan, e, 0, s0, t0)
    if N_SRC > 1:
        words = _source(words, plan, e, 1, s1, t1)
    if N_SRC > 2:
        words = _source(words, plan, e, 2, s2, t2)
    if N_SRC > 3:
        words = _source(words, plan, e, 3, s3, t3)
    if N_SRC > 4:
        words = _source(words, plan, e, 4, s4, t4)
    if N_SRC > 5:
        words = _source(words, plan, e, 5, s5, t5)
    return words


# One body of about 170 lines, kept whole: its phases (the step's case, the rows, the starts made
# drawable, the stream state, the leaf parents) share a dozen values loaded up front in two
# dependent rounds (so the program waits on memory twice) and the [HP] tiles of the starts; split
# into @triton.jit helpers they would pass those through every call, and a split of this kernel has
# not been checked on a GPU for the same registers and the same bits (the golden tests hold it).
@triton.jit
def _stream_add(
    tree,
    mintree,
    gen,
    keys,
    scalars,
    rows,
    staged,
    streams,
    pending,
    tcounters,
    obs_mask,
    reps,
    level_off,
    leaf_off,
    T,
    value,
    plan,
    term,
    trunc,
    s0,
    s1,
    s2,
    s3,
    s4,
    s5,
    t0,
    t1,
    t2,
    t3,
    t4,
    t5,
    W: tl.constexpr,
    WP: tl.constexpr,
    FC: tl.constexpr,
    WINDOW: tl.constexpr,
    HP: tl.constexpr,
    R: tl.constexpr,
    RP: tl.constexpr,
    K: tl.constexpr,
    USE_MAX: tl.constexpr,
    HAS_KEYS: tl.constexpr,
    DEPTH: tl.constexpr,
    LOG2K: tl.constexpr,
    LEAF_PARENTS: tl.constexpr,
    N_SRC: tl.constexpr,
    AUTORESET: tl.constexpr,
):
    # loads first, in two dependent rounds (what the stream holds; then what sits at its cursor
    # and the tree above it), so that the program waits on memory as few times as it can
    e = tl.program_id(0).to(tl.int64)
    base = e * T
    k = tl.load(streams + 2 * e)
    ep = tl.load(streams + 2 * e + 1)
    cols = tl.arange(0, WP)
    cm = cols < W
    if N_SRC == 0:  # packed by the caller: [E, 2W] staged rows
        step = tl.load(staged + 2 * W * e + cols, mask=cm, other=0)
        nxt = tl.load(staged + 2 * W * e + W + cols, mask=cm, other=0)
    else:  # gathered here from the step's own tensors, by the word plan
        plan_step = tl.load(plan + cols, mask=cm, other=-1)
        plan_next = tl.load(plan + W + cols, mask=cm, other=-1)
        step = _gather_step(plan_step, e, s0, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5, N_SRC, WP)
        nxt = _gather_step(plan_next, e, s0, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5, N_SRC, WP)
        flags = tl.load(term + e).to(tl.int32) | (tl.load(trunc + e).to(tl.int32) << 8)
        step = tl.where(cols == FC, flags, step)
    pend = tl.load(pending + W * e + cols, mask=cm, other=0)
    omask = tl.load(obs_mask + cols, mask=cm, other=0)
    maxp = tl.load(scalars + S_MAXP)
    has_prev = k > 0
    prev_slot = base + tl.maximum(k - 1, 0) % T
    prev_flags = tl.load(rows + prev_slot * W + FC)
    # leaves for the repair of rows lo .. k + 1 (this add writes row k, and k + 1 if it inserts an
    # end row): one every K rows, the last, and both sides of a wrap of the ring
    back = k - WINDOW
    lo = tl.maximum(back, 0)
    hi = k + 1
    r = tl.arange(0, RP)
    wrap_end = ((hi + 1) // T) * T - 1
    wrapped = wrap_end >= lo
    w_end = tl.where(wrapped, wrap_end, hi)
    w_start = tl.where(wrapped & (wrap_end + 1 <= hi), wrap_end + 1, hi)
    q = tl.minimum(lo + r.to(tl.int64) * K, hi)
    q = tl.where(r == R - 3, hi, q)
    q = tl.where(r == R - 2, w_end, q)
    q = tl.where(r == R - 1, w_start, q)
    rm = r < R
    rep = base + q % T
    kk = tl.arange(0, K)
    if LEAF_PARENTS:  # the old leaves under each repaired leaf parent, loaded before any write
        n0 = rep >> LOG2K
        c0 = n0[:, None] * K + kk[None, :]
        a0 = tl.load(tree + leaf_off + c0)
        b0 = tl.load(mintree + leaf_off + c0)
    # which of the four cases of add this step is (see the reference)
    prev_ended = has_prev & ((prev_flags & 0x101) != 0)  # terminated or truncated byte
    prev_end_row = has_prev & ((prev_flags & 0x10000) != 0)
    differ = tl.sum((((step ^ pend) & omask) != 0).to(tl.int32), axis=0)
    same = (k == 0) | (differ == 0)
    if AUTORESET == 1:  # SAME_STEP: a step after an end is always a new episode's first
        reset_step = k < 0  # never
        insert = has_prev & (prev_ended | (differ != 0))
    elif AUTORESET == 2:  # NEXT_STEP: always the reset step
        reset_step = prev_ended
        insert = has_prev & ~prev_ended & (differ != 0)
    else:  # AUTO: a reset step when its observation is the final one, bit for bit
        reset_step = prev_ended & same
        insert = has_prev & (differ != 0)
    jump = insert & ~prev_ended
    ends = reset_step | insert
    # the step before an unflagged reset becomes truncated (an unchanged store elsewhere)
    fixed = tl.where(jump & ~prev_end_row, prev_flags | 0x100, prev_flags)
    tl.store(rows + prev_slot * W + FC, fixed, mask=has_prev)
    # the per-stream flags as [WP] masks (the interpreter rejects a vector mask and'ed with a scalar)
    insert_v = (cols * 0 + insert.to(tl.int32)) != 0
    ends_v = (cols * 0 + ends.to(tl.int32)) != 0
    end_row = pend & omask  # the final observation (a reset step's own obs is the same)
    end_row = tl.where(cols == FC, 0x10000, end_row)
    first = tl.where(ends_v, end_row, step)
    s1 = base + k % T
    s2 = base + (k + 1) % T
    tl.store(rows + s1 * W + cols, first, mask=cm)
    tl.store(rows + s2 * W + cols, step, mask=cm & insert_v)
    tl.atomic_add(gen + s1, 1)
    tl.atomic_add(gen + s2, 1, mask=insert)
    tl.store(tree + leaf_off + s1, 0.0)
    tl.store(mintree + leaf_off + s1, float("inf"))
    tl.store(tree + leaf_off + s2, 0.0, mask=insert)
    tl.store(mintree + leaf_off + s2, float("inf"), mask=insert)
    # starts made drawable: after an end row every pending one of its episode, after a step the
    # one WINDOW rows back if it lies in the episode in progress
    j = tl.arange(0, HP)
    first_new = tl.where(ends, tl.maximum(back, ep), back)
    last_new = tl.where(ends, k - 1, tl.where(back >= ep, back, back - 1))
    cand = first_new + j
    live = (j < WINDOW + 1) & (cand <= last_new)
    cslot = base + tl.where(live, cand, 0) % T
    if USE_MAX:
        v = maxp
    else:
        v = value
    tl.store(tree + leaf_off + cslot, v + tl.zeros([HP], tl.float32), mask=live)
    tl.store(mintree + leaf_off + cslot, v + tl.zeros([HP], tl.float32), mask=live)
    if HAS_KEYS:
        tl.store(keys + cslot, maxp + tl.zeros([HP], tl.float32), mask=live)
    n_rows = 1 + insert.to(tl.int64)
    tl.store(streams + 2 * e, k + n_rows)
    tl.store(streams + 2 * e + 1, tl.where(ends, k + 1, ep))
    tl.store(pending + W * e + cols, nxt, mask=cm)
    tl.atomic_add(tcounters + T_DISCONTINUITIES, jump.to(tl.int64), mask=jump)
    first_program = e == 0
    tl.store(tcounters + T_STEPS, tl.load(tcounters + T_STEPS) + 1, mask=first_program)  # only program 0 writes it
    tl.store(reps + R * e + r, rep, mask=rm)  # the levels above: repaired in launches of their own
    if LEAF_PARENTS:
        # the leaf parents lie inside the stream's block (K divides T): this program alone writes
        # them, from the old leaves patched with the ones this add wrote (no reload)
        newest = k + n_rows - 1
        p = c0 - base  # each child leaf's ring position, and the row it holds
        qc = newest - ((newest - p) % T + T) % T
        fresh = (qc == k) | ((qc == k + 1) & ((qc * 0 + insert.to(tl.int64)) != 0))
        act = (qc >= first_new) & (qc <= last_new)
        a0 = tl.where(fresh, 0.0, tl.where(act, v, a0))
        b0 = tl.where(fresh, float("inf"), tl.where(act, v, b0))
        po = tl.load(level_off + DEPTH - 2)
        tl.store(tree + po + n0, tl.sum(a0, axis=1), mask=rm)
        tl.store(mintree + po + n0, tl.min(b0, axis=1), mask=rm)


@triton.jit
def _sample_transitions(
    tree,
    mintree,
    level_off,
    rows,
    gen,
    counters,
    beta_ptr,
    gamma_ptr,
    out_rows,
    out_next,
    out_idx,
    out_gen,
    out_w,
    out_disc,
    seed,
    B,
    T,
    DEPTH: tl.constexpr,
    K: tl.constexpr,
    NB: tl.constexpr,
    MODE: tl.constexpr,
    W: tl.constexpr,
    WP: tl.constexpr,
    RC: tl.constexpr,
    FC: tl.constexpr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    LOG2K: tl.constexpr,
):
    s, m = lanes(B, BLOCK)
    node, rng, cols, cm, vals = _draw_rows(
        tree, mintree, level_off, rows, gen, counters, beta_ptr, out_idx, out_gen, out_w, seed, B, s, m,
        DEPTH, K, NB, MODE, W, WP, BLOCK, LOG2K,
    )  # fmt: skip
    # the n-step transition (see the reference's complete_transitions): the start row's reward and
    # flags words, then the rows after it while its episode goes on
    pos = node % T
    base = node - pos
    g = tl.load(gamma_ptr)
    g = tl.where(g == g, tl.minimum(tl.maximum(g, 0.0), 1.0), 1.0)  # clamped, NaN read as 1
    ret = tl.sum(tl.where(cols[None, :] == RC, vals, 0), axis=1).to(tl.float32, bitcast=True)
    flags = tl.sum(tl.where(cols[None, :] == FC, vals, 0), axis=1)
    power = g + tl.zeros([BLOCK], tl.float32)
    alive = (flags & 0x101) == 0
    steps = tl.full([BLOCK], 1, tl.int64)
    for i in tl.static_range(1, N):
        slot = base + (pos + i) % T
        r = tl.load(rows + slot * W + RC, mask=m, other=0).to(tl.float32, bitcast=True)
        f = tl.load(rows + slot * W + FC, mask=m, other=0)
        ret = tl.where(alive, ret + power * r, ret)
        power = tl.where(alive, power * g, power)
        flags = tl.where(alive, f, flags)
        steps += alive.to(tl.int64)
        alive = alive & ((f & 0x101) == 0)
    vals = tl.where(cols[None, :] == RC, ret.to(tl.int32, bitcast=True)[:, None], vals)
    vals = tl.where(cols[None, :] == FC, (flags & 0x101)[:, None], vals)
    tl.store(out_rows + s[:, None] * W + cols[None, :], vals, mask=cm)
    nslot = base + (pos + steps) % T
    nvals = tl.load(rows + nslot[:, None] * W + cols[None, :], mask=cm, other=0)
    tl.store(out_next + s[:, None] * W + cols[None, :], nvals, mask=cm)
    tl.store(out_disc + s, tl.where((flags & 0x1) != 0, 0.0, power), mask=m)
    _advance_rng(counters, rng, B, NB)


def stream_add(
    *,
    state: TreeState,
    keys: torch.Tensor | None,
    rows: torch.Tensor,
    staged: torch.Tensor | None,
    streams: torch.Tensor,
    pending: torch.Tensor,
    tcounters: torch.Tensor,
    obs_mask: torch.Tensor,
    flags_col: int,
    rows_per_env: int,
    window: int,
    value: float | None,
    autoreset: int = 0,
    sources: tuple[torch.Tensor, ...] = (),
    plan: torch.Tensor | None = None,
    flags: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """As the reference's; or, with ``staged=None``, the step read from ``sources`` ([E, words]
    int32 views of its tensors) by ``plan`` (:meth:`gper.replay.streams.StepPacker.word_plan`) and
    ``flags`` (its terminated and truncated), so that no pack runs before the kernel."""
    layout, tree = state.layout, state.tree
    e, w = pending.shape
    srcs = list(sources) + [pending] * (6 - len(sources))
    term, trunc = flags if flags is not None else (pending, pending)
    n_reps = rep_count(window, layout.arity)
    # the kernel repairs the leaf parents where each lies inside one stream's block (K divides T);
    # the levels above are repaired level by level in launches of their own (repairing them in the
    # kernel too, the last program recomputing the shared top, is the slower: docs/performance.md,
    # *Trajectory add*)
    leaf_parents = layout.depth >= 2 and rows_per_env % layout.arity == 0
    reps = torch.empty(e, n_reps, dtype=torch.int64, device=rows.device)
    _stream_add[(e,)](
        tree,
        state.mintree,
        state.gen,
        keys if keys is not None else tree,
        state.scalars,
        rows,
        staged if staged is not None else pending,
        streams,
        pending,
        tcounters,
        obs_mask,
        reps,
        _level_offsets(layout, tree.device),
        layout.leaf_offset,
        rows_per_env,
        0.0 if value is None else float(value),
        plan if plan is not None else pending,
        term.view(torch.int8) if term.dtype == torch.bool else term,
        trunc.view(torch.int8) if trunc.dtype == torch.bool else trunc,
        *srcs,
        *(x.shape[1] for x in srcs),
        W=w,
        WP=triton.next_power_of_2(w),
        FC=flags_col,
        WINDOW=window,
        HP=triton.next_power_of_2(window + 1),
        R=n_reps,
        RP=triton.next_power_of_2(n_reps),
        **_shape(layout),
        USE_MAX=value is None,
        HAS_KEYS=keys is not None,
        LEAF_PARENTS=leaf_parents,
        N_SRC=len(sources) if staged is None else 0,
        AUTORESET=autoreset,
        num_warps=1,
    )
    # the levels above the leaf parents the kernel wrote, or above the leaves
    levels(state, reps.view(-1), layout.depth - (3 if leaf_parents else 2))


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
    b, w = out_rows.shape
    block = sample_block(w)
    _sample_transitions[(triton.cdiv(b, block),)](
        *_draw_inputs(state, rows, beta),
        gamma,
        out_rows,
        out_next,
        out_idx,
        out_gen,
        out_w,
        out_discount,
        seed,
        b,
        rows_per_env,
        **_draw_args(state.layout, mode, w),
        RC=reward_col,
        FC=flags_col,
        N=n_step,
        BLOCK=block,
        num_warps=LAUNCH.sample_warps,
        enable_fp_fusion=False,
    )
