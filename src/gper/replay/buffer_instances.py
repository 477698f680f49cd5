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

from gper._device import canonical_device, on_own_device
from gper.ops.layout import TreeLayout
from gper.replay.backends import choose_backend
from gper.replay.batch import FlatSample, SampledBatch
from gper.replay.buffer import _SAMPLE_SLOTS, PrioritizedReplayBuffer
from gper.replay.checks import (
    check_batch_size,
    check_beta_tensor,
    check_generations,
    check_indices,
    check_td,
    check_unit,
    out_of_memory,
    warn_cpu_fallback,
)
from gper.replay.config import ReplayConfig, ReplaySettings, takes_settings, with_defaults
from gper.replay.graphs import BufferGraphs
from gper.replay.instance_kernels import InstanceKernels
from gper.replay.instance_state import InstanceCheckpoint
from gper.replay.instances import InstanceSetting, InstanceStack, check_instances, instance_settings
from gper.replay.storage import RowLayout


class InstanceBatch(SampledBatch):
    """A batch of every instance: fields ``[N, B, *shape]``; ``indices``, ``generations`` and
    ``weights`` ``[N, B]``; ``rows`` ``[N, B, W]``."""

    @property
    def batch_size(self) -> int:
        return self.indices.shape[1]

    @property
    def instances(self) -> int:
        return self.indices.shape[0]

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}: {f.shape} {f.dtype}" for f in self._layout.fields)
        return f"InstanceBatch(instances={self.instances}, batch_size={self.batch_size}, {fields})"


