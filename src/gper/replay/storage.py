"""What a transition holds, how its fields are packed into one storage row, and the rows themselves.

Every field of a slot lives in one row of a ``[capacity, row_bytes]`` uint8 tensor (row_bytes
a multiple of 16), fields ordered by alignment (the largest power of two up to 16 dividing their
byte size), so each stays aligned and a field of a multiple of 16 bytes starts 16-byte aligned.
Sampling then gathers one contiguous row per draw, a single launch for all fields, and the row
start is 16-byte aligned so the loads vectorise (``docs/design.md``, *Storage*). Users see each
field as an ordinary strided view of shape ``[capacity, *shape]``.

:class:`RowLayout` is the layout; :class:`RowStorage` owns the ``[capacity, row_bytes]`` rows,
their field views, the checks of a batch to add, and its writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import torch

from gper.ops.tree.reference import write_fields

_ROW_ALIGN = 16

#: the dtypes a field may have: those every device's copy kernels support (unsigned ints wider
#: than 8 bits, float8 and quantized types have no index_copy on every device)
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)


@dataclass(frozen=True)
class Field:
    """One field of a transition: its per-item shape, dtype and byte offset in the row."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def _parse_one(name: object, entry: object) -> tuple[tuple[int, ...], torch.dtype]:
    if not isinstance(name, str) or not name:
        raise TypeError(f"spec keys must be non-empty strings, got {name!r}")
    if not (isinstance(entry, tuple | list) and len(entry) == 2):
        raise TypeError(f"spec[{name!r}] must be (shape, dtype), e.g. ((51,), torch.float32); got {entry!r}")
    shape, dtype = entry
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, tuple | list | torch.Size) or not all(_is_dim(d) for d in shape):
        raise ValueError(f"spec[{name!r}] shape must be a tuple of positive ints, got {entry[0]!r}")
    if dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(f"spec[{name!r}] dtype must be one of {names}; got {dtype!r}")
    return tuple(shape), dtype


def _is_dim(d: object) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d >= 1


