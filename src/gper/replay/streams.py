"""The rows of a trajectory buffer: what a stream's row holds, and how one step is packed into it.

A row is a packed storage row of the spec's fields (as the flat buffer's, :class:`RowLayout`)
plus an internal 4-byte *flags* word (terminated, truncated, kind: ``docs/trajectory.md``).
:class:`StreamLayout` checks a spec and a step for ``add``, and packs a step into staged rows
(the step, then its ``next_obs``) with one ``torch.cat``, which the add kernel reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import torch

from gper.ops.trajectory.reference import AUTORESET
from gper.replay.storage import Field, RowLayout

#: the internal field that holds the flags word (never a spec name)
FLAGS = "_flags"
#: names a spec may not use: the trajectory buffer makes them
RESERVED = ("terminated", "truncated", "discount", "mask", FLAGS)
#: the flags a step carries, besides the spec's fields and its next observations
STEP_FLAGS = ("terminated", "truncated")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_streams(capacity: int, num_envs: object, window: object, autoreset: object) -> None:
    """The stream settings of a trajectory buffer, or a ValueError naming the first bad one."""
    if not _is_int(num_envs) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if not _is_int(window) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    if autoreset not in AUTORESET:
        raise ValueError(f"autoreset must be one of {tuple(AUTORESET)}, got {autoreset!r}")
    if capacity % num_envs:
        lo = capacity - capacity % num_envs
        raise ValueError(
            f"capacity ({capacity}) must be a multiple of num_envs ({num_envs}): {lo} or {lo + num_envs}, say"
        )
    if capacity // num_envs < window + 2:
        raise ValueError(
            f"each stream holds capacity // num_envs = {capacity // num_envs} rows, which must be at least "
            f"window + 2 = {window + 2}: raise capacity or lower window"
        )


def check_frame_stack(frame_stack: object, layout: StreamLayout, her: object) -> int:
    """``frame_stack``, checked against the row layout and hindsight relabelling, or a ValueError."""
    if not _is_int(frame_stack) or frame_stack < 1:
        raise ValueError(f"frame_stack must be an int >= 1, got {frame_stack!r}")
    if frame_stack > 1:
        if her is not None:
            raise ValueError("frame_stack > 1 does not combine with her: relabelling rewrites goals, not stacks")
        layout.stack_span()  # observation fields of whole words
    return frame_stack


def next_name(key: str) -> str:
    """The name of an observation field's next observation: ``obs`` -> ``next_obs``."""
    return f"next_{key}"


