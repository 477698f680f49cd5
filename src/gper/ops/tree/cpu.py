"""The torch back end on CPU tensors: the reference's sampling and priority updates, on NumPy views.

A CPU buffer's PER step is a few hundred operations on arrays of a few hundred entries, where
each torch call costs several microseconds of dispatch. So on the CPU, :func:`sample`,
:func:`update`, :func:`set_keys` and :func:`recompute` run the operations of
:mod:`gper.ops.tree.reference`, in the same order and on the same IEEE values, on NumPy views of the
same tensors (``Tensor.numpy()`` shares their memory), and return the same bits: float64 prefix
sums accumulate left to right, and products, quotients, compares, min and max round the same way
in every library. Where the bits depend on torch's own kernels, torch computes them on the same
values, laid out the same way: ``pow`` (its vectorised and scalar loops may differ in the last
place) and the float32 sum of a node's children (a vectorised sum whose order follows the CPU's
vector width).

The loops run compiled (:mod:`gper.ops.tree.cpu_jit`, a pass over the batch each) when numba is
installed (``pip install ".[cpu]"``), else as NumPy calls (:mod:`gper.ops.tree.cpu_numpy`, a few
per tree level); :func:`set_loops` (or the environment variable ``GPER_CPU_LOOPS``: ``auto``,
``numba``, ``numpy``) chooses. ``tests/ops/test_cpu_vs_reference.py`` checks both bit for bit
against the reference on random trees, arities, batches, duplicates, stale and invalid entries,
NaN and infinite TD errors and every sampling mode. The other kernels are the reference's own.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from types import ModuleType

import numpy as np
import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import (
    C_INVALID,
    C_NONFINITE,
    C_RNG,
    C_SIZE,
    C_STALE,
    MODE_STRATIFIED,
    MODE_UNIFORM,
    S_MAXP,
    SampleOut,
    TreeState,
    rng_blocks,
)
from gper.ops.tree import cpu_numpy, reference
from gper.ops.tree.cpu_numpy import F32_P_MAX
from gper.ops.tree.reference import add_commit, add_positions, add_rows, make_add_plan, make_claims, rebuild

__all__ = [
    "add_commit",
    "add_positions",
    "add_rows",
    "make_add_plan",
    "make_claims",
    "rebuild",
    "recompute",
    "sample",
    "set_keys",
    "update",
]

LOOPS = ("auto", "numba", "numpy")
_loops = {"request": os.environ.get("GPER_CPU_LOOPS", "auto"), "module": None}


def set_loops(request: str) -> None:
    """Run the CPU back end's loops compiled (``numba``: raises ImportError without numba), as
    NumPy calls (``numpy``), or compiled when numba is installed (``auto``, the default)."""
    if request not in LOOPS:
        raise ValueError(f"CPU loops must be one of {LOOPS}, got {request!r}")
    _loops.update(request=request, module=None)


def compiled() -> ModuleType | None:
    """:mod:`gper.ops.tree.cpu_jit` when the loops run compiled, else None (imported on first use)."""
    if _loops["module"] is None:
        request = _loops["request"]
        if request not in LOOPS:
            raise ValueError(f"GPER_CPU_LOOPS must be one of {LOOPS}, got {request!r}")
        module = False
        if request != "numpy":
            try:
                module = importlib.import_module("gper.ops.tree.cpu_jit")
            except ImportError as err:
                if request == "numba":
                    raise ImportError('the CPU back end\'s compiled loops need numba: pip install ".[cpu]"') from err
        _loops["module"] = module
    return _loops["module"] or None


def describe() -> str:
    """How the loops run, for reports: ``numba 0.68.1 loops`` or ``NumPy loops``."""
    jit = compiled()
    return f"numba {jit.numba.__version__} loops" if jit is not None else "NumPy loops"


@functools.lru_cache(maxsize=64)
def _offsets(layout: TreeLayout) -> np.ndarray:
    out = np.array(layout.offsets, dtype=np.int64)
    out.flags.writeable = False
    return out


def sample(*, state: TreeState, rows: torch.Tensor, seed: int, mode: int, beta: torch.Tensor, out: SampleOut) -> None:
    """:func:`gper.ops.tree.reference.sample` (same arguments, same results) on CPU tensors."""
    out_rows, out_idx, out_gen, out_w = out
    b = out_idx.numel()
    layout = state.layout
    with np.errstate(all="ignore"):  # inf * 0 and the like: NaN, as in torch, without a warning
        c = state.counters.numpy()
        top = layout.offsets[0]
        pmin = state.mintree.numpy()[top : top + layout.arity].min()  # exact, NaN first, as amin
        jit = compiled()
        if jit is not None and mode != MODE_UNIFORM:
            node = out_idx.numpy()
            _descend_compiled(jit, state.tree.numpy(), layout, c, seed, mode, pmin, node, beta, out_w)
        else:
            node, leaf = _draw(state.tree.numpy(), layout, c, seed, b, mode)
            out_idx.numpy()[:] = node
            out_w.numpy()[:] = np.float32(1.0) if mode == MODE_UNIFORM else is_weights(leaf, pmin, beta)
        # every draw is a filled slot (the descent keeps inside them, uniform draws are below size):
        # "clip" only spares take its bounds check, which makes it copy through a buffer
        rows.numpy().take(node, axis=0, out=out_rows.numpy(), mode="clip")
        state.gen.numpy().take(node, out=out_gen.numpy(), mode="clip")
        c[C_RNG] += b * rng_blocks(layout.depth)


@functools.lru_cache(maxsize=16)
def _exponent(beta: float) -> torch.Tensor:
    """``-beta`` as the 0-d float32 tensor the reference raises the ratios to (never written)."""
    return torch.tensor(-beta, dtype=torch.float32)


def _clamped(beta: torch.Tensor) -> float:
    """The reference's beta: clamped to [0, 1], NaN read as 1."""
    b = float(beta)
    return 1.0 if math.isnan(b) else min(max(b, 0.0), 1.0)


