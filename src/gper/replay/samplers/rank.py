"""Rank sampling: ``P(i) ∝ rank(i) ** -alpha``, ranks by ``|td| + eps``.

The tree then holds the rank weights: updates write sort keys only (:class:`RankKeys`), and the
keys are re-sorted into the tree every ``refresh_interval`` updates (an O(N log N) argsort); in
between ranks are stale, as in the paper, and new items count as rank 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from gper.ops.state import MODE_PROPORTIONAL, S_MAXP
from gper.replay.samplers.base import PriorityUpdate, SamplingPolicy
from gper.replay.tree import PriorityTree


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

    def refresh(self, tree: PriorityTree, size: int, alpha: float, drawable: torch.Tensor | None = None) -> None:
        """Re-sort the keys of slots ``0 .. size``: the slot of rank r gets weight ``r ** -alpha``.

        ``drawable``: a [size] bool mask (a trajectory buffer's drawable starts); the others rank
        last and get weight 0, so they stay undrawable.
        """
        self.updates_since_refresh = 0
        if size == 0:
            return
        device = self.keys.device
        keys = self.keys[:size] if drawable is None else torch.where(drawable, self.keys[:size], -float("inf"))
        order = torch.argsort(keys, descending=True, stable=True)
        rank = torch.empty(size, dtype=torch.float32, device=device)
        rank[order] = torch.arange(1, size + 1, dtype=torch.float32, device=device)
        weights = rank.pow(-alpha)
        tree.set_leaves(weights if drawable is None else torch.where(drawable, weights, 0.0))


class RankSampler(SamplingPolicy):
    """Draws in proportion to rank weights ``rank ** -alpha``; new items enter at rank 1.

    A sharded buffer cannot draw it: ranks are global, each shard's tree holds its own slots.
    """

    mode = "rank"
    kernel_mode = MODE_PROPORTIONAL
    new_item_value = 1.0
    shardable = False

    def __init__(self, weight_norm: str, capacity: int, device: torch.device, refresh_interval: int) -> None:
        super().__init__(weight_norm, capacity, device, refresh_interval)
        self.rank = RankKeys(capacity, device, refresh_interval)

    @classmethod
    def state_bytes(cls, capacity: int) -> int:
        return 4 * (capacity + 1)

    def configure(self, weight_norm: str, refresh_interval: int) -> None:
        super().configure(weight_norm, refresh_interval)
        self.rank.refresh_interval = refresh_interval

    @property
    def updates_since_refresh(self) -> int:
        return self.rank.updates_since_refresh

    @updates_since_refresh.setter
    def updates_since_refresh(self, value: int) -> None:
        self.rank.updates_since_refresh = value

    def count_update(self) -> bool:
        return self.rank.count_update()

    def on_add(self, tree: PriorityTree, positions: torch.Tensor) -> None:
        self.rank.on_add(tree, positions)

    def update(self, tree: PriorityTree, change: PriorityUpdate) -> None:
        """Sort keys of ``change.indices`` from its TD errors (the tree changes at the next refresh)."""
        self.rank.update(tree, change.indices, change.td, change.expected_gen, change.eps)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"key": self.rank.keys}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.rank.keys.copy_(state["key"])
