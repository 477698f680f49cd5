"""A prioritized replay buffer of several instances: :class:`PrioritizedReplayInstances`.

``PrioritizedReplayBuffer(capacity, spec, instances=N)`` builds one of these: N independent
buffers in one storage (:mod:`gper.replay.instances`). Instance ``i`` is a
:class:`~gper.PrioritizedReplayBuffer` of seed ``seed + i`` (and its own ``alpha``, ``beta`` and
``eps`` where those are given per instance) built on views of the stacked tensors, so it draws
bit for bit what that single buffer draws. This class checks each call once for all instances,
runs every instance's device work in one call (one CUDA graph of its own on CUDA), and keeps the
state of all of them in the stacked tensors (:mod:`gper.replay.instance_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gper._device import on_own_device
from gper.replay.batch import FlatSample, SampledBatch, StackedBatch
from gper.replay.buffer import _SAMPLE_SLOTS, PrioritizedReplayBuffer
from gper.replay.checks import (
    check_batch_size,
    out_of_memory,
)
from gper.replay.config import ReplayConfig, ReplaySettings, takes_settings, with_defaults
from gper.replay.graphs import BufferGraphs
from gper.replay.instance_calls import InstanceCalls
from gper.replay.instance_kernels import InstanceKernels
from gper.replay.instance_state import InstanceCheckpoint
from gper.replay.instances import check_instances, instance_settings
from gper.replay.storage import RowLayout


class InstanceBatch(StackedBatch, SampledBatch):
    """A batch of every instance: fields ``[N, B, *shape]``; ``indices``, ``generations`` and
    ``weights`` ``[N, B]``; ``rows`` ``[N, B, W]``."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}: {f.shape} {f.dtype}" for f in self._layout.fields)
        return f"InstanceBatch(instances={self.instances}, batch_size={self.batch_size}, {fields})"