def is_weights(leaf: np.ndarray, pmin: np.float32, beta: torch.Tensor) -> np.ndarray:
    """:func:`gper.ops.tree.reference.is_weights` for a float32 array of leaves and the smallest priority."""
    ratio = leaf / pmin
    if np.isinf(ratio).any():  # the logarithms' branch: the reference's own operations
        return reference.is_weights(torch.from_numpy(leaf), torch.tensor(pmin), beta).numpy()
    # a 0-d float32 tensor exponent, as the reference's (a Python float would take pow's scalar paths)
    return torch.from_numpy(ratio).pow(_exponent(_clamped(beta))).numpy()


@functools.lru_cache(maxsize=8)
def torch_sum_lanes(jit: ModuleType, k: int) -> int:
    """The vector width (in floats) of torch's CPU ``sum`` of a contiguous row of ``k`` float32 on
    this machine, if :func:`gper.ops.tree.cpu_jit.row_sum` of that width gives torch's bits on rows
    whose sums depend on the order of addition (values of random signs over 40 binades); 0 if no
    width does (then torch sums each level's rows itself)."""
    g = np.random.default_rng(12345)
    rows = g.standard_normal((2048, k)) * np.exp2(g.integers(-20, 20, (2048, k)))
    rows = rows.astype(np.float32)
    rows[::5] = np.abs(rows[::5])  # rows of one sign too
    want = torch.from_numpy(rows).sum(1).numpy().view(np.uint32)
    got = np.empty(len(rows), dtype=np.float32)
    for lanes in (8, 16, 4, 32):
        jit.row_sums(rows, lanes, got)
        if np.array_equal(got.view(np.uint32), want):
            return lanes
    return 0


def _descend_compiled(jit, tree, layout, c, seed, mode, pmin, node, beta, out_w) -> None:
    """The draws into ``node`` (the slots' output) and their IS weights into ``out_w``, compiled."""
    b = node.size
    leaf = np.empty(b, dtype=np.float32)
    ratio = np.empty(b, dtype=np.float32)
    last = max(int(c[C_SIZE]) - 1, 0)
    bounds = np.array([last >> layout.shift(level) for level in range(layout.depth)], dtype=np.int64)
    key = seed & 0xFFFFFFFFFFFFFFFF
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    args = (tree, _offsets(layout), bounds, layout.arity, layout.depth, mode == MODE_STRATIFIED, k0, k1)
    finite = jit.descend(*args, int(c[C_RNG]), rng_blocks(layout.depth), pmin, node, leaf, ratio)
    if finite:  # ratio ** -beta, torch's pow writing the weights' output
        torch.pow(torch.from_numpy(ratio), _exponent(_clamped(beta)), out=out_w)
    else:  # the logarithms' branch: the reference's own operations
        out_w.copy_(reference.is_weights(torch.from_numpy(leaf), torch.tensor(pmin), beta))


def _draw(tree: np.ndarray, layout: TreeLayout, c: np.ndarray, seed: int, b: int, mode: int):
    """(slots [B] int64, their leaves [B] float32, or None in uniform mode) of the next ``b`` draws, in NumPy."""
    n_blocks = rng_blocks(layout.depth)
    size, rng = int(c[C_SIZE]), int(c[C_RNG])
    n_words = 2 if mode == MODE_UNIFORM else layout.depth + (mode == MODE_STRATIFIED)
    words = cpu_numpy.random_words(seed, rng, b, n_blocks, n_words)
    if mode == MODE_UNIFORM:
        return cpu_numpy.uniform(words, size), None
    descent = cpu_numpy.descend_stratified if mode == MODE_STRATIFIED else cpu_numpy.descend
    return descent(tree, layout, words, size)


