"""What every buffer of several instances does the same way, whatever it stores: :class:`InstanceCalls`.

A buffer of ``instances=N`` (:mod:`gper.replay.instances`) holds N single buffers (``members``)
built on views of one :class:`~gper.replay.instances.InstanceStack`. The flat kind
(:class:`~gper.replay.buffer_instances.PrioritizedReplayInstances`) and the trajectory kind
(:class:`~gper.replay.trajectory_instances.TrajectoryReplayInstances`) both mix this in ahead of
their single buffer's class: the settings per instance, the per-instance exponents of a sample,
the priority update (checked once for all, then every member's device work in one call: one
CUDA graph of the stacked buffer's own), the copy and restore bookkeeping they share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from gper._device import canonical_device, on_own_device
from gper.ops.layout import TreeLayout
from gper.replay.backends import choose_backend
from gper.replay.checks import (
    check_beta_tensor,
    check_generations,
    check_indices,
    check_td,
    check_unit,
    out_of_memory,
    warn_cpu_fallback,
)
from gper.replay.config import ReplayConfig
from gper.replay.core import rebuild
from gper.replay.exponent import ExponentInput
from gper.replay.instances import PER_INSTANCE, InstanceSetting, InstanceStack, Member

#: builds instance ``i`` of a buffer from its settings and where its tensors live
MakeMember = Callable[[dict[str, Any], Member], Any]
#: a raw update's filter of one member's checked indices (the trajectory buffer drops non-starts)
RawFilter = Callable[[Any, torch.Tensor], torch.Tensor]


class InstanceCalls:
    """The calls a buffer of several instances shares with every other kind (mixed in ahead of
    the single buffer's class). A buffer using it has ``instances``, ``members``, ``_stack``,
    ``_graphs`` (its own :class:`~gper.replay.graphs.BufferGraphs`), ``_epoch`` (the stamp of its
    current state) and ``_single`` (the single buffer's class, which ``instances=`` dispatches from)."""

    alpha, beta, eps = InstanceSetting(), InstanceSetting(), InstanceSetting()

    @property
    def seeds(self) -> tuple[int, ...]:
        """Each instance's Philox key: ``seed + i``."""
        return tuple(m.seed for m in self.members)

    def _build_members(
        self, given: dict[str, Any], capacity: int, row_bytes: int, own: list[dict[str, Any]], make: MakeMember
    ) -> tuple[list[Any], InstanceStack]:
        """``(members, stack)``: a stack of rows of ``row_bytes`` and trees, and on it instance ``i``
        made by ``make(own[i] | {"device": ...}, member)``, on the ``device`` of ``given``; on the
        CPU after a warning if that runs out of memory and ``cpu_fallback``."""

        def on(device: torch.device) -> tuple[list[Any], InstanceStack]:
            _, kernels = choose_backend(own[0]["backend"], device)
            layout = TreeLayout.build(capacity, self._cfg.arity)
            stack = InstanceStack.build(self.instances, layout, row_bytes, kernels, device)
            return [make(s | {"device": device}, stack.member(i)) for i, s in enumerate(own)], stack

        device = canonical_device(given["device"])
        try:
            return on(device)
        except torch.OutOfMemoryError:
            if not given["cpu_fallback"] or device.type == "cpu":
                raise
            warn_cpu_fallback(device, capacity * self.instances, self.nbytes_estimate)
        return on(torch.device("cpu"))

    # ---------------------------------------------------------------- settings

    def _settings_changed(self, name: str) -> None:
        for m, cfg in zip(self.members, self._member_cfgs(), strict=True):
            m._cfg = cfg
            m._settings_changed(name)
        if name in ("alpha", "eps", "weight_norm"):
            self._graphs.clear()  # captured graphs froze them

    def _member_cfgs(self) -> list[ReplayConfig]:
        shared = {"weight_norm": self._cfg.weight_norm, "rank_refresh_interval": self._cfg.rank_refresh_interval}
        return [replace(m._cfg, **shared) for m in self.members]

    def _per_instance(self) -> dict[str, Any]:
        """The settings that differ between instances, as lists, and their count (a state's
        configuration and the constructor's arguments hold them so)."""
        return {name: list(getattr(self, name)) for name in PER_INSTANCE} | {"instances": self.instances}

    # ---------------------------------------------------------------- sample inputs

    def _exponents(
        self,
        value: float | torch.Tensor | None,
        graphed: bool,
        name: str,
        input_of: Callable[[Any], ExponentInput],
        default_of: Callable[[Any], float] | None = None,
    ) -> list[torch.Tensor]:
        """Each instance's exponent ``name`` for a sample (``value``: None for each one's default, a
        float, a 0-d float device tensor, or an [N] float device tensor), as a 0-d device tensor
        the kernels read."""
        members = self.members
        if value is None:
            return [input_of(m).tensor(default_of(m), graphed, checked=True) for m in members]
        if isinstance(value, torch.Tensor) and value.dim() == 1:
            if value.shape[0] != self.instances or not value.dtype.is_floating_point or value.device != self.device:
                raise ValueError(
                    f"{name} tensor must be 0-d or [{self.instances}] float on {self.device}, got shape "
                    f"{tuple(value.shape)} {value.dtype} on {value.device}"
                )
            parts = value.detach().unbind()
            for v in parts:  # every value checked before any instance's scalar is written
                check_beta_tensor(v, self.device, name)
            inputs = [input_of(m) for m in members]
            if graphed and (written := write_all_scalars(inputs, value)) is not None:
                return written
            return [x.tensor(v, graphed) for x, v in zip(inputs, parts, strict=True)]
        if not isinstance(value, torch.Tensor):
            value = check_unit(name, value)
            return [input_of(m).tensor(value, graphed, checked=True) for m in members]
        inputs = [input_of(m) for m in members]
        if graphed:
            check_beta_tensor(value, self.device, name)
            if (written := write_all_scalars(inputs, value)) is not None:
                return written
        return [x.tensor(value, graphed) for x in inputs]

    def _betas(self, beta: float | torch.Tensor | None, graphed: bool) -> list[torch.Tensor]:
        """Each instance's IS exponent for a sample."""
        return self._exponents(beta, graphed, "beta", lambda m: m._core.beta, lambda m: m._cfg.beta)

    def _instance_views(self, data: object, rest: str) -> dict[str, object]:
        """Instance 0's part of ``add`` input whose every tensor is ``[N, *rest]`` (``rest`` in the
        message), for the single buffer's checks: the leading [N] is checked here, touching nothing."""
        if not isinstance(data, Mapping):
            raise TypeError(f"add() takes a mapping of field name to tensor, got {type(data).__name__}")
        n = self.instances
        for name, x in data.items():
            if isinstance(x, torch.Tensor) and (x.dim() < 1 or x.shape[0] != n):
                raise ValueError(f"add(): field {name!r} has shape {tuple(x.shape)}: every field is [{n}, {rest}")
        return {name: x[0] if isinstance(x, torch.Tensor) else x for name, x in data.items()}

    def _own_copies(self, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """As :meth:`RowStorage.own_copies`, over the whole stack's rows: an input that is a view of
        the stored rows is copied first (an add may overwrite what it reads)."""
        rows = self._stack.rows
        lo, hi = rows.data_ptr(), rows.data_ptr() + rows.numel()
        out = []
        for x in values:
            x = x.detach() if x.requires_grad else x
            out.append(x.clone() if lo <= x.data_ptr() < hi else x)
        return tuple(out)

    # ---------------------------------------------------------------- priorities

    def _index_bound(self) -> int:
        """Indices at or past it are out of range (the flat buffer's filled slots)."""
        return self._size

    def _member_alpha(self, member: Any) -> float:
        """The exponent a member's priorities are set with."""
        return member.alpha

    def _check_indices(self, indices: object, what: str) -> torch.Tensor:
        """[N, B] int64 indices after the checks of a single buffer's (each instance's range too)."""
        if isinstance(indices, torch.Tensor) and (indices.dim() != 2 or indices.shape[0] != self.instances):
            raise ValueError(f"{what}: indices must be [{self.instances}, B], got shape {tuple(indices.shape)}")
        flat = check_indices(
            indices.reshape(-1) if isinstance(indices, torch.Tensor) else indices,
            self.device,
            self._index_bound(),
            self.strict,
            what,
        )
        return flat.view(self.instances, -1)

    def _update_members(
        self, batch: Any | None, indices: object, td_errors: torch.Tensor, raw_filter: RawFilter | None = None
    ) -> None:
        """The update every kind shares: a batch from another state is stale for every instance;
        otherwise [N, B] ``indices`` and ``td_errors`` are checked whole, then every member's
        priorities are set in one call (one graph of the buffer's own on CUDA)."""
        if batch is not None and batch.source is not self._epoch:
            check_td(td_errors, batch.indices, self.device)
            for m in self.members:
                m.tree.count_stale(batch.batch_size)
            return
        indices = self._check_indices(batch.indices if batch is not None else indices, "update_priorities()")
        td = check_td(td_errors, indices, self.device)
        if batch is None and raw_filter is not None:  # every member filtered before any is changed
            indices = torch.stack([raw_filter(m, indices[i]) for i, m in enumerate(self.members)])
        expected = check_generations(batch.generations, indices) if batch is not None else None
        args = (indices, td) if expected is None else (indices, td, expected)
        params = self._priority_params()

        def body(idx: torch.Tensor, values: torch.Tensor, gen: torch.Tensor | None = None) -> None:
            self._set_priorities(idx, values, gen, params)

        try:
            self._graphs.call(("update", indices.shape[1], expected is not None), args, body, by_address=True)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"updating {indices.numel()} priorities") from err
        for m in self.members:  # rank mode's refresh schedule (the same for every instance)
            if m.policy.count_update():
                m.refresh_ranks()

    def _priority_params(self) -> object:
        """What :meth:`_set_priorities` reads, made before the call (outside any graph capture)."""
        return None

    def _set_priorities(
        self, idx: torch.Tensor, values: torch.Tensor, gen: torch.Tensor | None, params: object
    ) -> None:
        """Every member's priorities of [N, B] ``idx`` from ``values``: one member at a time."""
        for i, m in enumerate(self.members):
            alpha = self._member_alpha(m)
            m._core.set_priorities(idx[i], values[i], None if gen is None else gen[i], alpha, m.eps)

    def priorities(self, indices: torch.Tensor) -> torch.Tensor:
        """Stored sampling priorities of [N, B] ``indices`` (each instance's own), [N, B] float32."""
        idx = self._check_indices(indices, "priorities()")
        return torch.stack([m.tree.priorities(idx[i]) for i, m in enumerate(self.members)])

    @on_own_device
    def refresh_ranks(self) -> None:
        """Rank mode: every instance's own ``refresh_ranks``."""
        for m in self.members:
            m.refresh_ranks()

    # ---------------------------------------------------------------- state and copies

    def _member_state(self, state: Any, i: int) -> dict[str, torch.Tensor]:
        """Instance ``i``'s part of a checked state: every tensor but the rows, at ``[i]``."""
        return {name: state[name][i] for name in self._tensors() if name != "rows"}

    def _stamp(self, batch: Any) -> Any:
        """``batch`` stamped with the current state's identity (every instance's)."""
        batch.source = self._epoch
        return batch

    def _restored(self) -> None:
        """After a restore of every instance: no graphs (they froze the old seeds), a new stamp."""
        self._graphs.clear()
        self._epoch = object()  # batches drawn before are stale

    def _init_args(self) -> dict[str, Any]:
        return super()._init_args() | self._per_instance() | {"cuda_graphs": self._graphs.enabled}

    def __reduce__(self) -> tuple:
        """``copy.deepcopy`` and ``pickle`` rebuild the buffer from its settings and state."""
        return (rebuild, (self._single, self._init_args(), self.state_dict()))


def write_all_scalars(inputs: Sequence[ExponentInput], value: torch.Tensor) -> list[torch.Tensor] | None:
    """``value`` (0-d or [N]) written into every input's scalar by one copy where the scalars lie
    evenly in one tensor (a stack's members, one row apart), clamped and NaN read as 1 as
    :meth:`ExponentInput.tensor` writes each; the scalars, or None where they do not lie so."""
    scalars = even_view([x.scalar for x in inputs])
    if scalars is None:
        return None
    scalars.copy_(value.detach().clamp(0.0, 1.0).nan_to_num(1.0).expand(len(inputs)))
    for x in inputs:
        x.forget()
    return [x.scalar for x in inputs]


def even_view(scalars: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One [N] view of the 0-d tensors ``scalars`` when they lie evenly spaced in one storage (the
    members' scalars of a stack of instances, one row apart), so that one kernel writes them all; else None."""
    first = scalars[0]
    if len(scalars) < 2 or any(s.dim() != 0 or s.dtype != first.dtype for s in scalars):
        return None
    step = scalars[1].storage_offset() - first.storage_offset()
    base = first.untyped_storage().data_ptr()
    for i, s in enumerate(scalars):
        if s.untyped_storage().data_ptr() != base or s.storage_offset() != first.storage_offset() + i * step:
            return None
    return first.as_strided((len(scalars),), (step,), first.storage_offset()) if step > 0 else None