def _alignment(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The largest power of two up to 16 dividing the field's byte size (at least its element size).

    Fields whose size is a multiple of 16 bytes (an ``obs`` of 52 float32, say) go first and start
    16-byte aligned in every row, so a batch's field is a strided view a matmul reads as it is."""
    nbytes = math.prod(shape) * dtype.itemsize
    return min(_ROW_ALIGN, nbytes & -nbytes)


@dataclass(frozen=True)
class RowLayout:
    """Byte layout of one storage row.

    Attributes:
        fields: the fields in spec order (their ``offset`` says where each sits in the row).
        row_bytes: bytes per row, a multiple of 16.
    """

    fields: tuple[Field, ...]
    row_bytes: int

    @staticmethod
    def build(spec: Mapping[str, tuple]) -> RowLayout:
        """Check a ``{name: (shape, dtype)}`` spec and lay its fields out in a row."""
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError("spec must be a non-empty mapping {name: (shape, dtype)}")
        parsed = {name: _parse_one(name, entry) for name, entry in spec.items()}
        offsets, end = {}, 0
        # most aligned first: every offset is then a multiple of its field's alignment
        for name in sorted(parsed, key=lambda n: -_alignment(*parsed[n])):
            shape, dtype = parsed[name]
            offsets[name] = end
            end += math.prod(shape) * dtype.itemsize
        row_bytes = max(_ROW_ALIGN, -(-end // _ROW_ALIGN) * _ROW_ALIGN)
        fields = tuple(Field(n, parsed[n][0], parsed[n][1], offsets[n]) for n in parsed)
        return RowLayout(fields, row_bytes)

    @property
    def words(self) -> int:
        """int32 words per row."""
        return self.row_bytes // 4

    def view(self, rows: torch.Tensor, name: str) -> torch.Tensor:
        """View ``[..., n, *shape]`` of field ``name`` in packed rows (``[..., n, row_bytes]`` uint8
        or ``[..., n, words]`` int32: a buffer of several instances has a leading dimension)."""
        f = self._by_name[name]
        if rows.dtype.itemsize == 4 and f.dtype.itemsize == 4:
            # 4-byte fields of int32 rows: one reinterpretation, then columns counted in words
            col = rows.view(f.dtype)[..., f.offset // 4 : f.offset // 4 + f.numel]
        else:
            col = rows.view(torch.uint8)[..., f.offset : f.offset + f.nbytes].view(f.dtype)
        return col.unflatten(-1, f.shape) if f.shape else col[..., 0]

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every field's view of packed rows."""
        return {f.name: self.view(rows, f.name) for f in self.fields}

    @cached_property
    def _by_name(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields}

    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {f.name: (f.shape, f.dtype) for f in self.fields}

    def check_batch(self, data: object, device: torch.device) -> int:
        """Validate a batch for ``add`` without touching anything; return its leading size ``n``.

        Raises:
            TypeError: not a mapping, a value that is not a tensor, or a wrong dtype.
            KeyError: missing or unexpected fields.
            ValueError: wrong shape, inconsistent or zero leading size, wrong device.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"add() takes a mapping of field name to tensor, got {type(data).__name__}")
        names = [f.name for f in self.fields]
        missing = [n for n in names if n not in data]
        extra = [n for n in data if n not in names]
        if missing or extra:
            raise KeyError(f"add(): missing fields {missing}, unexpected fields {extra}; the spec has {names}")
        n = None
        for f in self.fields:
            x = data[f.name]
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"add(): field {f.name!r} must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype != f.dtype:
                raise TypeError(f"add(): field {f.name!r} has dtype {x.dtype}, expected {f.dtype}")
            if x.dim() != 1 + len(f.shape) or tuple(x.shape[1:]) != f.shape:
                raise ValueError(
                    f"add(): field {f.name!r} has shape {tuple(x.shape)}, expected (n, {', '.join(map(str, f.shape))})"
                    if f.shape
                    else f"add(): field {f.name!r} has shape {tuple(x.shape)}, expected (n,)"
                )
            if x.device != device and x.device.type != "cpu":
                raise ValueError(f"add(): field {f.name!r} is on {x.device}, expected {device} or cpu")
            if n is None:
                n = x.shape[0]
            elif x.shape[0] != n:
                raise ValueError(f"add(): field {f.name!r} has {x.shape[0]} items, but {self.fields[0].name!r} has {n}")
        if n == 0:
            raise ValueError("add(): empty batch (leading size 0)")
        return n


class RowStorage:
    """The packed rows of ``capacity`` slots on ``device``, laid out by ``layout``.

    Attributes:
        layout: the :class:`RowLayout`.
        rows: [capacity, row_bytes] uint8, every field of a slot in one row.
        words: the same memory as [capacity, row_bytes // 4] int32 (what the sampling kernel gathers).
        fields: name -> view ``[capacity, *shape]`` of that field.
    """

    def __init__(
        self, layout: RowLayout, capacity: int, device: torch.device, rows: torch.Tensor | None = None
    ) -> None:
        self.layout = layout
        if rows is None:  # else a view of a stack's rows (a buffer of several instances)
            rows = torch.zeros(capacity, layout.row_bytes, dtype=torch.uint8, device=device)
        self.rows = rows
        self.words = self.rows.view(torch.int32)
        self.fields = layout.views(self.rows)
        #: field names in row-layout order (the order :meth:`write` takes values in)
        self.names: tuple[str, ...] = tuple(f.name for f in layout.fields)
        #: ``(byte offset, bytes)`` of each field in a row, in :attr:`names` order
        self.field_bytes: tuple[tuple[int, int], ...] = tuple((f.offset, f.nbytes) for f in layout.fields)

    @property
    def nbytes(self) -> int:
        return self.rows.numel()

    def check_batch(self, data: object) -> int:
        """Validate a batch for :meth:`write` (see :meth:`RowLayout.check_batch`); its size ``n``."""
        return self.layout.check_batch(data, self.rows.device)

    def own_copies(self, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """``values`` as :meth:`write` may take them: detached from autograd (the storage must not
        join the caller's graph, nor keep its tensors alive), and cloned where they are views of
        this storage (a slice of the buffer's own rows would be overwritten while it is read)."""
        lo = self.rows.data_ptr()
        hi = lo + self.rows.numel()
        out = []
        for x in values:  # a few host operations per field: add is on the hot path
            if x.requires_grad:
                x = x.detach()
            if lo <= x.data_ptr() < hi:  # a view into this storage
                x = x.clone()
            out.append(x)
        return tuple(out)

    def on_device(self, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """``values`` moved to the storage's device (all of them before any write: running out of
        memory moving one must not leave a slot with some fields new and others old)."""
        return tuple(x.to(self.rows.device, non_blocking=True) for x in values)

    def write(self, positions: torch.Tensor, values: tuple[torch.Tensor, ...]) -> None:
        """Write ``values`` (one tensor per field, in :attr:`names` order) into rows ``positions``.

        Every value is on the device before the first write: running out of memory moving one
        must not leave a slot with some fields new and others old."""
        write_fields(self.words, self.field_bytes, self.on_device(values), positions)