@dataclass(frozen=True)
class StreamLayout:
    """The stored row of a trajectory buffer and the names around it.

    Attributes:
        row: the packed row: the spec's fields and :data:`FLAGS`.
        obs_keys: the observation fields (each stored once; ``add`` takes ``next_<key>`` too).
        visible: the batch's fields in the row (the spec's, then ``terminated`` and ``truncated``,
            which are bytes 0 and 1 of the flags word).
    """

    row: RowLayout
    obs_keys: tuple[str, ...]
    visible: RowLayout

    @staticmethod
    def build(spec: Mapping[str, tuple], obs_keys: object) -> StreamLayout:
        """Check ``spec`` and ``obs_keys`` and lay the row out."""
        if isinstance(obs_keys, str) or not isinstance(obs_keys, tuple | list) or not obs_keys:
            raise TypeError(f"obs_keys must be a non-empty tuple of field names, got {obs_keys!r}")
        obs_keys = tuple(obs_keys)
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError("spec must be a non-empty mapping {name: (shape, dtype)}")
        names = set(spec)
        bad = sorted(n for n in names if n in RESERVED or any(n == next_name(k) for k in obs_keys))
        if bad:
            raise ValueError(f"spec may not name the fields {bad}: the trajectory buffer makes them")
        missing = [k for k in obs_keys if k not in names]
        if missing:
            raise ValueError(f"obs_keys {missing} are not in the spec {sorted(names)}")
        if len(set(obs_keys)) != len(obs_keys):
            raise ValueError(f"obs_keys has duplicates: {obs_keys}")
        if "reward" not in names:
            raise ValueError("spec must have a 'reward' field (a float32 scalar): n-step returns sum it")
        row = RowLayout.build(dict(spec) | {FLAGS: ((4,), torch.uint8)})
        fields = {f.name: f for f in row.fields}
        r = fields["reward"]
        if r.shape != () or r.dtype != torch.float32:
            raise TypeError(f"spec['reward'] must be a float32 scalar, ((), torch.float32); got {r.shape} {r.dtype}")
        flags = fields[FLAGS]
        visible = tuple(f for f in row.fields if f.name != FLAGS) + (
            Field("terminated", (), torch.bool, flags.offset),
            Field("truncated", (), torch.bool, flags.offset + 1),
        )
        return StreamLayout(row, obs_keys, RowLayout(visible, row.row_bytes))

    # ---------------------------------------------------------------- columns the kernels read

    def _field(self, name: str) -> Field:
        return next(f for f in self.row.fields if f.name == name)

    @property
    def words(self) -> int:
        return self.row.words

    @property
    def flags_col(self) -> int:
        return self._field(FLAGS).offset // 4

    @property
    def reward_col(self) -> int:
        return self._field("reward").offset // 4

    def stack_span(self) -> tuple[int, int]:
        """``(col0, words)``: the words of a row that frame stacks copy, from the first
        observation field's first word to the last one's last.

        Raises:
            ValueError: an observation field that is not whole int32 words (a stack copies words), or
                of 8-byte elements (float64, int64).
        """
        return self._stack_span  # computed once: every stacked draw reads it

    @cached_property
    def _stack_span(self) -> tuple[int, int]:
        fields = [self._field(k) for k in self.obs_keys]
        bad = [f.name for f in fields if f.offset % 4 or f.nbytes % 4]
        if bad:
            raise ValueError(
                f"frame_stack stacks whole 4-byte words: the observation fields {bad} are not a multiple of 4 bytes"
            )
        wide = [f.name for f in fields if f.dtype.itemsize > 4]
        if wide:  # a stack's frames sit at any word: an 8-byte element's view needs 8-byte alignment
            raise ValueError(f"frame_stack stacks elements of up to 4 bytes: the observation fields {wide} have 8")
        lo, hi = min(f.offset for f in fields), max(f.offset + f.nbytes for f in fields)
        return lo // 4, (hi - lo) // 4

    def stacked_view(self, stack: torch.Tensor, key: str) -> torch.Tensor:
        """View ``[..., S, *shape]`` of observation field ``key`` in stacked words ``[..., S, words]``
        (:meth:`stack_span`'s words)."""
        f = self._field(key)
        at = f.offset - 4 * self.stack_span()[0]
        col = stack.view(torch.uint8)[..., at : at + f.nbytes].view(f.dtype)
        return col.unflatten(-1, f.shape) if f.shape else col[..., 0]

    def obs_mask(self, device: torch.device) -> torch.Tensor:
        """[W] int32: the bits of each word of the row that belong to an observation field (a
        field of one or two bytes may share its word with another field)."""
        byte = torch.zeros(self.row.row_bytes, dtype=torch.uint8)
        for key in self.obs_keys:
            f = self._field(key)
            byte[f.offset : f.offset + f.nbytes] = 0xFF
        return byte.view(torch.int32).to(device)

    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {n: v for n, v in self.row.spec().items() if n != FLAGS}

    # ---------------------------------------------------------------- add

    def step_names(self) -> list[str]:
        """Every key ``add`` takes."""
        return [n for n in self.spec()] + [next_name(k) for k in self.obs_keys] + list(STEP_FLAGS)

    def check_step(self, data: object, num_envs: int, device: torch.device) -> None:
        """Validate one step for ``add`` from shapes, dtypes and devices, touching nothing.

        Raises:
            TypeError: not a mapping, a value that is not a tensor, or a wrong dtype.
            KeyError: missing or unexpected keys.
            ValueError: a wrong shape (each value is ``[num_envs, *shape]``) or device.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"add() takes a mapping of field name to tensor, got {type(data).__name__}")
        names = self.step_names()
        missing = [n for n in names if n not in data]
        extra = [n for n in data if n not in names]
        if missing or extra:
            raise KeyError(f"add(): missing keys {missing}, unexpected keys {extra}; a step has {names}")
        spec = self.spec()
        want = dict(spec) | {next_name(k): spec[k] for k in self.obs_keys} | {n: ((), torch.bool) for n in STEP_FLAGS}
        for name in names:
            x, (shape, dtype) = data[name], want[name]
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"add(): {name!r} must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype != dtype:
                raise TypeError(f"add(): {name!r} has dtype {x.dtype}, expected {dtype}")
            if tuple(x.shape) != (num_envs, *shape):
                raise ValueError(
                    f"add(): {name!r} has shape {tuple(x.shape)}, expected {(num_envs, *shape)} (one step of each of "
                    f"the {num_envs} streams)"
                )
            if x.device != device and x.device.type != "cpu":
                raise ValueError(f"add(): {name!r} is on {x.device}, expected {device} or cpu")


class StepPacker:
    """Packs one step of ``num_envs`` streams into ``[num_envs, 2W]`` int32 staged rows with one
    ``torch.cat``: the step's row (spec fields, and a flags word of its terminated and truncated
    bytes), then a row holding its next observations at the observation fields' offsets."""

    def __init__(self, layout: StreamLayout, num_envs: int, device: torch.device) -> None:
        self.layout, self.num_envs, self.device = layout, num_envs, device
        self._zeros = torch.zeros(num_envs, layout.row.row_bytes, dtype=torch.uint8, device=device)
        # the pieces of the staged rows in byte order: (key of the step's dict or None for zeros, bytes)
        pieces: list[tuple[str | None, int]] = []
        for half in ("step", "next"):
            end = 0
            for f in sorted(self.layout.row.fields, key=lambda f: f.offset):
                if half == "next" and f.name not in layout.obs_keys:
                    continue
                if f.offset > end:
                    pieces.append((None, f.offset - end))
                if f.name == FLAGS:
                    pieces += [("terminated", 1), ("truncated", 1), (None, 2)]
                else:
                    pieces.append((f.name if half == "step" else next_name(f.name), f.nbytes))
                end = f.offset + f.nbytes
            if layout.row.row_bytes > end:
                pieces.append((None, layout.row.row_bytes - end))
        self._pieces = pieces

    #: the most tensors a step's fields may come in for the add kernel to read them itself
    MAX_SOURCES = 6

    def word_plan(self) -> tuple[tuple[str, ...], torch.Tensor] | None:
        """The add kernel's own packing, where every field is whole int32 words (float32, int64,
        ... of any shape; fewer than 2^24 words) and there are at most :attr:`MAX_SOURCES` of
        them: ``(keys, plan)``, with ``plan`` [2W] int32 giving for each staged word ``source << 24
        | word`` (the key's index in ``keys`` and the word in its row), or -1 for a word that is 0
        (padding, and the flags word, which the kernel makes from ``terminated`` and
        ``truncated``). None otherwise."""
        keys: list[str] = []
        plan = [-1] * (2 * self.layout.words)
        for key, _ in self._pieces:
            if key is not None and key not in STEP_FLAGS and key not in keys:
                keys.append(key)
        if len(keys) > self.MAX_SOURCES:
            return None
        for half in (0, 1):  # the step's row, then its next observations
            for f in self.layout.row.fields:
                if f.name == "_flags" or (half == 1 and f.name not in self.layout.obs_keys):
                    continue
                if f.offset % 4 or f.nbytes % 4 or f.nbytes // 4 >= 2**24:
                    return None
                key = f.name if half == 0 else next_name(f.name)
                for w in range(f.nbytes // 4):
                    plan[half * self.layout.words + f.offset // 4 + w] = keys.index(key) << 24 | w
        return tuple(keys), torch.tensor(plan, dtype=torch.int32, device=self.device)

    def words_of(self, data: Mapping[str, torch.Tensor], keys: tuple[str, ...]) -> list[torch.Tensor]:
        """The tensors of ``keys`` as contiguous ``[num_envs, words]`` int32 views on the device."""
        out = []
        for key in keys:
            x = data[key].detach()
            if x.device != self.device:
                x = x.to(self.device, non_blocking=True)
            out.append(x.contiguous().reshape(self.num_envs, -1).view(torch.int32))
        return out

    def pack(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The staged rows of a checked step, on the device (inputs are never written to)."""
        e = self.num_envs
        parts = []
        for key, n in self._pieces:
            if key is None:
                parts.append(self._zeros[:, :n])
                continue
            x = data[key].detach()
            if x.device != self.device:
                x = x.to(self.device, non_blocking=True)
            parts.append(x.contiguous().view(torch.uint8).reshape(e, n))
        return torch.cat(parts, dim=1).view(torch.int32)
