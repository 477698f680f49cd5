"""The base of every sampler: what a sampling mode says to the buffers, and the registry.

A sampler is one class per mode (``proportional.py``, ``stratified.py``, ``rank.py``,
``uniform.py``). It says which kernel mode draws, the tree value new items enter at, how IS
weights are normalised, and, where the mode has them, its rank keys, their refresh and its
state. :mod:`gper.replay.samplers` registers the classes in :data:`SAMPLERS` by their ``mode``.

Weights are ``w_i = (N P(i)) ** -beta`` divided by the largest possible weight (``global``: the
one of the smallest stored priority, as in the paper) or by the batch's largest (``batch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, NamedTuple

import torch

from gper.replay.tree import PriorityTree

WEIGHT_NORMS = ("global", "batch")
#: below this largest global weight in a batch, batch normalisation recomputes from the priorities
_TINY_WEIGHT = 2.0**-24
#: name -> sampler class, filled by :mod:`gper.replay.samplers` (in the order of ``SAMPLING``)
SAMPLERS: dict[str, type[SamplingPolicy]] = {}


class PriorityUpdate(NamedTuple):
    """One ``update_priorities`` call as a sampler receives it, its inputs checked."""

    indices: torch.Tensor
    """[B] int64 slots"""
    td: torch.Tensor
    """[B] float32 TD errors"""
    expected_gen: torch.Tensor | None
    """[B] int32 generations when drawn (a stale entry is skipped), or None"""
    alpha: float
    eps: float


class SamplingPolicy:
    """One buffer's sampling mode and weight normalisation.

    Args:
        weight_norm: one of :data:`WEIGHT_NORMS`.
        capacity: the buffer's slots.
        device: where the sampler's tensors live.
        refresh_interval: updates between two refreshes (rank mode's re-sort; unused elsewhere).

    Attributes:
        mode: the sampler's registered name.
        kernel_mode: the ``MODE_*`` of :mod:`gper.ops.state` the sampling kernel runs.
        new_item_value: the tree value of a new item: None (the running max priority) or a constant.
        shardable: a sharded buffer can draw this mode (each shard's tree holds its own mass).
        rank: rank mode's keys (:class:`~gper.replay.samplers.rank.RankKeys`), else None.
    """

    mode: ClassVar[str]
    kernel_mode: ClassVar[int]
    new_item_value: ClassVar[float | None] = None
    shardable: ClassVar[bool] = True
    #: IS weights of this mode are all 1 (batch normalisation leaves them)
    unit_weights: ClassVar[bool] = False

    def __init__(self, weight_norm: str, capacity: int, device: torch.device, refresh_interval: int) -> None:
        self.weight_norm = weight_norm
        self.rank = None

    @staticmethod
    def build(
        mode: str, weight_norm: str, capacity: int, device: torch.device, refresh_interval: int
    ) -> SamplingPolicy:
        """The sampler registered as ``mode``."""
        return SAMPLERS[mode](weight_norm, capacity, device, refresh_interval)

    @staticmethod
    def estimate_bytes(mode: str, capacity: int) -> int:
        """Device bytes a sampler of ``mode`` holds for ``capacity`` slots."""
        return SAMPLERS[mode].state_bytes(capacity)

    @classmethod
    def state_bytes(cls, capacity: int) -> int:
        """Device bytes this sampler holds (none by default)."""
        return 0

    # ---------------------------------------------------------------- the trajectory buffer's starts

    @property
    def start_mode(self) -> int:
        """The kernel mode that draws a trajectory buffer's drawable starts."""
        return self.kernel_mode

    @property
    def start_value(self) -> float | None:
        """The tree value of a start that becomes drawable (None: the running max priority)."""
        return self.new_item_value

    def start_alpha(self, alpha: float) -> float:
        """The priority exponent of a trajectory buffer's updates."""
        return alpha

    # ---------------------------------------------------------------- settings and schedule

    def configure(self, weight_norm: str, refresh_interval: int) -> None:
        """Settings changed on the buffer after construction."""
        self.weight_norm = weight_norm

    @property
    def updates_since_refresh(self) -> int:
        return 0

    @updates_since_refresh.setter
    def updates_since_refresh(self, value: int) -> None:
        """Nothing to count outside rank mode."""

    def count_update(self) -> bool:
        """Count one ``update_priorities`` call; True when a refresh is due."""
        return False

    # ---------------------------------------------------------------- device work

    def on_add(self, tree: PriorityTree, positions: torch.Tensor) -> None:
        """New items were written at ``positions``."""

    def update(self, tree: PriorityTree, change: PriorityUpdate) -> None:
        """Priorities of ``change.indices`` from its TD errors; device work only."""
        tree.update(*change)

    def normalise(self, out: Mapping[str, torch.Tensor], tree: PriorityTree, beta: torch.Tensor) -> None:
        """``batch`` normalisation of a sample's weights, in place (the kernel normalised globally)."""
        if self.weight_norm == "batch" and not self.unit_weights:
            # w_i / max_j w_j = (p_i / min_j p_j) ** -beta over the batch. When the batch's largest
            # global weight is tiny (every draw's priority far above the smallest stored one, so
            # global weights may have rounded to 0), the same from the drawn priorities instead
            w = out["weights"]
            top = w.amax()
            wide = tree.batch_weights(out["indices"], beta)
            w.copy_(torch.where(top >= _TINY_WEIGHT, w / top, wide))

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy the sampler's tensors from a checked state (none by default)."""