class PrioritizedReplayInstances(InstanceCheckpoint, InstanceCalls, PrioritizedReplayBuffer):
    """N independent prioritized buffers in one storage, built by ``PrioritizedReplayBuffer(...,
    instances=N)`` (whose docstring documents every setting). Calls take and return a leading [N]
    dimension; :attr:`members` are the instances, each a buffer of its own (read them: their
    ``stats()``, ``priorities``, ``storage``; change the whole through this buffer's calls).

    ``alpha``, ``beta`` and ``eps`` read as a tuple of the N instances' values; assigning one value
    or N values sets them (checked whole first)."""

    _single = PrioritizedReplayBuffer

    @takes_settings(ReplaySettings)
    def __init__(self, capacity: int, spec: Mapping[str, tuple], **settings: Any) -> None:
        given = with_defaults("PrioritizedReplayBuffer", settings)
        n = check_instances(given["instances"])
        if n is None:
            raise ValueError("PrioritizedReplayInstances needs instances=N (an int >= 1)")
        own = instance_settings(given, n)  # every instance's settings checked before anything is built
        cfg = [ReplayConfig.check(capacity, s) for s in own][0]
        self.instances, self._cfg, self.strict = n, cfg, bool(given["strict"])
        self._backend_request = given["backend"]
        self._row_layout = RowLayout.build(spec)
        self.nbytes_estimate = n * cfg.estimate_bytes(self._row_layout.row_bytes)
        make = lambda s, member: PrioritizedReplayBuffer._instance(capacity, spec, s, member)  # noqa: E731
        self.members, self._stack = self._build_members(given, capacity, self._row_layout.row_bytes, own, make)
        self._core = self.members[0]._core  # the device, back end and kernels every instance shares
        self._run = InstanceKernels(self._stack, self.members)  # batched launches where the back end has them
        self._graphs = BufferGraphs(bool(given["cuda_graphs"]) and self.device.type == "cuda", _SAMPLE_SLOTS)
        self._size = 0
        self._flat = FlatSample(self._row_layout)
        self._epoch = object()

    # ---------------------------------------------------------------- reads

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Views ``[N, capacity, *shape]`` of every field's storage (read them; write through ``add``)."""
        return self._row_layout.views(self._stack.rows)

    def __repr__(self) -> str:
        return (
            f"PrioritizedReplayBuffer(instances={self.instances}, capacity={self.capacity}, size={self._size}, "
            f"sampling={self.sampling!r}, device={str(self.device)!r}, backend={self.backend!r}, "
            f"fields={list(self.spec)})"
        )

    # ---------------------------------------------------------------- add

    def _check_add(self, data: object) -> int:
        """The per-instance batch size ``n`` of ``data`` (each field ``[N, n, *shape]``), touching nothing."""
        views = self._instance_views(data, "n, *shape], one batch of n per instance")
        return self.members[0].rows.check_batch(views)

    @on_own_device
    def add(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Append ``n`` transitions to every instance, at each one's max priority.

        Args:
            data: every spec field, each ``[N, n, *shape]`` (instance ``i`` adds ``data[name][i]``),
                on the buffer's device or the CPU. If ``n > capacity`` only the last ``capacity``
                of each are kept.

        Returns:
            [N, min(n, capacity)] int64 slots written, on the device.
        """
        n = self._check_add(data)
        skip = n - min(n, self.capacity)
        names = self.members[0].rows.names
        args = self._own_copies(tuple(data[name][:, skip:] if skip else data[name] for name in names))
        try:
            if not self._graphs.active:
                pos, replayed = self._add(args, n, skip), False
            else:
                key = ("add", n) + tuple((a.dtype, a.device.type) for a in args)
                on_device = all(a.device == self.device for a in args)
                pos, replayed = self._graphs.call(key, args, lambda *xs: self._add(xs, n, skip), by_address=on_device)
        except torch.OutOfMemoryError as err:
            what = f"adding {n} transitions to each of {self.instances} instances"
            raise out_of_memory(err, self.device, what) from err
        self._size = min(self._size + n, self.capacity)
        return pos.clone() if replayed else pos

    def _add(self, fields: tuple[torch.Tensor, ...], n: int, skip: int) -> torch.Tensor:
        return self._run.add(self.members[0].rows.on_device(fields), n, skip)

    # ---------------------------------------------------------------- sample

    @on_own_device
    def sample(self, batch_size: int, beta: float | torch.Tensor | None = None) -> InstanceBatch:
        """Draw ``batch_size`` transitions from every instance (with replacement), with IS weights.

        Args:
            batch_size: B >= 1, from each instance.
            beta: the IS exponent: a float in [0, 1], a 0-d float device tensor, or an [N] float
                device tensor (one per instance); default each instance's ``beta``.

        Returns:
            An :class:`InstanceBatch` of fresh tensors: instance ``i``'s part (``batch[name][i]``,
            ``batch.indices[i]``, ...) is what a single buffer of seed ``seed + i`` draws.
        """
        b = check_batch_size(batch_size)
        if self._size == 0:
            raise RuntimeError("sample(): the buffer is empty; add() transitions first")
        graphed = self._graphs.active
        betas = self._betas(beta, graphed)
        try:
            if not graphed:
                parts = self._draw(b, betas)
                batch = self._batch(parts)
            else:
                own = [m.tree.beta for m in self.members]
                out, replayed = self._graphs.samples.run(b, lambda: self._draw(b, own)["flat"], self._with_fields)
                batch = self._batch(out, with_fields=True) if replayed else self._batch(self._split(out))
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing {self.instances} batches of {b}") from err
        return self._stamp(batch)

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stacked outputs, views of ``flat`` [N * B * (W + 4)] int32: every instance's rows
        [N, B, W], then the indices [N, B] int64, the generations and the weights [N, B], each block
        contiguous, so the priority update reads the indices and generations as they are (with
        each instance's outputs a row of one [N, B * (W + 4)] tensor, both were copies)."""
        w, n = self._row_layout.words, self.instances
        nb = flat.numel() // (w + 4)  # N * B; rows of even words keep the int64 indices aligned
        b = nb // n
        return {
            "rows": flat[: nb * w].view(n, b, w),
            "indices": flat[nb * w : nb * (w + 2)].view(torch.int64).view(n, b),
            "generations": flat[nb * (w + 2) : nb * (w + 3)].view(n, b),
            "weights": flat[nb * (w + 3) :].view(torch.float32).view(n, b),
        }

    def _with_fields(self, flat: torch.Tensor) -> dict:
        parts: dict = dict(self._split(flat))
        return parts | {("field", name): view for name, view in self._row_layout.views(parts["rows"]).items()}

    def _draw(self, b: int, betas: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        flat = torch.empty(self.instances * b * (self._row_layout.words + 4), dtype=torch.int32, device=self.device)
        parts = self._split(flat)
        self._run.sample_into(parts, betas)
        return parts | {"flat": flat}

    def _batch(self, parts: dict, with_fields: bool = False) -> InstanceBatch:
        fields = {f.name: parts[("field", f.name)] for f in self._row_layout.fields} if with_fields else None
        return InstanceBatch(
            self._row_layout, parts["rows"], parts["indices"], parts["weights"], parts["generations"], fields
        )

    # ---------------------------------------------------------------- priorities

    @on_own_device
    def update_priorities(self, batch_or_indices: InstanceBatch | torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set priorities ``(|td| + eps) ** alpha`` (each instance's alpha and eps) for sampled slots.

        Args:
            batch_or_indices: the :class:`InstanceBatch` the TD errors belong to (entries whose slot
                was overwritten since are ignored, and a whole batch drawn before a restore or by
                another buffer), or raw [N, B] slot indices (no such check).
            td_errors: [N, B] floating, on the buffer's device (NaN and ±Inf as a single buffer's).
        """
        batch = batch_or_indices if isinstance(batch_or_indices, InstanceBatch) else None
        self._update_members(batch, batch_or_indices, td_errors)

    def _priority_params(self) -> object:
        return self._run.update_params()  # device tensors of alpha and eps, made outside any capture

    def _set_priorities(
        self, idx: torch.Tensor, values: torch.Tensor, gen: torch.Tensor | None, params: object
    ) -> None:
        self._run.set_priorities(idx, values, gen, params)  # one set of launches where the back end has them
