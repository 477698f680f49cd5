"""The Triton back end's launchers for several instances at once: one set of launches serves N
trees stacked on a leading [N] dimension (a buffer of ``instances=N``,
:class:`gper.replay.instances.InstanceStack`).

The kernels are the single tree's (:mod:`gper.ops.tree.triton_sample`, ``triton_update``,
``triton_climb``) compiled with ``INST=True``: grid axis 1 is the instance ``k``, every stacked
tensor is read at ``k * stride`` of its leading dimension, instance ``k`` draws with the Philox key
``seed + k``, and the last-program elections (the RNG advance, the top level's repair, the add's
cursor) count the programs of one instance in its own counters. Each instance's work is that of
the single kernel on its views, bit for bit (:mod:`gper.ops.instances` is the loop these are
checked against). A single tree keeps launching ``INST=False``, where that code folds away.

The grid's axis 1 is at most 65535 instances on CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gper._triton import triton
from gper.ops.instances import beta_pointer
from gper.ops.state import SampleOut, TreeState
from gper.ops.tree import triton as single
from gper.ops.tree.triton import (
    LAUNCH,
    MAX_ADD_SOURCES,
    _draw_args,
    _level_offsets,
    _shape,
    arrive_counters,
    sample_block,
)
from gper.ops.tree.triton_climb import _add_repair, _add_write, _update_apply
from gper.ops.tree.triton_sample import _sample_kernel
from gper.ops.tree.triton_update import _recompute_level, _reset_claims, _update_claim, _update_leaves


def _grid(n: int, block: int, instances: int) -> tuple[int, int]:
    return (triton.cdiv(n, block), instances)


def _st(t: torch.Tensor) -> int:
    """The per-instance stride of a stacked tensor (elements)."""
    return t.stride(0)


def _tree_strides(state: TreeState) -> dict[str, int]:
    return {"st_tree": _st(state.tree), "st_ctr": _st(state.counters)}


def instance_params(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """[N] float32 device tensor of ``values`` (each instance's alpha, or eps), what the batched
    update reads where the single kernel takes the float: rounded to float32 as that launch rounds
    it. A host-to-device copy: a caller that captures graphs makes it before the capture (and keeps
    it alive as long as the graph)."""
    return torch.tensor([float(v) for v in values], dtype=torch.float32, device=device)


def sample_instances(
    *,
    state: TreeState,
    rows: torch.Tensor,
    seed: int,
    mode: int,
    beta: torch.Tensor | Sequence[torch.Tensor],
    out: SampleOut,
) -> None:
    """Every instance's ``sample``, one launch: instance k draws ``B`` slots of ``rows[k]`` with
    key ``seed + k`` into ``out[.][k]``.

    Args:
        state: the stacked trees (tensors [N, ...]).
        rows: [N, capacity, W] int32 storage.
        seed: instance 0's Philox key.
        mode: the sampling mode (``MODE_*``).
        beta: a 0-d float32 tensor (every instance's), an [N] float32 tensor, or N 0-d views.
        out: :class:`SampleOut` of [N, B, W], [N, B] ... tensors (each instance's row contiguous).
    """
    n, b = out.idx.shape
    beta_t, st_beta = beta_pointer(beta, n)
    block = sample_block(rows.shape[2])
    _sample_kernel[_grid(b, block, n)](
        state.tree,
        state.mintree,
        _level_offsets(state.layout, state.tree.device),
        rows,
        state.gen,
        state.counters,
        beta_t,
        *out,
        seed,
        b,
        **_draw_args(state.layout, mode, rows.shape[2]),
        BLOCK=block,
        num_warps=LAUNCH.sample_warps,
        **_tree_strides(state),
        st_gen=_st(state.gen),
        st_rows=_st(rows),
        st_beta=st_beta,
        st_orows=_st(out.rows),
        st_oidx=_st(out.idx),
        st_ogen=_st(out.gen),
        st_ow=_st(out.w),
        INST=True,
    )


def update_instances(
    *,
    state: TreeState,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    alpha: Sequence[float] | torch.Tensor,
    eps: Sequence[float] | torch.Tensor,
) -> None:
    """Every instance's ``update``: ``idx``, ``td`` (and ``expected_gen``) [N, B], instance k's
    alpha and eps ``alpha[k]``, ``eps[k]`` (floats, or an [N] float32 device tensor of
    :func:`instance_params`). The same launches as one tree's update of B entries: the climb,
    or the claim, the leaves and one launch per level."""
    layout, claims = state.layout, state.claims
    n, b = idx.shape
    dev = idx.device
    # floats: copied to the device here (a graph capture passes the tensors, made before it)
    alpha_t = alpha if isinstance(alpha, torch.Tensor) else instance_params(alpha, dev)
    eps_t = eps if isinstance(eps, torch.Tensor) else instance_params(eps, dev)
    idx, td = idx.contiguous(), td.contiguous()
    has_gen = expected_gen is not None
    gen_in = expected_gen.contiguous() if has_gen else idx
    clean = torch.empty(n, b, dtype=torch.int64, device=dev)
    # the climb from each instance's entries, as each single buffer's update: so the trees stay the
    # single buffers' bit for bit (on CUDA the climb sums a node in another order than the levels).
    # Climbing from all instances' N * B entries measured no faster (H100: 33.2 against 32.4 µs a
    # step at 64 x 256, 96.1 against 89.0 at 256 x 256; benchmarks/results/instances-step-*-20261205-*)
    climb = LAUNCH.climb and b >= LAUNCH.climb_min_batch
    block = LAUNCH.climb_block if climb else LAUNCH.update_block
    off = _level_offsets(layout, dev)
    arrive = arrive_counters(claims[0], layout)  # instance 0's: the kernel offsets by the claims' stride
    strides = {"st_claims": _st(claims), "st_sc": _st(state.scalars), "st_b": b}
    _update_claim[_grid(b, block, n)](
        idx, td, gen_in, state.gen, claims, state.counters, state.scalars, clean,
        arrive if climb else claims, off, alpha_t, eps_t, b,
        HAS_GEN=has_gen, COUNT=climb and layout.depth >= 2, DEPTH=layout.depth, LOG2K=layout.log2_arity,
        BLOCK=block, st_gen=_st(state.gen), st_ctr=_st(state.counters), INST=True, **strides,
    )  # fmt: skip
    if climb:
        _update_apply[_grid(b, block, n)](
            state.tree, state.mintree, claims, arrive, state.scalars, clean, off, layout.leaf_offset, b,
            **_shape(layout), BLOCK=block, num_warps=LAUNCH.climb_warps,
            st_tree=_st(state.tree), INST=True, **strides,
        )  # fmt: skip
        return
    _update_levels(state, clean, strides)


def _update_levels(state: TreeState, clean: torch.Tensor, strides: dict[str, int]) -> None:
    """The level-by-level repair of :func:`update_instances` (``triton._set_priorities``'s, for N)."""
    layout, claims = state.layout, state.claims
    n, b = clean.shape
    parent = layout.depth >= 2
    _update_leaves[_grid(b, LAUNCH.level_block, n)](
        state.tree, state.mintree, claims, state.scalars, clean, layout.leaf_offset,
        layout.offsets[layout.depth - 2] if parent else 0, b,
        K=layout.arity, LOG2K=layout.log2_arity, PARENT=parent, WITH_MIN=True,
        BLOCK=LAUNCH.level_block, num_warps=LAUNCH.level_warps,
        st_tree=_st(state.tree), INST=True, **strides,
    )  # fmt: skip
    if parent:
        _levels(state, clean, layout.depth - 3)
    else:
        _reset_claims[_grid(b, LAUNCH.update_block, n)](
            claims, clean, b, BLOCK=LAUNCH.update_block, st_claims=_st(claims), st_b=b, INST=True
        )


def _levels(state: TreeState, leaves: torch.Tensor, top: int) -> None:
    """``triton.levels(..., reset_claims=True)`` for N instances: levels ``top`` .. 0 above
    ``leaves`` [N, B], one launch per level (level 0 on level 1's), the claims reset by the first."""
    layout = state.layout
    n, b = leaves.shape
    order = list(range(top, -1, -1))
    fold_top = len(order) >= 2
    if fold_top:
        order.pop()
    for j, level in enumerate(order):
        is_top = fold_top and level == 1
        _recompute_level[_grid(b, LAUNCH.level_block, n)](
            state.tree, state.mintree, leaves, state.claims, state.counters,
            layout.offsets[level], layout.offsets[level + 1], layout.shift(level), b,
            layout.offsets[0], layout.sizes[0],
            K=layout.arity, BLOCK=LAUNCH.level_block, RESET=j == 0, TOP=is_top, num_warps=LAUNCH.level_warps,
            st_tree=_st(state.tree), st_leaves=b, st_claims=_st(state.claims), st_ctr=_st(state.counters), INST=True,
        )  # fmt: skip
    if not order:
        _reset_claims[_grid(b, LAUNCH.update_block, n)](
            state.claims, leaves, b, BLOCK=LAUNCH.update_block, st_claims=_st(state.claims), st_b=b, INST=True
        )


def _add_sources(values, plan, n: int, b: int) -> list[torch.Tensor]:
    """Each [N, b, ...] value as the add kernel reads it: contiguous int32 words (or bytes), its
    instances ``b`` items apart (the kernel's ``_source_stride``), padded to MAX_ADD_SOURCES."""
    srcs = []
    for x, (_, _, _, by_bytes) in zip(values, plan, strict=True):
        flat = x.contiguous().reshape(n, b, -1)
        if flat.dtype == torch.bool:
            flat = flat.view(torch.uint8)
        if not by_bytes and flat.storage_offset() * flat.element_size() % 4:
            flat = flat.clone()  # a view that starts inside a word reads as words once copied
        srcs.append(flat.view(torch.uint8 if by_bytes else torch.int32))
    return srcs + [srcs[0]] * (MAX_ADD_SOURCES - len(srcs))


def add_rows_instances(
    *,
    state: TreeState,
    rows: torch.Tensor,
    fields,
    values,
    plan,
    skip: int,
    total: int,
    leaf_value: float | None,
) -> torch.Tensor:
    """Every instance's ``add_rows``: ``values`` [N, n, ...] each, into ``rows`` [N, capacity, W];
    returns [N, n] slots. Two launches with a plan (and the climb on); otherwise one tree at a
    time (the field-by-field path)."""
    n, b = values[0].shape[0], values[0].shape[1]
    layout = state.layout
    if plan is None or not LAUNCH.climb:
        from gper.ops.instances import loop_add_rows

        return loop_add_rows(single, state=state, rows=rows, fields=fields, values=values, plan=plan,
                             skip=skip, total=total, leaf_value=leaf_value)  # fmt: skip
    specs = list(plan) + [None] * (MAX_ADD_SOURCES - len(plan))
    pos = torch.empty(n, b, dtype=torch.int64, device=rows.device)
    value = 0.0 if leaf_value is None else float(leaf_value)
    st = {"st_tree": _st(state.tree), "st_ctr": _st(state.counters)}
    _add_write[_grid(b, LAUNCH.add_block, n)](
        state.tree, state.mintree, state.gen, state.counters, state.scalars, rows, rows.view(torch.uint8), pos,
        *_add_sources(values, plan, n, b), layout.leaf_offset, b, skip, layout.capacity, value,
        F0=specs[0], F1=specs[1], F2=specs[2], F3=specs[3], F4=specs[4], F5=specs[5], W=rows.shape[2],
        USE_MAX=leaf_value is None, BLOCK=LAUNCH.add_block, num_warps=LAUNCH.add_warps,
        st_gen=_st(state.gen), st_sc=_st(state.scalars), st_rows=_st(rows), st_pos=b, INST=True, **st,
    )  # fmt: skip
    _add_repair[_grid(b // layout.arity + 3, LAUNCH.climb_block, n)](
        state.tree, state.mintree, state.counters, arrive_counters(state.claims[0], layout),
        _level_offsets(layout, state.tree.device), b, skip, total, layout.capacity,
        **_shape(layout), BLOCK=LAUNCH.climb_block, num_warps=LAUNCH.climb_warps,
        st_arrive=_st(state.claims), INST=True, **st,
    )  # fmt: skip
    return pos