def recompute(*, state: TreeState, leaves: torch.Tensor) -> None:
    """:func:`gper.ops.tree.reference.recompute` (same arguments, same trees) on CPU tensors."""
    with np.errstate(all="ignore"):
        cpu_numpy.recompute(state.tree.numpy(), state.mintree.numpy(), state.layout, leaves.numpy())


def update(
    *,
    state: TreeState,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    alpha: float,
    eps: float,
) -> None:
    """:func:`gper.ops.tree.reference.update` (same arguments, same results) on CPU tensors."""
    _set_priorities(state, state.tree, state.mintree, idx, td, expected_gen, alpha, eps)


def set_keys(
    *,
    state: TreeState,
    keys: torch.Tensor,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    eps: float,
) -> None:
    """:func:`gper.ops.tree.reference.set_keys` (same arguments, same results) on CPU tensors."""
    _set_priorities(state, keys, None, idx, td, expected_gen, 1.0, eps)


def _set_priorities(state: TreeState, tree, mintree, idx, td, expected_gen, alpha, eps) -> None:
    # mintree None: ``tree`` is rank mode's flat key array
    arrays = (tree.numpy(), None if mintree is None else mintree.numpy(), state.layout, state.claims.numpy())
    arrays += (
        state.gen.numpy(),
        state.counters.numpy(),
        state.scalars.numpy(),
        idx.detach().numpy().astype(np.int64, copy=False),
    )
    arrays += ((td if td.dtype == torch.float32 else td.float()).detach().numpy(),)
    arrays += (None if expected_gen is None else expected_gen.numpy(), alpha, eps)
    with np.errstate(all="ignore"):
        jit = compiled()
        if jit is None:
            cpu_numpy.set_priorities(*arrays)
        else:
            _set_priorities_compiled(jit, *arrays)


def _set_priorities_compiled(jit, tree, mintree, layout, claims, gen, c, sc, idx, td, expected, alpha, eps):
    """:func:`gper.ops.tree.cpu_numpy.set_priorities` with the loops of :mod:`gper.ops.tree.cpu_jit`."""
    b = idx.size
    shifted = np.empty(b, dtype=np.float32)
    valid = np.empty(b, dtype=np.bool_)
    finite = np.empty(b, dtype=np.bool_)
    counts = np.zeros(3, dtype=np.int64)
    check = expected is not None
    jit.check_update(
        idx,
        gen,
        expected if check else gen[:0],
        check,
        int(c[C_SIZE]),
        td,
        F32_P_MAX,
        np.float32(eps),
        shifted,
        valid,
        finite,
        counts,
    )
    powered = torch.from_numpy(shifted).pow(alpha).numpy()  # torch's pow, on the reference's values
    p = np.empty(b, dtype=np.float32)
    base = 0 if mintree is None else layout.leaf_offset
    keys_only = mintree is None
    sc[S_MAXP] = jit.write_priorities(
        tree,
        tree if keys_only else mintree,
        keys_only,
        claims,
        idx,
        valid,
        finite,
        powered,
        F32_P_MAX,
        sc[S_MAXP],
        base,
        layout.capacity,
        p,
    )
    c[C_INVALID] += counts[0]
    c[C_STALE] += counts[1]
    c[C_NONFINITE] += counts[2]
    if not keys_only:
        _repair_compiled(jit, tree, mintree, layout, idx, valid)


def _repair_compiled(jit, tree, mintree, layout, idx, valid) -> None:
    """The trees above the ``valid`` leaves ``idx`` recomputed with the loops of :mod:`gper.ops.tree.cpu_jit`."""
    b = idx.size
    lanes = torch_sum_lanes(jit, layout.arity)
    if lanes:  # the whole repair in one pass, each sum in torch's order
        sizes = np.array(layout.sizes, dtype=np.int64)
        jit.repair(
            tree,
            mintree,
            idx,
            valid,
            _offsets(layout),
            sizes,
            layout.arity,
            layout.log2_arity,
            lanes,
            np.empty(b, dtype=np.int64),
        )
        return
    parents = np.empty(b, dtype=np.int64)
    rows = np.empty((b, layout.arity), dtype=np.float32)
    for level in range(layout.depth - 2, -1, -1):
        # many leaves share an ancestor near the top: each node once there (the same values, fewer rows)
        dedupe = layout.sizes[level] <= 4 * b
        lo, lo_up = layout.offsets[level + 1], layout.offsets[level]
        n = jit.gather_children(
            tree,
            mintree,
            idx,
            valid,
            layout.shift(level),
            layout.sizes[level],
            dedupe,
            lo,
            lo_up,
            layout.arity,
            parents,
            rows,
        )
        tree[lo_up + parents[:n]] = torch.from_numpy(rows[:n]).sum(1).numpy()  # torch's float32 sum
