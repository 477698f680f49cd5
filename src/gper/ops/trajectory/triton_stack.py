"""The Triton kernel of the trajectory buffer's frame stacks, with the signature and semantics of
:func:`gper.ops.trajectory.reference.stack_frames` (documented there).

One program per draw, stack side (the start's or the next observation's), stack position and
block of words: it finds its source row from the start's row number, the steps of its n-step
transition and the end-row flags of the ``S - 1`` rows before the start (a few scalar loads, the
same in every program of a draw), then copies one block of that row's observation words, or
zeros. Programs write disjoint outputs and only read the storage: no ordering between them.
"""

from __future__ import annotations

import torch

from gper._triton import tl, triton

_ENDED = tl.constexpr(0x101)
_END_ROW = tl.constexpr(0x10000)
#: words a program copies (a frame of 84 x 84 bytes is 1,764 words: two programs)
_MAX_BLOCK = 1024


@triton.jit
def _flags(rows, base, q, T, W: tl.constexpr, FC: tl.constexpr):
    """The flags word of row number ``q >= 0`` of the stream whose first slot is ``base``."""
    return tl.load(rows + (base + q % T) * W + FC)


@triton.jit
def _stack_frames(
    rows,
    streams,
    idx,
    out_obs,
    out_next,
    T,
    B,
    W: tl.constexpr,
    FC: tl.constexpr,
    C0: tl.constexpr,
    F: tl.constexpr,
    S: tl.constexpr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    side_j = tl.program_id(1)  # side * S + j
    side = side_j // S
    d = S - 1 - side_j % S  # rows back from the anchor
    node = tl.load(idx + b).to(tl.int64)
    pos = node % T
    base = node - pos
    count = tl.load(streams + (node // T) * 2)
    k = count - 1 - (count - 1 - pos) % T  # the start's row number (count - 1 - pos >= 0)
    m = tl.zeros([], tl.int64)
    if side == 1:  # the next observation: the row m steps on, as steps_taken counts them
        m += 1
        alive = (_flags(rows, base, k, T, W, FC) & _ENDED) == 0
        for i in tl.static_range(1, N):
            m += alive.to(tl.int64)
            alive = alive & ((_flags(rows, base, k + i, T, W, FC) & _ENDED) == 0)
    e = d - m  # rows back from the start that must be the episode's
    valid = True
    for i in tl.static_range(1, S):
        q = k - i
        qq = tl.maximum(q, 0)
        own = (q >= 0) & (q >= count - T) & ((_flags(rows, base, qq, T, W, FC) & _END_ROW) == 0)
        valid = valid & (own | (i > e))
    src = base + (k + m - d) % T
    cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    cm = cols < F
    vals = tl.load(rows + src * W + C0 + cols, mask=cm & valid, other=0)
    dst = (b.to(tl.int64) * S + side_j % S) * F + cols
    if side == 0:
        tl.store(out_obs + dst, vals, mask=cm)
    else:
        tl.store(out_next + dst, vals, mask=cm)


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
    b, s_n, f = out_obs.shape
    block = min(triton.next_power_of_2(f), _MAX_BLOCK)
    _stack_frames[(b, 2 * s_n, triton.cdiv(f, block))](
        rows,
        streams,
        idx,
        out_obs,
        out_next,
        rows_per_env,
        b,
        W=rows.shape[1],
        FC=flags_col,
        C0=col0,
        F=f,
        S=s_n,
        N=n_step,
        BLOCK=block,
        num_warps=4,
    )
