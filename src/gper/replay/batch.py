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
        source: which state of which buffer the batch was drawn from; ``update_priorities``
            ignores a batch from another buffer, or from before a ``load_state_dict``.
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
        #: the buffer state this batch was drawn from (set by the buffer; see ``update_priorities``)
        self.source: object = None

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


class StackedBatch:
    """The shape of a batch of a buffer of several instances (mixed in ahead of its batch class):
    ``indices`` is [N, B], so the batch size is its second dimension."""

    indices: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.indices.shape[1]

    @property
    def instances(self) -> int:
        return self.indices.shape[0]


class FlatSample:
    """Where one ``sample`` call's outputs sit in a single flat int32 tensor of ``B * (W + 4)`` words:
    rows [B, W], indices [B] int64 (2B words), generations [B] int32, weights [B] float32.

    One flat tensor, so that a captured sample slot can tell whether any of its outputs (or a
    view of them) is still in use from one storage's use count (:class:`~gper.replay.graphs.SampleSlot`).
    """

    def __init__(self, layout: RowLayout) -> None:
        self.layout = layout

    def empty(self, b: int, device: torch.device) -> torch.Tensor:
        return torch.empty(b * (self.layout.words + 4), dtype=torch.int32, device=device)

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        w = self.layout.words
        b = flat.numel() // (w + 4)
        return {
            "rows": flat[: b * w].view(b, w),
            "indices": flat[b * w : b * w + 2 * b].view(torch.int64),
            "generations": flat[b * w + 2 * b : b * w + 3 * b],
            "weights": flat[b * w + 3 * b :].view(torch.float32),
        }

    def with_fields(self, flat: torch.Tensor) -> dict[str | tuple[str, str], torch.Tensor]:
        """:meth:`split` plus every field's view of the rows under ``("field", name)`` (prebuilt
        once for a sample slot): a field may be named ``weights`` or ``indices`` without
        replacing the batch's own outputs."""
        parts: dict[str | tuple[str, str], torch.Tensor] = dict(self.split(flat))
        return parts | {("field", name): view for name, view in self.layout.views(parts["rows"]).items()}

    def batch(self, parts: dict, with_fields: bool = False) -> SampledBatch:
        """A :class:`SampledBatch` over ``parts``; ``with_fields`` takes the field views from ``parts`` too."""
        fields = {f.name: parts[("field", f.name)] for f in self.layout.fields} if with_fields else None
        return SampledBatch(
            self.layout, parts["rows"], parts["indices"], parts["weights"], parts["generations"], fields
        )
