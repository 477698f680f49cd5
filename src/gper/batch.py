"""What ``sample`` returns: the gathered fields plus the indices, generations and IS weights."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch


class SampledBatch(Mapping[str, torch.Tensor]):
    """A sampled batch. Index it by field name (``batch["obs"]``); all tensors are on the buffer's device.

    Attributes:
        indices: [B] int64 slots drawn.
        weights: [B] float32 importance-sampling weights (1 in uniform mode).
        generations: [B] int32 generation of each slot when drawn; ``update_priorities(batch, ...)``
            ignores entries whose slot has been overwritten since.
        rows: [B, row_bytes // 4] int32 packed rows that the field tensors view.
    """

    def __init__(
        self,
        fields: dict[str, torch.Tensor],
        indices: torch.Tensor,
        weights: torch.Tensor,
        generations: torch.Tensor,
        rows: torch.Tensor,
    ) -> None:
        self._fields = fields
        self.indices = indices
        self.weights = weights
        self.generations = generations
        self.rows = rows

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    @property
    def batch_size(self) -> int:
        return self.indices.shape[0]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self._fields.items())
        return f"SampledBatch(batch_size={self.batch_size}, {shapes})"