class PrioritizedReplayInstances(InstanceCheckpoint, PrioritizedReplayBuffer):
    """N independent prioritized buffers in one storage, built by ``PrioritizedReplayBuffer(...,
    instances=N)`` (whose docstring documents every setting). Calls take and return a leading [N]
    dimension; :attr:`members` are the instances, each a buffer of its own (read them: their
    ``stats()``, ``priorities``, ``storage``; change the whole through this buffer's calls).

    ``alpha``, ``beta`` and ``eps`` read as a tuple of the N instances' values; assigning one value
    or N values sets them (checked whole first)."""

    alpha, beta, eps = InstanceSetting(), InstanceSetting(), InstanceSetting()

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
        self.members, self._stack = self._build(capacity, spec, given, own)
        self._core = self.members[0]._core  # the device, back end and kernels every instance shares
        self._run = InstanceKernels(self._stack, self.members)  # batched launches where the back end has them
        self._graphs = BufferGraphs(bool(given["cuda_graphs"]) and self.device.type == "cuda", _SAMPLE_SLOTS)
        self._size = 0
        self._flat = FlatSample(self._row_layout)
        self._epoch = object()

    def _build(self, capacity: int, spec: Mapping[str, tuple], given: dict[str, Any], own: list[dict[str, Any]]):
        """``(members, stack)`` on the device; on the CPU after a warning if it runs out of memory
        and ``cpu_fallback``."""
        device = canonical_device(given["device"])
        try:
            return self._build_on(device, capacity, spec, own)
        except torch.OutOfMemoryError:
            if not given["cpu_fallback"] or device.type == "cpu":
                raise
            warn_cpu_fallback(device, capacity * self.instances, self.nbytes_estimate)
        return self._build_on(torch.device("cpu"), capacity, spec, own)

    def _build_on(self, device: torch.device, capacity: int, spec: Mapping[str, tuple], own: list[dict[str, Any]]):
        _, kernels = choose_backend(own[0]["backend"], device)
        layout = TreeLayout.build(capacity, self._cfg.arity)
        stack = InstanceStack.build(self.instances, layout, self._row_layout.row_bytes, kernels, device)
        members = [
            PrioritizedReplayBuffer._instance(capacity, spec, s | {"device": device}, stack.member(i))
            for i, s in enumerate(own)
        ]
        return members, stack

    # ---------------------------------------------------------------- reads

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Views ``[N, capacity, *shape]`` of every field's storage (read them; write through ``add``)."""
        return self._row_layout.views(self._stack.rows)

    @property
    def seeds(self) -> tuple[int, ...]:
        """Each instance's Philox key: ``seed + i``."""
        return tuple(m.seed for m in self.members)

    def __repr__(self) -> str:
        return (
            f"PrioritizedReplayBuffer(instances={self.instances}, capacity={self.capacity}, size={self._size}, "
            f"sampling={self.sampling!r}, device={str(self.device)!r}, backend={self.backend!r}, "
            f"fields={list(self.spec)})"
        )

    def _settings_changed(self, name: str) -> None:
        for m, cfg in zip(self.members, self._member_cfgs(), strict=True):
            m._cfg = cfg
            m._settings_changed(name)
        if name in ("alpha", "eps", "weight_norm"):
            self._graphs.clear()  # captured graphs froze them

    def _member_cfgs(self) -> list[ReplayConfig]:
        from dataclasses import replace

        shared = {"weight_norm": self._cfg.weight_norm, "rank_refresh_interval": self._cfg.rank_refresh_interval}
        return [replace(m._cfg, **shared) for m in self.members]

    # ---------------------------------------------------------------- add

    def _check_add(self, data: object) -> int:
        """The per-instance batch size ``n`` of ``data`` (each field ``[N, n, *shape]``), touching nothing."""
        if not isinstance(data, Mapping):
            raise TypeError(f"add() takes a mapping of field name to tensor, got {type(data).__name__}")
        n = self.instances
        for name, x in data.items():
            if isinstance(x, torch.Tensor) and (x.dim() < 1 or x.shape[0] != n):
                raise ValueError(
                    f"add(): field {name!r} has shape {tuple(x.shape)}: every field is [{n}, n, *shape], "
                    f"one batch of n per instance"
                )
        views = {name: x[0] if isinstance(x, torch.Tensor) else x for name, x in data.items()}
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

    def _own_copies(self, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """As :meth:`RowStorage.own_copies`, over the whole stack's rows."""
        rows = self._stack.rows
        lo, hi = rows.data_ptr(), rows.data_ptr() + rows.numel()
        out = []
        for x in values:
            x = x.detach() if x.requires_grad else x
            out.append(x.clone() if lo <= x.data_ptr() < hi else x)
        return tuple(out)

    def _add(self, fields: tuple[torch.Tensor, ...], n: int, skip: int) -> torch.Tensor:
        return self._run.add(self.members[0].rows.on_device(fields), n, skip)

    # ---------------------------------------------------------------- sample

    def _betas(self, beta: float | torch.Tensor | None, graphed: bool) -> list[torch.Tensor]:
        """Each instance's IS exponent for a sample, as a 0-d device tensor the kernels read."""
        members = self.members
        if beta is None:
            return [m._core.beta.tensor(m._cfg.beta, graphed, checked=True) for m in members]
        if isinstance(beta, torch.Tensor) and beta.dim() == 1:
            if beta.shape[0] != self.instances or not beta.dtype.is_floating_point or beta.device != self.device:
                raise ValueError(
                    f"beta tensor must be 0-d or [{self.instances}] float on {self.device}, got shape "
                    f"{tuple(beta.shape)} {beta.dtype} on {beta.device}"
                )
            for b in beta.detach().unbind():
                check_beta_tensor(b, self.device)
            return [m._core.beta.tensor(b, graphed) for m, b in zip(members, beta.detach().unbind(), strict=True)]
        if not isinstance(beta, torch.Tensor):
            beta = check_unit("beta", beta)
            return [m._core.beta.tensor(beta, graphed, checked=True) for m in members]
        return [m._core.beta.tensor(beta, graphed) for m in members]

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
        batch.source = self._epoch
        return batch

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stacked outputs, views of ``flat`` [N, B * (W + 4)] whose row ``i`` is laid out as a
        single buffer's (:class:`~gper.replay.batch.FlatSample`)."""
        w = self._row_layout.words
        n, b = flat.shape[0], flat.shape[1] // (w + 4)
        return {
            "rows": flat[:, : b * w].view(n, b, w),
            "indices": flat[:, b * w : b * w + 2 * b].view(torch.int64),
            "generations": flat[:, b * w + 2 * b : b * w + 3 * b],
            "weights": flat[:, b * w + 3 * b :].view(torch.float32),
        }

    def _with_fields(self, flat: torch.Tensor) -> dict:
        parts: dict = dict(self._split(flat))
        return parts | {("field", name): view for name, view in self._row_layout.views(parts["rows"]).items()}

    def _draw(self, b: int, betas: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        flat = torch.empty(self.instances, b * (self._row_layout.words + 4), dtype=torch.int32, device=self.device)
        parts = self._split(flat)
        self._run.sample_into(parts, betas)
        return parts | {"flat": flat}

    def _batch(self, parts: dict, with_fields: bool = False) -> InstanceBatch:
        fields = {f.name: parts[("field", f.name)] for f in self._row_layout.fields} if with_fields else None
        return InstanceBatch(
            self._row_layout, parts["rows"], parts["indices"], parts["weights"], parts["generations"], fields
        )

    # ---------------------------------------------------------------- priorities

    def _check_indices(self, indices: object, what: str) -> torch.Tensor:
        """[N, B] int64 indices after the checks of a single buffer's (each instance's range too)."""
        if isinstance(indices, torch.Tensor) and (indices.dim() != 2 or indices.shape[0] != self.instances):
            raise ValueError(f"{what}: indices must be [{self.instances}, B], got shape {tuple(indices.shape)}")
        flat = check_indices(
            indices.reshape(-1) if isinstance(indices, torch.Tensor) else indices,
            self.device,
            self._size,
            self.strict,
            what,
        )
        return flat.view(self.instances, -1)

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
        if batch is not None and batch.source is not self._epoch:
            check_td(td_errors, batch.indices, self.device)
            for m in self.members:
                m.tree.count_stale(batch.batch_size)
            return
        indices = self._check_indices(batch.indices if batch is not None else batch_or_indices, "update_priorities()")
        td = check_td(td_errors, indices, self.device)
        expected = check_generations(batch.generations, indices) if batch is not None else None
        args = (indices, td) if expected is None else (indices, td, expected)
        params = self._run.update_params()  # device tensors of alpha and eps, made outside any capture

        def body(idx: torch.Tensor, values: torch.Tensor, gen: torch.Tensor | None = None) -> None:
            self._run.set_priorities(idx, values, gen, params)

        try:
            self._graphs.call(("update", indices.shape[1], expected is not None), args, body, by_address=True)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"updating {indices.numel()} priorities") from err
        for m in self.members:  # rank mode's refresh schedule (the same for every instance)
            if m.policy.count_update():
                m.refresh_ranks()

    def priorities(self, indices: torch.Tensor) -> torch.Tensor:
        """Stored sampling priorities of [N, B] ``indices`` (each instance's own), [N, B] float32."""
        idx = self._check_indices(indices, "priorities()")
        return torch.stack([m.tree.priorities(idx[i]) for i, m in enumerate(self.members)])

    @on_own_device
    def refresh_ranks(self) -> None:
        """Rank mode: every instance's :meth:`PrioritizedReplayBuffer.refresh_ranks`."""
        for m in self.members:
            m.refresh_ranks()
