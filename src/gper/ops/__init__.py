"""Replay kernels: a Triton back end and a vectorized PyTorch reference with the same functions.

``reference`` works on any device and is the semantics; ``cpu`` runs the same operations on
NumPy views of CPU tensors (the torch back end there); ``triton_ops`` is the fast path on CUDA
(and runs on CPU tensors under ``TRITON_INTERPRET=1``). :func:`backend_module` picks one. Both
implement :class:`ReplayKernels`, the one contract callers use, always by keyword.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Protocol

import torch

from gper.ops.layout import TreeLayout

BACKENDS = ("auto", "triton", "torch")


class ReplayKernels(Protocol):
    """The functions every back end provides, with these parameter names (keyword-only).

    The shared tensors (see :mod:`gper.ops.state` for the slots of ``counters`` and ``scalars``):

    * ``tree`` / ``mintree``: flat float32 sum and min trees of ``layout`` plus one trash cell;
    * ``gen``: [capacity] int32 slot generations; ``claims``: from :meth:`make_claims`;
    * ``counters``: int64 device counters; ``scalars``: float32 device scalars;
    * ``rows``: [capacity, W] int32 packed storage rows.

    :mod:`gper.ops.reference` documents the semantics of each function.
    """

    def make_claims(self, *, layout: TreeLayout, device: torch.device) -> torch.Tensor:
        """The update's claim buffer, all -1 between calls (its shape is the back end's own)."""

    def make_add_plan(self, *, fields: tuple[tuple[int, int], ...], words: int, device: torch.device) -> object:
        """What ``add_rows`` needs for rows of ``fields`` (``(byte offset, bytes)`` each), made once."""

    def add_rows(
        self,
        *,
        tree: torch.Tensor,
        mintree: torch.Tensor,
        layout: TreeLayout,
        claims: torch.Tensor,
        gen: torch.Tensor,
        counters: torch.Tensor,
        scalars: torch.Tensor,
        rows: torch.Tensor,
        fields: tuple[tuple[int, int], ...],
        values: tuple[torch.Tensor, ...],
        plan: object,
        skip: int,
        total: int,
        leaf_value: float | None,
    ) -> torch.Tensor:
        """The whole add: rows written at the next slots, which enter at their priority; returns the slots."""

    def add_positions(self, *, counters: torch.Tensor, capacity: int, n: int, skip: int) -> torch.Tensor:
        """[n] int64 slots for new items, from the device cursor."""

    def add_commit(
        self,
        *,
        tree: torch.Tensor,
        mintree: torch.Tensor,
        layout: TreeLayout,
        gen: torch.Tensor,
        counters: torch.Tensor,
        scalars: torch.Tensor,
        pos: torch.Tensor,
        total: int,
        leaf_value: float | None,
        claims: torch.Tensor | None = None,
    ) -> None:
        """New slots get their priority and a new generation; cursor and size advance (``claims``:
        scratch a back end may repair the trees with)."""

    def update(
        self,
        *,
        tree: torch.Tensor,
        mintree: torch.Tensor,
        layout: TreeLayout,
        claims: torch.Tensor,
        gen: torch.Tensor,
        counters: torch.Tensor,
        scalars: torch.Tensor,
        idx: torch.Tensor,
        td: torch.Tensor,
        expected_gen: torch.Tensor | None,
        alpha: float,
        eps: float,
    ) -> None:
        """Priorities from TD errors, last occurrence wins, trees repaired."""

    def set_keys(
        self,
        *,
        keys: torch.Tensor,
        layout: TreeLayout,
        claims: torch.Tensor,
        gen: torch.Tensor,
        counters: torch.Tensor,
        scalars: torch.Tensor,
        idx: torch.Tensor,
        td: torch.Tensor,
        expected_gen: torch.Tensor | None,
        eps: float,
    ) -> None:
        """Rank mode: sort keys from TD errors into a flat key array (no tree repair)."""

    def recompute(
        self,
        *,
        tree: torch.Tensor,
        mintree: torch.Tensor,
        layout: TreeLayout,
        leaves: torch.Tensor,
        counters: torch.Tensor,
        claims: torch.Tensor | None = None,
    ) -> None:
        """Every ancestor of ``leaves`` recomputed from its children, bottom up (``claims``: as in ``add_commit``)."""

    def rebuild(self, *, tree: torch.Tensor, mintree: torch.Tensor, layout: TreeLayout) -> None:
        """Every inner node recomputed from the leaves (dense, O(capacity))."""

    def sample(
        self,
        *,
        tree: torch.Tensor,
        mintree: torch.Tensor,
        layout: TreeLayout,
        rows: torch.Tensor,
        gen: torch.Tensor,
        counters: torch.Tensor,
        seed: int,
        b: int,
        mode: int,
        beta: torch.Tensor,
        out_rows: torch.Tensor,
        out_idx: torch.Tensor,
        out_gen: torch.Tensor,
        out_w: torch.Tensor,
    ) -> None:
        """``b`` draws: slots, their rows and generations, IS weights; the RNG counter advances."""


#: the functions of :class:`ReplayKernels`
CONTRACT = (
    "make_claims",
    "make_add_plan",
    "add_rows",
    "add_positions",
    "add_commit",
    "update",
    "set_keys",
    "recompute",
    "rebuild",
    "sample",
)


def select_backend(request: str | ModuleType, device: torch.device) -> tuple[str, ReplayKernels]:
    """The back end's name and kernels for ``request`` on ``device``.

    ``auto`` is Triton on CUDA (when installed), torch elsewhere; ``triton`` also runs on CPU
    tensors under ``TRITON_INTERPRET=1``. A module (kernel experiments) is used as it is.
    """
    if not isinstance(request, str):
        missing = [name for name in CONTRACT if not callable(getattr(request, name, None))]
        if missing:
            raise TypeError(f"backend {request!r} lacks the kernels {missing} of gper.ops.ReplayKernels")
        return getattr(request, "__name__", type(request).__name__), request
    from gper._triton import HAS_TRITON

    name = request
    if request == "auto":
        name = "triton" if HAS_TRITON and device.type == "cuda" else "torch"
    elif request == "triton":
        if not HAS_TRITON:
            raise ImportError("backend='triton' needs the triton package: pip install \".[triton]\"")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend='triton' runs on CUDA (or on CPU under TRITON_INTERPRET=1), not {device}")
    return name, backend_module(name, device)


def backend_module(name: str, device: torch.device | None = None) -> ModuleType:
    """The module that implements back end ``name`` ("triton" or "torch") on ``device``.

    The torch back end is :mod:`gper.ops.reference`, and on the CPU :mod:`gper.ops.cpu`, the same
    kernels on NumPy views of the tensors (bit for bit the reference's results, faster there)."""
    if name == "torch":
        if device is not None and torch.device(device).type == "cpu":
            from gper.ops import cpu

            return cpu
        from gper.ops import reference

        return reference
    if name == "triton":
        from gper.ops import triton_ops

        return triton_ops
    raise ValueError(f"backend must be one of {BACKENDS[1:]}, got {name!r}")


def trajectory_module(name: str) -> ModuleType:
    """The trajectory buffer's kernels of back end ``name`` ("triton" or "torch"): the functions
    of :mod:`gper.ops.trajectory_reference` (``stream_add``, ``sample_transitions``,
    ``gather_sequences``), with the same signatures."""
    if name == "torch":
        from gper.ops import trajectory_reference

        return trajectory_reference
    if name == "triton":
        from gper.ops import trajectory_triton

        return trajectory_triton
    raise ValueError(f"backend must be one of {BACKENDS[1:]}, got {name!r}")


def her_module(name: str) -> ModuleType:
    """Hindsight relabelling's kernels of back end ``name`` ("triton" or "torch"): the functions of
    :mod:`gper.ops.her_reference` (``episode_index_add``, ``her_pick``, ``her_finish``), with the
    same signatures."""
    if name == "torch":
        from gper.ops import her_reference

        return her_reference
    if name == "triton":
        from gper.ops import her_triton

        return her_triton
    raise ValueError(f"backend must be one of {BACKENDS[1:]}, got {name!r}")


def shard_module(name: str) -> ModuleType:
    """A sharded buffer's exact-mode kernels of back end ``name`` ("triton" or "torch"): the
    functions of :mod:`gper.ops.shard_reference` (``shared_draws``, ``pack_rows``, ``unpack_rows``,
    ``pack_updates``, ``unpack_updates``), with the same signatures."""
    if name == "torch":
        from gper.ops import shard_reference

        return shard_reference
    if name == "triton":
        from gper.ops import shard_triton

        return shard_triton
    raise ValueError(f"backend must be one of {BACKENDS[1:]}, got {name!r}")
