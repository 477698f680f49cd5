"""What ``sample`` returns: the gathered fields plus the indices, generations and IS weights."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from gper.replay.storage import RowLayout


class SampledBatch(Mapping[str, torch.Tensor]):
    """A sampled batch. Index it by field name (``batch["obs"]``); all tensors are on the buffer's device.

    Field tensors are views into ``rows`` (one packed row per draw), made on first access.

    Attributes:
        indices: [B] int64 slots drawn.
        weights: [B] float32 importance-sampling weights (1 in uniform mode).
        generations: [B] int32 generation of each slot when drawn; ``update_priorities(batch, ...)``
            ignores entries whose slot has been overwritten since.
        rows: [B, row_bytes // 4] int32 packed rows.
    """

    def __init__(
        self,
        layout: RowLayout,
        rows: torch.Tensor,
        indices: torch.Tensor,
        weights: torch.Tensor,
        generations: torch.Tensor,
        fields: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self._layout = layout
        self._names = tuple(f.name for f in layout.fields)
        self._fields: dict[str, torch.Tensor] = fields if fields is not None else {}
        self.rows = rows
        self.indices = indices
        self.weights = weights
        self.generations = generations

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._fields.get(name)
        if view is None:
            if name not in self._names:
                raise KeyError(f"no field {name!r}; the batch has {list(self._names)}")
            view = self._fields[name] = self._layout.view(self.rows, name)
        return view

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    @property
    def batch_size(self) -> int:
        return self.indices.shape[0]

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}: {f.shape} {f.dtype}" for f in self._layout.fields)
        return f"SampledBatch(batch_size={self.batch_size}, {fields})"
