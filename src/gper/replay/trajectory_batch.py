"""What the trajectory buffer's ``sample`` and ``sample_sequences`` return.

:class:`TransitionBatch` is a :class:`~gper.replay.batch.SampledBatch` (so ``update_priorities``
and code written for the flat buffer's batches take it) whose fields come from two gathered rows
per draw: the start's row and the row ``m`` steps on (whose observations are ``next_<key>``), and
a ``discount`` (and, from a buffer built with ``her``, ``relabelled``). :class:`SequenceBatch`
holds ``[B, burn_in + length]`` steps and their ``mask``.
All of a transition batch's outputs are views of one flat int32 tensor (:class:`TransitionSample`),
so the buffer's captured sample slots can tell when a batch is still in use.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from gper.replay.batch import SampledBatch
from gper.replay.checks import check_batch_size, check_unit
from gper.replay.streams import StreamLayout, next_name


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SampleArgs:
    """The checks of the trajectory buffer's sample arguments (mixed into it, and so into its kind
    of several instances, which checks once for all): the buffer has ``window``, ``her`` and
    ``_steps``."""

    def _check_drawable(self, what: str) -> None:
        if self._steps <= self.window:
            raise RuntimeError(
                f"{what}: {self._steps} steps added; a start is drawable once the window={self.window} steps "
                f"after it are written, so sampling needs window + 1 = {self.window + 1} steps (or build the "
                "buffer with a smaller window)"
            )

    def _check_steps(self, name: str, value: object) -> int:
        if not _is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= self.window:
            raise ValueError(f"{name} must be in [1, window={self.window}], got {value}")
        return value

    def _check_sample(self, batch_size: object, n_step: object, gamma: object, relabel: object) -> tuple:
        """``(B, n_step, relabel)`` of a :meth:`sample` call, checked (``relabel`` as a bool)."""
        b = check_batch_size(batch_size)
        n = self._check_steps("n_step", n_step)
        if gamma is None and n > 1:
            raise ValueError(f"sample(n_step={n}) needs gamma for the n-step return")
        if relabel is not None and not isinstance(relabel, bool):
            raise TypeError(f"relabel must be a bool or None, got {type(relabel).__name__}")
        if relabel and self.her is None:
            raise ValueError("sample(relabel=True) needs a buffer built with her=gper.HindsightRelabeling(...)")
        self._check_drawable("sample()")
        return b, n, self.her is not None and relabel is not False

    def _check_sequences(self, batch_size: object, length: object, burn_in: object) -> tuple[int, int]:
        b = check_batch_size(batch_size)
        length = self._check_steps("length", length)
        if not _is_int(burn_in) or burn_in < 0:
            raise ValueError(f"burn_in must be an int >= 0, got {burn_in!r}")
        self._check_drawable("sample_sequences()")
        return b, length


class TransitionBatch(SampledBatch):
    """Transitions drawn by ``TrajectoryReplayBuffer.sample``. Index it by name: the spec's fields
    of each start row (``reward`` holds the n-step return), ``next_<key>`` for each observation
    key, ``terminated``, ``truncated`` (bool) and ``discount`` (float32 ``gamma ** m``, 0 where
    the episode terminated within the m steps); from a buffer built with ``her``, also
    ``relabelled`` (bool: the draw's goal was relabelled, ``docs/trajectory.md``). From a buffer
    built with ``frame_stack=S``, each observation key and its ``next_<key>`` are stacks
    ``[B, S, *shape]``, the oldest frame first, zeros before the episode's first.

    Attributes:
        indices, weights, generations, source: as :class:`~gper.replay.batch.SampledBatch`.
        rows: [B, W] int32 start rows (reward and flags already those of the n-step transition).
        next_rows: [B, W] int32 the rows m steps on.
        discount: [B] float32.
        relabelled: [B] bool, or None from a buffer without ``her``.
        n_step: the ``n_step`` it was drawn with.
    """

    def __init__(
        self,
        layout: StreamLayout,
        parts: dict[str, torch.Tensor],
        n_step: int,
        fields: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__(
            layout.visible, parts["rows"], parts["indices"], parts["weights"], parts["generations"], fields
        )
        self._stream = layout
        self.next_rows = parts["next_rows"]
        self.discount = parts["discount"]
        self.relabelled = parts.get("relabelled")
        self.n_step = n_step
        #: [B, S, F] int32 stacked observation words of the starts and of their next observations, or None
        self.obs_stack, self.next_stack = parts.get("obs_stack"), parts.get("next_stack")
        self._names = (
            tuple(f.name for f in layout.visible.fields)
            + tuple(next_name(k) for k in layout.obs_keys)
            + ("discount",)
            + (("relabelled",) if self.relabelled is not None else ())
        )

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._fields.get(name)
        if view is not None:
            return view
        if name == "discount":
            return self.discount
        if name == "relabelled" and self.relabelled is not None:
            return self.relabelled
        if self.obs_stack is not None and name in self._stream.obs_keys:
            view = self._fields[name] = self._stream.stacked_view(self.obs_stack, name)
            return view
        key = next((k for k in self._stream.obs_keys if next_name(k) == name), None)
        if key is not None and self.obs_stack is not None:
            view = self._fields[name] = self._stream.stacked_view(self.next_stack, key)
            return view
        if key is not None:
            view = self._fields[name] = self._stream.row.view(self.next_rows, key)
            return view
        return super().__getitem__(name)

    def __repr__(self) -> str:
        return f"TransitionBatch(batch_size={self.batch_size}, n_step={self.n_step}, fields={list(self)})"


class TransitionSample:
    """Where one ``sample`` call's outputs sit in a single flat int32 tensor of ``B * (2W + 5)``
    words: start rows [B, W], next rows [B, W], indices [B] int64, generations, weights, discount;
    with ``relabelled``, one more word a draw, whose first B bytes are the bool flags; with frame
    stacks of ``S`` frames, the stacks of the start and of its next observation, [B, S, F] words each."""

    def __init__(
        self, layout: StreamLayout, relabelled: bool = False, kind: type | None = None, frame_stack: int = 1
    ) -> None:
        self.layout = layout
        self.relabelled = relabelled
        #: the batch class it builds (a buffer of several instances builds its own kind)
        self.kind = TransitionBatch if kind is None else kind
        self.frame_stack = frame_stack
        #: the stacked observation words of a frame (:meth:`StreamLayout.stack_span`), 0 without stacks
        self.stack_words = layout.stack_span()[1] if frame_stack > 1 else 0
        self._per_draw = 2 * layout.words + 5 + relabelled + 2 * frame_stack * self.stack_words

    def empty(self, b: int, device: torch.device, lead: tuple[int, ...] = ()) -> torch.Tensor:
        """A new flat output of ``b`` draws (``lead``: a buffer of several instances' (N,), whose
        rows are padded to an even number of words: each row's int64 indices must be 8-byte aligned)."""
        words = b * self._per_draw
        return torch.empty(*lead, words + (words % 2 if lead else 0), dtype=torch.int32, device=device)

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The outputs' views of ``flat`` ([..., B * per draw]: a leading [N] is kept, each row of it
        laid out as one buffer's)."""
        w = self.layout.words
        lead, b = flat.shape[:-1], flat.shape[-1] // self._per_draw
        at = 2 * b * w
        parts = {
            "rows": flat[..., : b * w].view(*lead, b, w),
            "next_rows": flat[..., b * w : at].view(*lead, b, w),
            "indices": flat[..., at : at + 2 * b].view(torch.int64),
            "generations": flat[..., at + 2 * b : at + 3 * b],
            "weights": flat[..., at + 3 * b : at + 4 * b].view(torch.float32),
            "discount": flat[..., at + 4 * b : at + 5 * b].view(torch.float32),
        }
        at += 5 * b
        if self.relabelled:
            parts["relabelled"] = flat[..., at : at + b].view(torch.uint8)[..., :b].view(torch.bool)
            at += b
        if self.stack_words:
            n = self.frame_stack * self.stack_words
            shape = (*lead, b, self.frame_stack, self.stack_words)
            parts["obs_stack"] = flat[..., at : at + b * n].view(shape)
            parts["next_stack"] = flat[..., at + b * n : at + 2 * b * n].view(shape)
        return parts

    def with_fields(self, flat: torch.Tensor) -> dict:
        """:meth:`split` plus the prebuilt field views under ``("field", name)`` (for a sample slot)."""
        parts: dict = dict(self.split(flat))
        batch = self.kind(self.layout, parts, 0)
        return parts | {("field", name): batch[name] for name in batch}

    def batch(self, parts: dict, n_step: int, with_fields: bool = False) -> TransitionBatch:
        fields = {k[1]: v for k, v in parts.items() if isinstance(k, tuple)} if with_fields else None
        return self.kind(self.layout, parts, n_step, fields)


class SequenceBatch(SampledBatch):
    """Sequences drawn by ``TrajectoryReplayBuffer.sample_sequences``: every field ``[B, S, ...]``
    with ``S = burn_in + length`` (the burn-in steps come first: the ``burn_in`` rows before each
    start), ``next_<key>`` the observation after each step, and ``mask`` [B, S] bool (``docs/trajectory.md``).

    Attributes:
        indices, weights, generations: [B], one per sequence (its start), as for transitions.
        rows: [B, S + 1, W] int32: position ``i`` holds step ``i`` (and the next observation of step ``i - 1``).
        mask: [B, S] bool.
        length, burn_in: the shape it was drawn with.
    """

    def __init__(
        self,
        layout: StreamLayout,
        rows: torch.Tensor,
        mask: torch.Tensor,
        indices: torch.Tensor,
        weights: torch.Tensor,
        generations: torch.Tensor,
        length: int,
        burn_in: int,
    ) -> None:
        super().__init__(layout.visible, rows, indices, weights, generations)
        self._stream = layout
        self.mask = mask
        self.length, self.burn_in = length, burn_in
        self._names = (
            tuple(f.name for f in layout.visible.fields) + tuple(next_name(k) for k in layout.obs_keys) + ("mask",)
        )

    def _view(self, name: str, shift: int) -> torch.Tensor:
        *lead, s1, w = self.rows.shape  # [B, S + 1, W], or [N, B, S + 1, W] from several instances
        layout = self._stream.visible if shift == 0 else self._stream.row
        flat = layout.view(self.rows.view(-1, w), name)
        full = flat.view(*lead, s1, *flat.shape[1:])
        return full.narrow(len(lead), 1, s1 - 1) if shift else full.narrow(len(lead), 0, s1 - 1)

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._fields.get(name)
        if view is not None:
            return view
        if name == "mask":
            return self.mask
        key = next((k for k in self._stream.obs_keys if next_name(k) == name), None)
        if key is not None:
            view = self._view(key, 1)
        elif name in self._names:
            view = self._view(name, 0)
        else:
            raise KeyError(f"no field {name!r}; the batch has {list(self._names)}")
        self._fields[name] = view
        return view

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return (
            f"SequenceBatch(batch_size={self.batch_size}, burn_in={self.burn_in}, length={self.length}, "
            f"fields={list(self)})"
        )

    def start_td(self, td: object, eta: object, device: torch.device) -> torch.Tensor:
        """One TD error per start from ``td`` [B, length] (the steps after the burn-in), mixed
        over each sequence's masked steps as ``eta * max|td| + (1 - eta) * mean|td|`` (R2D2)."""
        eta = check_unit("eta", eta)
        if not isinstance(td, torch.Tensor):
            raise TypeError(f"update_priorities(): td_errors must be a torch.Tensor, got {type(td).__name__}")
        want = (*self.indices.shape, self.length)
        if tuple(td.shape) != want or not td.dtype.is_floating_point or td.device != device:
            raise ValueError(
                f"update_priorities(): a sequence batch's td_errors must be a float tensor {want} (the steps after "
                f"the burn-in) on {device}; got {tuple(td.shape)} {td.dtype} on {td.device}"
            )
        mask = self.mask[..., self.burn_in :]
        a = torch.where(mask, td.detach().float().abs(), 0.0)
        mean = a.sum(dim=-1) / mask.sum(dim=-1).clamp_min(1)
        return eta * a.amax(dim=-1) + (1.0 - eta) * mean
