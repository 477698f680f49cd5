"""Sampling policies: how draws are made, how IS weights are normalised, and what a priority is.

Four modes, one place:

* ``proportional``: independent draws, ``P(i) = p_i / sum(p)`` (Schaul et al. 2016, eq. 1);
* ``stratified``: one draw in each of B equal-mass segments (the PER paper's variant);
* ``uniform``: every filled slot equally likely, IS weights 1;
* ``rank``: ``P(i) ∝ rank(i) ** -alpha``, ranks by ``|td| + eps``. The tree then holds the rank
  weights: updates write sort keys only (:class:`RankKeys`), and the keys are re-sorted into the
  tree every ``refresh_interval`` updates (an O(N log N) argsort); in between ranks are stale,
  as in the paper, and new items count as rank 1.

Weights are ``w_i = (N P(i)) ** -beta`` divided by the largest possible weight (``global``: the
one of the smallest stored priority, as in the paper) or by the batch's largest (``batch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gper.ops.state import MODE_PROPORTIONAL, MODE_STRATIFIED, MODE_UNIFORM, S_MAXP
from gper.ops.tree import reference
from gper.replay.checks import check_beta_tensor, check_unit
from gper.replay.tree import PriorityTree

SAMPLING = ("proportional", "stratified", "rank", "uniform")
#: below this largest global weight in a batch, batch normalisation recomputes from the priorities
_TINY_WEIGHT = 2.0**-24
WEIGHT_NORMS = ("global", "batch")
_KERNEL_MODES = {
    "proportional": MODE_PROPORTIONAL,
    "stratified": MODE_STRATIFIED,
    "rank": MODE_PROPORTIONAL,
    "uniform": MODE_UNIFORM,
}


class BetaInput:
    """The IS exponent a sample reads (or another exponent in [0, 1]: the trajectory buffer's
    gamma, named ``name`` in errors), as a 0-d float32 device tensor.

    A float32 tensor of the caller's is read where it is (no copy kernel) unless the call
    replays the buffer's own graph, whose kernel reads the buffer's scalar; floats are written
    into the scalar only when they change."""

    def __init__(self, scalar: torch.Tensor, name: str = "beta") -> None:
        self.scalar = scalar
        self.name = name
        self._written: float | None = None

    def tensor(self, beta: float | torch.Tensor, graphed: bool, checked: bool = False) -> torch.Tensor:
        """The tensor for ``beta`` (a float in [0, 1] or a 0-d float device tensor); ``checked``:
        a float already known to be valid (the buffer's default)."""
        if isinstance(beta, torch.Tensor):
            check_beta_tensor(beta, self.scalar.device, self.name)
            if beta.requires_grad:  # nor may a beta that requires grad pull the buffer into autograd
                beta = beta.detach()
            if beta.dtype == torch.float32 and not graphed:
                return beta
            # clamped as the kernels clamp it (NaN reads as 1): the scalar is part of the state
            # a checkpoint holds, which a restore checks
            self.scalar.copy_(beta.clamp(0.0, 1.0).nan_to_num(1.0))
            self._written = None
            return self.scalar
        value = beta if checked else check_unit(self.name, beta)
        if value != self._written:
            self.scalar.fill_(value)
            self._written = value
        return self.scalar

    def forget(self) -> None:
        """The scalar was overwritten (a checkpoint load): write the next float again."""
        self._written = None


class RankKeys:
    """Rank mode's sort keys and their refresh schedule.

    Args:
        capacity: slots; the key array has one more entry, which takes writes that land nowhere.
        device: where the keys live.
        refresh_interval: updates between two re-sorts.
    """

    def __init__(self, capacity: int, device: torch.device, refresh_interval: int) -> None:
        self.keys = torch.zeros(capacity + 1, dtype=torch.float32, device=device)
        self.refresh_interval = refresh_interval
        self.updates_since_refresh = 0

    def on_add(self, tree: PriorityTree, positions: torch.Tensor) -> None:
        """New items get the running max priority as their key (they enter at rank weight 1)."""
        self.keys[positions] = tree.scalars[S_MAXP]

    def update(
        self, tree: PriorityTree, indices: torch.Tensor, td: torch.Tensor, expected_gen: torch.Tensor | None, eps: float
    ) -> None:
        tree.set_keys(self.keys, indices, td, expected_gen, eps)

    def count_update(self) -> bool:
        """Count one ``update_priorities`` call; True when a refresh is due."""
        self.updates_since_refresh += 1
        return self.updates_since_refresh >= self.refresh_interval

    def refresh(self, tree: PriorityTree, size: int, alpha: float) -> None:
        """Re-sort the keys of the ``size`` filled slots: the slot of rank r gets weight ``r ** -alpha``."""
        self.updates_since_refresh = 0
        if size == 0:
            return
        device = self.keys.device
        order = torch.argsort(self.keys[:size], descending=True, stable=True)
        rank = torch.empty(size, dtype=torch.float32, device=device)
        rank[order] = torch.arange(1, size + 1, dtype=torch.float32, device=device)
        tree.set_leaves(rank.pow(-alpha))


@dataclass
class SamplingPolicy:
    """One buffer's sampling mode and weight normalisation, and rank mode's keys.

    Attributes:
        mode: one of :data:`SAMPLING`.
        weight_norm: one of :data:`WEIGHT_NORMS`.
        rank: the :class:`RankKeys` in rank mode, else None.
    """

    mode: str
    weight_norm: str
    rank: RankKeys | None = None

    @staticmethod
    def build(
        mode: str, weight_norm: str, capacity: int, device: torch.device, refresh_interval: int
    ) -> SamplingPolicy:
        rank = RankKeys(capacity, device, refresh_interval) if mode == "rank" else None
        return SamplingPolicy(mode, weight_norm, rank)

    @property
    def kernel_mode(self) -> int:
        """The mode the sampling kernel runs (rank mode draws proportionally to rank weights)."""
        return _KERNEL_MODES[self.mode]

    @property
    def new_item_value(self) -> float | None:
        """The tree value of a new item: None (the running max priority), or 1 in rank mode (rank 1)."""
        return 1.0 if self.rank is not None else None

    def configure(self, weight_norm: str, refresh_interval: int) -> None:
        """Settings changed on the buffer after construction."""
        self.weight_norm = weight_norm
        if self.rank is not None:
            self.rank.refresh_interval = refresh_interval

    @property
    def updates_since_refresh(self) -> int:
        return self.rank.updates_since_refresh if self.rank is not None else 0

    @updates_since_refresh.setter
    def updates_since_refresh(self, value: int) -> None:
        if self.rank is not None:
            self.rank.updates_since_refresh = value

    def count_update(self) -> bool:
        """Count one ``update_priorities`` call; True when rank mode's refresh is due."""
        return self.rank is not None and self.rank.count_update()

    def on_add(self, tree: PriorityTree, positions: torch.Tensor) -> None:
        if self.rank is not None:
            self.rank.on_add(tree, positions)

    def update(
        self,
        tree: PriorityTree,
        indices: torch.Tensor,
        td: torch.Tensor,
        expected_gen: torch.Tensor | None,
        alpha: float,
        eps: float,
    ) -> None:
        """Priorities (or, in rank mode, sort keys) of ``indices`` from TD errors; device work only."""
        if self.rank is not None:
            self.rank.update(tree, indices, td, expected_gen, eps)
        else:
            tree.update(indices, td, expected_gen, alpha, eps)

    def normalise(self, out: Mapping[str, torch.Tensor], tree: PriorityTree, beta: torch.Tensor) -> None:
        """``batch`` normalisation of a sample's weights, in place (the kernel normalised globally)."""
        if self.weight_norm == "batch" and self.mode != "uniform":
            # w_i / max_j w_j = (p_i / min_j p_j) ** -beta over the batch. When the batch's largest
            # global weight is tiny (every draw's priority far above the smallest stored one, so
            # global weights may have rounded to 0), the same from the drawn priorities instead
            w = out["weights"]
            top = w.amax()
            leaf = tree.tree[tree.layout.leaf_offset + out["indices"]]
            wide = reference.is_weights(leaf, leaf.amin(), beta)
            w.copy_(torch.where(top >= _TINY_WEIGHT, w / top, wide))

    @staticmethod
    def estimate_bytes(mode: str, capacity: int) -> int:
        """Device bytes a policy of ``mode`` holds: rank mode's keys."""
        return 4 * (capacity + 1) if mode == "rank" else 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"key": self.rank.keys} if self.rank is not None else {}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy rank mode's keys from a checked state (nothing to load in the other modes)."""
        if self.rank is not None:
            self.rank.keys.copy_(state["key"])
