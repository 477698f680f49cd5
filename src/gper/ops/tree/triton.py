"""The tree's Triton back end: launchers of the same signatures as :mod:`gper.ops.tree.reference`
(the semantics are documented there), and the launch shapes (:func:`launch_config`).

Kernels, one launch each unless said:

* ``sample``: ``_sample_kernel`` (:mod:`gper.ops.tree.triton_sample`), the whole draw.
* ``update`` of ``LAUNCH.climb_min_batch`` entries or more: ``_update_claim`` + ``_update_apply``
  (:mod:`gper.ops.tree.triton_climb`, the climb), two launches whatever the depth; of fewer:
  ``_update_claim`` + ``_update_leaves`` + one ``_recompute_level`` per remaining level
  (:mod:`gper.ops.tree.triton_update`).
* ``sample_instances``, ``update_instances``, ``add_rows_instances``: the same launches for N
  trees stacked on a leading [N] (:mod:`gper.ops.tree.triton_instances`).
* ``add_rows``: ``_add_write`` + ``_add_repair`` (:mod:`gper.ops.tree.triton_climb`); where the add
  kernel cannot write the rows itself (more than six fields, or a field wider than 512 words),
  ``_add_positions`` + ``_add_commit`` + the repair.

Triton 3.6 (GPU image) and 3.9 (CI) both compile these: ``tl.load``/``tl.store`` arguments after
the mask are passed by keyword, and nothing uses block pointers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import torch

from gper._triton import triton
from gper.ops.layout import TreeLayout
from gper.ops.state import SampleOut, TreeState, rng_blocks
from gper.ops.tree import reference
from gper.ops.tree.triton_climb import (
    _add_repair,
    _add_write,
    _climb_leaves,
    _count_leaves,
    _update_apply,
    arrive_counters,
    arrive_words,
)
from gper.ops.tree.triton_sample import _sample_kernel
from gper.ops.tree.triton_update import (
    _add_commit,
    _add_positions,
    _recompute_level,
    _reset_claims,
    _update_claim,
    _update_leaves,
)


@dataclass
class LaunchConfig:
    """Launch shapes of the kernels: draws (or update entries) per program, and warps per program.

    The defaults were swept on the H200 (``benchmarks/results/kernel-sweep-h200-2e25-*.txt``);
    change them only through :func:`launch_config`."""

    sample_block: int = 16
    sample_warps: int = 4
    update_block: int = 64
    level_block: int = 32
    level_warps: int = 4
    #: tree repair by the two-launch climb (``gper.ops.tree.triton_climb``); False: one launch per level
    climb: bool = True
    #: updates of fewer entries repair level by level, where the climb's chain of dependent atomics
    #: is the slower (``docs/performance.md``, *Tree repair*, has the H200's figures)
    climb_min_batch: int = 1024
    climb_block: int = 32
    climb_warps: int = 4
    add_block: int = 16
    add_warps: int = 4
    #: the most row words a sampling program holds: rows wider than ``sample_words // sample_block``
    #: (frames) take fewer draws a program, so its rows stay in registers (:func:`sample_block`)
    sample_words: int = 8192


#: the launch shapes in force (read at every launch)
LAUNCH = LaunchConfig()


@contextlib.contextmanager
def launch_config(**shapes: int) -> Iterator[LaunchConfig]:
    """Launch with other shapes inside the block (a sweep's hook: ``benchmarks/kernel_sweep.py``).

    Graphs captured inside keep the shapes they were captured with, also after the block.

    Example::

        with gper.ops.tree.triton.launch_config(sample_block=32, sample_warps=2):
            graph = capture_graph(lambda: rb.sample(16384))
    """
    unknown = sorted(set(shapes) - {f.name for f in fields(LaunchConfig)})
    if unknown:
        raise TypeError(f"launch_config(): unknown launch shapes {unknown}")
    saved = replace(LAUNCH)
    for name, value in shapes.items():
        setattr(LAUNCH, name, int(value))
    try:
        yield LAUNCH
    finally:
        for f in fields(LaunchConfig):
            setattr(LAUNCH, f.name, getattr(saved, f.name))


def _grid(n: int, block: int) -> tuple[int]:
    return (triton.cdiv(n, block),)


_LEVEL_OFFSETS: dict[tuple[TreeLayout, torch.device], torch.Tensor] = {}


def _level_offsets(layout: TreeLayout, device: torch.device) -> torch.Tensor:
    key = (layout, device)
    if key not in _LEVEL_OFFSETS:
        _LEVEL_OFFSETS[key] = torch.tensor(layout.offsets, dtype=torch.int64, device=device)
    return _LEVEL_OFFSETS[key]


def _shape(layout: TreeLayout) -> dict[str, int]:
    """The tree's shape as the kernels' compile-time arguments: levels, arity and the arity's log2."""
    return {"DEPTH": layout.depth, "K": layout.arity, "LOG2K": layout.log2_arity}


def _draw_inputs(state: TreeState, rows: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The leading arguments of a sampling kernel, what ``triton_sample._draw_rows`` reads: the
    trees, the level offsets, the rows, the generations, the counters and the IS exponent."""
    off = _level_offsets(state.layout, state.tree.device)
    return state.tree, state.mintree, off, rows, state.gen, state.counters, beta


def _draw_args(layout: TreeLayout, mode: int, words: int) -> dict[str, int]:
    """The compile-time arguments of ``triton_sample._draw_rows`` in a sampling kernel: the tree's
    shape, Philox blocks per draw, the sampling mode and the row's words (and their power of two)."""
    return _shape(layout) | {
        "NB": rng_blocks(layout.depth),
        "MODE": mode,
        "W": words,
        "WP": triton.next_power_of_2(words),
    }


def make_claims(*, layout: TreeLayout, device: torch.device) -> torch.Tensor:
    """Claims of an update in progress: [capacity + K] int64, -1 between calls, followed by the
    climb's ``arrive`` counters (:func:`gper.ops.tree.triton_climb.arrive_counters`), 0 between calls.

    Called when a buffer is built; it also makes the level-offset table the sampling kernel
    reads, so that no host-to-device copy happens later inside a caller's graph capture.
    """
    _level_offsets(layout, device)
    n = layout.capacity + layout.arity
    claims = torch.full((n + arrive_words(layout),), -1, dtype=torch.int64, device=device)
    claims[n:] = 0
    return claims


def levels(state: TreeState, leaves: torch.Tensor, top: int, reset_claims: bool = False) -> None:
    """Recompute levels ``top`` .. 0 above ``leaves``, one launch per level (level 0 rides on
    level 1's launch); with ``reset_claims``, the first launch also resets the claims at ``leaves``."""
    tree, mintree, layout = state.tree, state.mintree, state.layout
    n = leaves.numel()
    order = list(range(top, -1, -1))
    fold_top = len(order) >= 2
    if fold_top:
        order.pop()
    for j, level in enumerate(order):
        is_top = fold_top and level == 1
        _recompute_level[_grid(n, LAUNCH.level_block)](
            tree,
            mintree,
            leaves,
            state.claims if reset_claims else leaves,
            state.counters if is_top else leaves,
            layout.offsets[level],
            layout.offsets[level + 1],
            layout.shift(level),
            n,
            layout.offsets[0],
            layout.sizes[0],
            K=layout.arity,
            BLOCK=LAUNCH.level_block,
            RESET=reset_claims and j == 0,
            TOP=is_top,
            num_warps=LAUNCH.level_warps,
        )
    if reset_claims and not order:
        _reset_claims[_grid(n, LAUNCH.update_block)](state.claims, leaves, n, BLOCK=LAUNCH.update_block)


def recompute(*, state: TreeState, leaves: torch.Tensor) -> None:
    """Every ancestor of ``leaves`` recomputed: the count pass and the climb (with the claim
    buffer's counters), or with ``LAUNCH.climb`` off one launch per level."""
    layout = state.layout
    if not LAUNCH.climb or layout.depth < 2:
        levels(state, leaves, layout.depth - 2)
        return
    n, off = leaves.numel(), _level_offsets(layout, state.tree.device)
    arrive = arrive_counters(state.claims, layout)
    grid, block = _grid(n, LAUNCH.climb_block), LAUNCH.climb_block
    _count_leaves[grid](arrive, off, leaves, n, DEPTH=layout.depth, LOG2K=layout.log2_arity, BLOCK=block)
    _climb_leaves[grid](
        state.tree,
        state.mintree,
        arrive,
        off,
        leaves,
        n,
        **_shape(layout),
        BLOCK=block,
        num_warps=LAUNCH.climb_warps,
    )


def rebuild(*, state: TreeState) -> None:
    # a dense O(capacity) pass, never on a hot path: the torch twin's runs on CUDA tensors as well
    reference.rebuild(state=state)


def update(*, state: TreeState, idx: torch.Tensor, td: torch.Tensor, expected_gen, alpha: float, eps: float) -> None:
    _set_priorities(state, state.tree, state.mintree, idx, td, expected_gen, alpha, eps, False)


def set_keys(
    *, state: TreeState, keys: torch.Tensor, idx: torch.Tensor, td: torch.Tensor, expected_gen, eps: float
) -> None:
    _set_priorities(state, keys, keys, idx, td, expected_gen, 1.0, eps, True)


def _set_priorities(state: TreeState, tree, mintree, idx, td, expected_gen, alpha, eps, leaf_only) -> None:
    """The claim launch, then the climb or the leaf write and the levels (``leaf_only``: ``tree``
    is rank mode's flat key array, written without a repair)."""
    layout, claims = state.layout, state.claims
    b = idx.numel()
    clean = torch.empty(b, dtype=torch.int64, device=idx.device)
    has_gen = expected_gen is not None
    climb = LAUNCH.climb and not leaf_only and b >= LAUNCH.climb_min_batch
    off = _level_offsets(layout, tree.device)
    block = LAUNCH.climb_block if climb else LAUNCH.update_block
    _update_claim[_grid(b, block)](
        idx,
        td,
        expected_gen if has_gen else state.gen,
        state.gen,
        claims,
        state.counters,
        state.scalars,
        clean,
        arrive_counters(claims, layout) if climb else claims,
        off,
        float(alpha),
        float(eps),
        b,
        HAS_GEN=has_gen,
        COUNT=climb and layout.depth >= 2,
        DEPTH=layout.depth,
        LOG2K=layout.log2_arity,
        BLOCK=block,
    )
    if climb:
        _update_apply[_grid(b, block)](
            tree,
            mintree,
            claims,
            arrive_counters(claims, layout),
            state.scalars,
            clean,
            off,
            layout.leaf_offset,
            b,
            **_shape(layout),
            BLOCK=block,
            num_warps=LAUNCH.climb_warps,
        )
        return
    parent = not leaf_only and layout.depth >= 2
    _update_leaves[_grid(b, LAUNCH.level_block)](
        tree,
        mintree,
        claims,
        state.scalars,
        clean,
        0 if leaf_only else layout.leaf_offset,
        layout.offsets[layout.depth - 2] if parent else 0,
        b,
        K=layout.arity,
        LOG2K=layout.log2_arity,
        PARENT=parent,
        WITH_MIN=not leaf_only,
        BLOCK=LAUNCH.level_block,
        num_warps=LAUNCH.level_warps,
    )
    if parent:
        levels(state, clean, layout.depth - 3, reset_claims=True)
    else:
        _reset_claims[_grid(b, LAUNCH.update_block)](claims, clean, b, BLOCK=LAUNCH.update_block)


def add_positions(*, state: TreeState, n: int, skip: int) -> torch.Tensor:
    pos = torch.empty(n, dtype=torch.int64, device=state.counters.device)
    block = LAUNCH.update_block
    _add_positions[_grid(n, block)](state.counters, pos, n, skip, state.layout.capacity, BLOCK=block)
    return pos


def add_commit(*, state: TreeState, pos: torch.Tensor, total: int, leaf_value: float | None) -> None:
    n = pos.numel()
    _add_commit[_grid(n, LAUNCH.update_block)](
        state.tree,
        state.mintree,
        state.gen,
        state.counters,
        state.scalars,
        pos,
        state.layout.leaf_offset,
        n,
        total,
        state.layout.capacity,
        0.0 if leaf_value is None else float(leaf_value),
        USE_MAX=leaf_value is None,
        BLOCK=LAUNCH.update_block,
    )
    recompute(state=state, leaves=pos)


#: the most fields a row may have for the add kernel to write them itself
MAX_ADD_SOURCES = 6
#: the widest field it writes (as a [add_block, width] tile of int32 words, or of bytes for a field
#: read by bytes); wider ones (images, frame stacks) are copied field by field
MAX_ADD_WIDTH = 512


def make_add_plan(*, fields, words, device) -> tuple | None:
    """How the add kernel writes rows of ``fields`` (``(byte offset, bytes)`` each): per field
    ``(offset, bytes, power of two, by bytes)``, where a field that is not whole words (a bool,
    three float16) moves byte by byte. None where the kernel cannot write them (more than
    :data:`MAX_ADD_SOURCES` fields): then ``add_rows`` copies field by field."""
    if len(fields) > MAX_ADD_SOURCES:
        return None
    plan = []
    for offset, nbytes in fields:
        by_bytes = offset % 4 != 0 or nbytes % 4 != 0
        width = triton.next_power_of_2(nbytes if by_bytes else nbytes // 4)
        if width > MAX_ADD_WIDTH:
            return None
        plan.append((offset, nbytes, width, by_bytes))
    return tuple(plan)


def _add_sources(values, plan, n: int) -> list[torch.Tensor]:
    """Each value as the add kernel reads it (int32 words, or bytes), padded to MAX_ADD_SOURCES."""
    srcs = []
    for x, (_, _, _, by_bytes) in zip(values, plan, strict=True):
        flat = x.contiguous().reshape(n, -1)
        if flat.dtype == torch.bool:
            flat = flat.view(torch.uint8)
        if not by_bytes and flat.storage_offset() * flat.element_size() % 4:
            flat = flat.clone()  # a view that starts inside a word (a slice of bytes) reads as words once copied
        srcs.append(flat.view(torch.uint8 if by_bytes else torch.int32))
    return srcs + [srcs[0]] * (MAX_ADD_SOURCES - len(srcs))


def add_rows(
    *, state: TreeState, rows: torch.Tensor, fields, values, plan, skip: int, total: int, leaf_value: float | None
) -> torch.Tensor:
    """As the reference's; with a plan (and the climb on), the whole add is one launch."""
    n, layout = values[0].shape[0], state.layout
    if plan is None or not LAUNCH.climb:
        pos = add_positions(state=state, n=n, skip=skip)
        reference.write_fields(rows, fields, values, pos)
        add_commit(state=state, pos=pos, total=total, leaf_value=leaf_value)
        return pos
    specs = list(plan) + [None] * (MAX_ADD_SOURCES - len(plan))
    pos = torch.empty(n, dtype=torch.int64, device=rows.device)
    _add_write[_grid(n, LAUNCH.add_block)](
        state.tree,
        state.mintree,
        state.gen,
        state.counters,
        state.scalars,
        rows,
        rows.view(torch.uint8),
        pos,
        *_add_sources(values, plan, n),
        layout.leaf_offset,
        n,
        skip,
        layout.capacity,
        0.0 if leaf_value is None else float(leaf_value),
        F0=specs[0],
        F1=specs[1],
        F2=specs[2],
        F3=specs[3],
        F4=specs[4],
        F5=specs[5],
        W=rows.shape[1],
        USE_MAX=leaf_value is None,
        BLOCK=LAUNCH.add_block,
        num_warps=LAUNCH.add_warps,
    )
    # one lane per leaf parent of the range: at most n / K + 2 of them (its two ends, and a wrap)
    _add_repair[_grid(n // layout.arity + 3, LAUNCH.climb_block)](
        state.tree,
        state.mintree,
        state.counters,
        arrive_counters(state.claims, layout),
        _level_offsets(layout, state.tree.device),
        n,
        skip,
        total,
        layout.capacity,
        **_shape(layout),
        BLOCK=LAUNCH.climb_block,
        num_warps=LAUNCH.climb_warps,
    )
    return pos


def sample_block(words: int) -> int:
    """Draws a sampling program takes for rows of ``words`` words: ``LAUNCH.sample_block``, or the
    largest power of two whose rows fit in ``LAUNCH.sample_words`` (at least 1). The draws do not
    depend on it: each draw's random numbers come from its own index."""
    fit = max(1, LAUNCH.sample_words // triton.next_power_of_2(words))
    return min(LAUNCH.sample_block, 1 << (fit.bit_length() - 1))


def sample(*, state: TreeState, rows: torch.Tensor, seed: int, mode: int, beta: torch.Tensor, out: SampleOut) -> None:
    b = out.idx.numel()
    block = sample_block(rows.shape[1])
    _sample_kernel[_grid(b, block)](
        *_draw_inputs(state, rows, beta),
        *out,  # rows, idx, gen, w
        seed,
        b,
        **_draw_args(state.layout, mode, rows.shape[1]),
        BLOCK=block,
        num_warps=LAUNCH.sample_warps,
    )


# several instances in one set of launches (their module imports this one's launch shapes)
from gper.ops.tree.triton_instances import (  # noqa: E402, F401
    add_rows_instances,
    sample_instances,
    update_instances,
)
