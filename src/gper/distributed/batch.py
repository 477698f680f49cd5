"""What a sharded buffer's ``sample`` returns: a :class:`~gper.SampledBatch` that also says which
shard each row came from, so that ``update_priorities`` can send each TD error to its owner."""

from __future__ import annotations

import torch

from gper.replay import RowLayout, SampledBatch


class ShardedBatch(SampledBatch):
    """A sampled batch of a :class:`~gper.distributed.ShardedPrioritizedReplayBuffer`.

    Attributes (beyond :class:`~gper.SampledBatch`'s):
        owners: [b] int64 rank of the shard each row was drawn from (this rank's in local mode).
        indices: [b] int64 slots in the owner's shard; ``generations``: their generations there.
    """

    def __init__(
        self,
        layout: RowLayout,
        rows: torch.Tensor,
        indices: torch.Tensor,
        weights: torch.Tensor,
        generations: torch.Tensor,
        owners: torch.Tensor,
    ) -> None:
        super().__init__(layout, rows, indices, weights, generations)
        self.owners = owners
