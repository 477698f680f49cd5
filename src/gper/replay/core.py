"""The replay core every buffer is built on: :class:`ReplayCore`.

It owns the state a prioritized buffer holds whatever it stores (the priority tree, the row
storage, the sampler), the buffer's own CUDA graphs and its state identity (the stamp every
batch carries), and the paths every buffer shares: the fall-back to the CPU when the device runs
out of memory at construction, the priority update (index, TD and generation checks, stale
batches, graph dispatch, the rank refresh schedule), the counters' read-out and the bookkeeping of
a restore. :class:`~gper.PrioritizedReplayBuffer`, :class:`~gper.TrajectoryReplayBuffer` and each
shard of :class:`~gper.ShardedPrioritizedReplayBuffer` are built on it through these methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from gper._device import canonical_device
from gper.replay.backends import choose_backend
from gper.replay.checks import (
    check_generations,
    check_indices,
    check_td,
    out_of_memory,
    warn_cpu_fallback,
    warn_dropped,
)
from gper.replay.config import ReplayConfig, ReplaySettings
from gper.replay.exponent import ExponentInput
from gper.replay.graphs import BufferGraphs
from gper.replay.instances import Member
from gper.replay.samplers import PriorityUpdate, SamplingPolicy
from gper.replay.storage import RowLayout, RowStorage
from gper.replay.tree import PriorityTree


class ReplayCore:
    """A buffer's tree, rows, sampler, CUDA graphs and state identity, on one device.

    Args:
        cfg: the buffer's checked settings.
        row_layout: the rows' packing.
        device: where everything lives.
        backend: the buffer's back-end request (see :func:`gper.replay.backends.choose_backend`).
        cuda_graphs: capture and replay the buffer's calls on CUDA.
        sample_slots: captured sample outputs per batch size.
        member: where the tensors live when the core is one instance of a buffer of several
            (views of its :class:`~gper.replay.instances.InstanceStack`); None: its own.

    Attributes:
        device, backend, kernels: the device, the chosen back end's name and its kernel module.
        rows: the :class:`RowStorage`; tree: the :class:`PriorityTree`; policy: the sampler.
        graphs: the :class:`BufferGraphs`; beta: the IS exponent's :class:`ExponentInput`.
        seed: the Philox key of the draws.
        epoch: the stamp of the current state: a batch carrying another (drawn before a restore,
            or by another buffer) is stale as a whole.
        invalid_reported: dropped update entries already warned about.
    """

    def __init__(
        self,
        cfg: ReplayConfig,
        row_layout: RowLayout,
        device: torch.device,
        backend: str | ModuleType,
        cuda_graphs: bool,
        sample_slots: int,
        member: Member | None = None,
    ) -> None:
        self.device = device
        self.backend, self.kernels = choose_backend(backend, device)
        if member is None:
            self.rows = RowStorage(row_layout, cfg.capacity, device)
            self.tree = PriorityTree(cfg.capacity, self.kernels, device, cfg.arity)
        else:  # views of the stack's tensors
            self.rows = RowStorage(row_layout, cfg.capacity, device, rows=member.rows)
            self.tree = PriorityTree(cfg.capacity, self.kernels, device, cfg.arity, tensors=member.tree_tensors())
        self.policy = SamplingPolicy.build(
            cfg.sampling, cfg.weight_norm, cfg.capacity, device, cfg.rank_refresh_interval
        )
        self.graphs = BufferGraphs(cuda_graphs and device.type == "cuda", sample_slots)
        self.beta = ExponentInput(self.tree.beta)
        self.seed = cfg.seed
        self.invalid_reported = 0
        self.epoch = object()

    @classmethod
    def build(
        cls,
        cfg: ReplayConfig,
        row_layout: RowLayout,
        settings: ReplaySettings,
        sample_slots: int,
        nbytes: int,
        extend: Callable[[ReplayCore], object] | None = None,
        member: Member | None = None,
    ) -> ReplayCore:
        """A core on the ``device`` of ``settings`` (every setting given, as
        :func:`~gper.replay.config.with_defaults` returns them), then ``extend(core)`` (what a buffer
        allocates beside it); if the device runs out of memory meanwhile and ``cpu_fallback``, a
        warning and both on the CPU."""
        backend, cuda_graphs = settings["backend"], settings["cuda_graphs"]

        def make(where: torch.device) -> ReplayCore:
            core = cls(cfg, row_layout, where, backend, cuda_graphs, sample_slots, member)
            if extend is not None:
                extend(core)
            return core

        device = canonical_device(settings["device"])
        try:
            return make(device)
        except torch.OutOfMemoryError:
            if not settings["cpu_fallback"] or device.type == "cpu":
                raise
            warn_cpu_fallback(device, cfg.capacity, nbytes)
        return make(torch.device("cpu"))

    # ---------------------------------------------------------------- batches

    def stamp(self, batch: Any) -> Any:
        """``batch`` stamped with the current state's identity."""
        batch.source = self.epoch
        return batch

    def is_current(self, batch: Any) -> bool:
        """Whether ``batch`` was drawn from this state (not before a restore, not by another buffer)."""
        return batch.source is self.epoch

    def draw_into(self, out: Mapping[str, torch.Tensor], beta: torch.Tensor, mode: int | None = None) -> None:
        """Draw ``len(out["indices"])`` slots into ``out`` (``rows``, ``indices``, ``generations``,
        ``weights``, normalised globally); ``mode``: the kernel mode, default the sampler's."""
        kernel_mode = self.policy.kernel_mode if mode is None else mode
        self.tree.sample_into(self.rows.words, self.seed, kernel_mode, beta, out)

    def sample_into(self, out: Mapping[str, torch.Tensor], beta: torch.Tensor, mode: int | None = None) -> None:
        """:meth:`draw_into`, then the sampler's weight normalisation."""
        self.draw_into(out, beta, mode)
        self.policy.normalise(out, self.tree, beta)

    # ---------------------------------------------------------------- priorities

    def set_priorities(
        self, indices: torch.Tensor, td: torch.Tensor, expected: torch.Tensor | None, alpha: float, eps: float
    ) -> None:
        """Priorities (or rank keys) of checked ``indices`` from TD errors; device work only."""
        self.policy.update(self.tree, PriorityUpdate(indices, td, expected, alpha, eps))

    def update_priorities(
        self,
        batch: Any | None,
        indices: torch.Tensor,
        td_errors: torch.Tensor,
        bound: int,
        strict: bool,
        alpha: float,
        eps: float,
        refresh: Callable[[], object],
        raw_filter: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """The update path every buffer shares.

        Args:
            batch: the batch the TD errors belong to (its ``indices``, ``generations`` and stamp),
                or None for raw ``indices``.
            indices: [B] slots (a batch's own, or the caller's raw ones).
            td_errors: [B] floating TD errors.
            bound: indices at or past it are out of range.
            strict: check index ranges at once on CUDA too.
            alpha, eps: the priority's exponent and offset.
            refresh: called when the sampler's refresh is due (rank mode's re-sort).
            raw_filter: applied to checked raw indices (the trajectory buffer drops non-starts).
        """
        if batch is not None and not self.is_current(batch):
            # drawn by another buffer, or by this one before a restore: every entry is stale (its
            # indices are not checked against this buffer's size: they belong to another state)
            check_td(td_errors, batch.indices, self.device)
            self.tree.count_stale(batch.indices.numel())
            return
        indices = check_indices(indices, self.device, bound, strict, "update_priorities()")
        td = check_td(td_errors, indices, self.device)
        if batch is None and raw_filter is not None:
            indices = raw_filter(indices)
        expected = check_generations(batch.generations, indices) if batch is not None else None
        args = (indices, td) if expected is None else (indices, td, expected)

        def body(idx: torch.Tensor, values: torch.Tensor, gen: torch.Tensor | None = None) -> None:
            self.set_priorities(idx, values, gen, alpha, eps)

        try:
            self.graphs.call(("update", indices.numel(), expected is not None), args, body, by_address=True)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"updating {indices.numel()} priorities") from err
        if self.policy.count_update():  # rank mode's refresh schedule
            refresh()

    # ---------------------------------------------------------------- counts and state

    def read_counts(self) -> dict[str, Any]:
        """The tree's device counters (one host sync), warning of indices dropped since the last call."""
        out = self.tree.read_counts()
        self.invalid_reported = warn_dropped(out["invalid_indices"], self.invalid_reported)
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The core's tensors of a state dict: rows, the tree's, the sampler's."""
        return {"rows": self.rows.rows} | self.tree.state_dict() | self.policy.state_dict()

    def load_tensors(self, state: Mapping[str, torch.Tensor], copy_rows: Callable[[torch.Tensor], object]) -> None:
        """Copy a checked state into place: rows by ``copy_rows(rows)``, then the tree's and sampler's."""
        copy_rows(self.rows.rows)
        self.tree.load_state_dict(state)
        self.policy.load_state_dict(state)

    def restored(self, seed: int, invalid: int, updates_since_refresh: int) -> None:
        """After a restore: the saved seed and counts, no graphs (they froze the old seed), and a new
        identity (batches drawn before are stale)."""
        self.seed = seed
        self.graphs.clear()
        self.invalid_reported = invalid  # dropped entries the saved buffer knew of are not new
        self.policy.updates_since_refresh = updates_since_refresh
        self.beta.forget()
        self.epoch = object()

    def init_args(self, cfg: ReplayConfig, strict: bool) -> dict[str, Any]:
        """The constructor arguments every buffer shares that rebuild this one (its settings, device)."""
        return {
            "capacity": cfg.capacity,
            "alpha": cfg.alpha,
            "beta": cfg.beta,
            "eps": cfg.eps,
            "sampling": cfg.sampling,
            "weight_norm": cfg.weight_norm,
            "device": str(self.device),
            "backend": self.backend,
            "seed": self.seed,
            "strict": strict,
            "cpu_fallback": False,
            "rank_refresh_interval": cfg.rank_refresh_interval,
            "arity": cfg.arity,
            "cuda_graphs": self.graphs.enabled,
        }


def rebuild(cls: type, args: dict[str, Any], state: Mapping[str, Any]) -> Any:
    """A buffer of class ``cls`` built from ``args`` holding ``state``: what ``__reduce__`` returns."""
    buffer = cls(**args)
    buffer.load_state_dict(state)
    return buffer
