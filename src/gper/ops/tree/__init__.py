"""The priority tree's kernels: the contract every back end implements, and its back ends.

* :mod:`~gper.ops.tree.reference`: vectorized PyTorch on any device, the semantics;
* :mod:`~gper.ops.tree.cpu`: the same operations on NumPy views of CPU tensors (the torch back
  end there; its loops in :mod:`~gper.ops.tree.cpu_jit` or :mod:`~gper.ops.tree.cpu_numpy`);
* :mod:`~gper.ops.tree.triton`: the Triton launchers (the fast path on CUDA; CPU tensors under
  ``TRITON_INTERPRET=1``), their kernels in ``triton_sample``, ``triton_update`` and ``triton_climb``.

Every kernel that touches a tree takes its :class:`~gper.ops.state.TreeState` as ``state``, then
the arguments of its own, all by keyword.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import SampleOut, TreeState


class ReplayKernels(Protocol):
    """The functions every tree back end provides, with these parameter names (keyword-only).

    ``state`` holds the tree's tensors (:class:`~gper.ops.state.TreeState`); ``rows`` is the
    [capacity, W] int32 packed storage. :mod:`gper.ops.tree.reference` documents the semantics.
    """

    def make_claims(self, *, layout: TreeLayout, device: torch.device) -> torch.Tensor:
        """The update's claim buffer, all -1 between calls (its shape is the back end's own)."""

    def make_add_plan(self, *, fields: tuple[tuple[int, int], ...], words: int, device: torch.device) -> object:
        """What ``add_rows`` needs for rows of ``fields`` (``(byte offset, bytes)`` each), made once."""

    def add_rows(
        self,
        *,
        state: TreeState,
        rows: torch.Tensor,
        fields: tuple[tuple[int, int], ...],
        values: tuple[torch.Tensor, ...],
        plan: object,
        skip: int,
        total: int,
        leaf_value: float | None,
    ) -> torch.Tensor:
        """The whole add: rows written at the next slots, which enter at their priority; returns the slots."""

    def add_positions(self, *, state: TreeState, n: int, skip: int) -> torch.Tensor:
        """[n] int64 slots for new items, from the device cursor."""

    def add_commit(self, *, state: TreeState, pos: torch.Tensor, total: int, leaf_value: float | None) -> None:
        """New slots get their priority and a new generation; cursor and size advance."""

    def update(
        self,
        *,
        state: TreeState,
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
        state: TreeState,
        keys: torch.Tensor,
        idx: torch.Tensor,
        td: torch.Tensor,
        expected_gen: torch.Tensor | None,
        eps: float,
    ) -> None:
        """Rank mode: sort keys from TD errors into a flat key array (no tree repair)."""

    def recompute(self, *, state: TreeState, leaves: torch.Tensor) -> None:
        """Every ancestor of ``leaves`` recomputed from its children, bottom up."""

    def rebuild(self, *, state: TreeState) -> None:
        """Every inner node recomputed from the leaves (dense, O(capacity))."""

    def sample(
        self, *, state: TreeState, rows: torch.Tensor, seed: int, mode: int, beta: torch.Tensor, out: SampleOut
    ) -> None:
        """``len(out.idx)`` draws into ``out``: slots, their rows and generations, IS weights; the RNG
        counter advances."""


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
