"""The GPU-resident prioritized replay buffer (Schaul et al. 2016, arXiv:1511.05952).

:class:`PrioritizedReplayBuffer` owns every tensor that defines the buffer (packed storage
rows, sum and min trees, slot generations, device counters) and calls the kernels of the
chosen back end (:mod:`gper.ops`). Its methods check their input on the host from shapes,
dtypes and devices only; checks that need values held on the GPU are done on the device
(see ``strict``), so ``add``, ``sample`` and ``update_priorities`` never synchronise.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from gper._device import canonical_device
from gper._triton import HAS_TRITON
from gper.ops import BACKENDS, backend_module, reference
from gper.ops.layout import DEFAULT_ARITY, TreeLayout
from gper.ops.state import (
    C_CURSOR,
    C_INVALID,
    C_NONFINITE,
    C_RNG,
    C_SIZE,
    C_STALE,
    MODE_PROPORTIONAL,
    MODE_STRATIFIED,
    MODE_UNIFORM,
    N_COUNTERS,
    N_SCALARS,
    S_BETA,
    S_MAXP,
)
from gper.replay.batch import SampledBatch
from gper.replay.graphs import GraphCache, SampleSlot, capture, capturing
from gper.replay.storage import RowLayout

SAMPLING = ("proportional", "stratified", "rank", "uniform")
WEIGHT_NORMS = ("global", "batch")
_SAMPLE_SLOTS = 3  # captured sample outputs per batch size: a batch may still be alive while the next is drawn
_MODES = {
    "proportional": MODE_PROPORTIONAL,
    "stratified": MODE_STRATIFIED,
    "rank": MODE_PROPORTIONAL,
    "uniform": MODE_UNIFORM,
}


def _on_own_device(method: Callable) -> Callable:
    """Run ``method`` with the buffer's GPU current: Triton launches (and graph captures) go to the
    current device, not to the device of the tensors passed, so a buffer on ``cuda:1`` needs it."""

    @functools.wraps(method)
    def wrapper(self: PrioritizedReplayBuffer, *args, **kwargs):
        index = self._cuda_index
        if index is None or torch.cuda.current_device() == index:
            return method(self, *args, **kwargs)
        with torch.cuda.device(index):
            return method(self, *args, **kwargs)

    return wrapper


class GperWarning(UserWarning):
    """Warnings from gper: CPU fallback, dropped invalid input found on the device."""


def _check_unit(name: str, value: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    ok = (0.0 < value if low_open else 0.0 <= value) and value <= 1.0
    if not ok:
        raise ValueError(f"{name} must be in {'(0, 1]' if low_open else '[0, 1]'}, got {value}")
    return value


class PrioritizedReplayBuffer:
    """A ring buffer of transitions with prioritized sampling, entirely on one device.

    Args:
        capacity: slots, any integer >= 1. When full, each ``add`` overwrites the oldest items.
        spec: ``{name: (shape, dtype)}`` of a transition, e.g. ``{"obs": ((51,), torch.float32)}``.
        alpha: priority exponent in [0, 1]: a TD error ``d`` gives priority ``(|d| + eps) ** alpha``
            (in "rank" mode, sampling probability is proportional to ``rank ** -alpha``).
        beta: default importance-sampling exponent in [0, 1] (``sample(beta=...)`` overrides it).
        eps: positive offset that keeps every priority above zero.
        sampling: "proportional" (independent draws, p_i / sum p), "stratified" (one draw in each
            of B equal-mass segments), "rank" (p ∝ 1/rank^alpha, ranks refreshed every
            ``rank_refresh_interval`` updates) or "uniform".
        weight_norm: "global" divides IS weights by the largest weight any stored item could get
            (as in the PER paper); "batch" by the largest weight in the batch.
        device: where everything lives; default "cuda" when available, else "cpu".
        backend: "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch"; or, for kernel
            experiments, a module with the functions of :class:`gper.ops.ReplayKernels`.
        seed: Philox key of the sampler; same seed and same calls give the same samples.
        strict: also check index ranges on CUDA at once (costs one host sync per call); by
            default, out-of-range indices are dropped on the device, counted, and reported by
            :meth:`stats`. On the CPU they always raise at once.
        cpu_fallback: if the device runs out of memory at construction, warn and build the
            buffer on the CPU instead of raising.
        rank_refresh_interval: "rank" mode re-sorts the priorities every this many
            ``update_priorities`` calls (an O(N log N) sort; see :meth:`refresh_ranks`).
        arity: children per tree node (a power of two); 32 reads all children in one 128-byte load.
        cuda_graphs: on CUDA, capture each call shape (``add`` of n items, ``sample`` of B,
            ``update_priorities`` of B) once and replay it on later calls, which cuts the host
            time of an eager call several-fold. Calls made while the caller is capturing its own
            graph launch their kernels directly either way.
    """

    def __init__(
        self,
        capacity: int,
        spec: Mapping[str, tuple],
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        sampling: str = "proportional",
        weight_norm: str = "global",
        device: str | torch.device | None = None,
        backend: str | ModuleType = "auto",
        seed: int = 0,
        strict: bool = False,
        cpu_fallback: bool = True,
        rank_refresh_interval: int = 100,
        arity: int = DEFAULT_ARITY,
        cuda_graphs: bool = True,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.alpha = _check_unit("alpha", alpha)
        self.beta = _check_unit("beta", beta)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not (0.0 < float(eps) < float("inf")):
            raise ValueError(f"eps must be a positive finite float, got {eps!r}")
        self.eps = float(eps)
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
        if weight_norm not in WEIGHT_NORMS:
            raise ValueError(f"weight_norm must be one of {WEIGHT_NORMS}, got {weight_norm!r}")
        if isinstance(backend, str) and backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
        if (
            isinstance(rank_refresh_interval, bool)
            or not isinstance(rank_refresh_interval, int)
            or rank_refresh_interval < 1
        ):
            raise ValueError(f"rank_refresh_interval must be an int >= 1, got {rank_refresh_interval!r}")
        self.sampling = sampling
        self.weight_norm = weight_norm
        self.seed = seed
        self.strict = bool(strict)
        self.rank_refresh_interval = rank_refresh_interval
        self._backend_request = backend
        self._rows_layout = RowLayout.build(spec)
        self._tree_layout = TreeLayout.build(capacity, arity)
        device = canonical_device(device)
        try:
            self._allocate(device)
        except torch.OutOfMemoryError:
            if not cpu_fallback or device.type == "cpu":
                raise
            warnings.warn(
                f"gper: not enough memory on {device} for a buffer of {capacity} slots "
                f"({self.nbytes_estimate / 2**30:.2f} GiB); falling back to the CPU (torch back end). "
                "Pass cpu_fallback=False to raise instead.",
                GperWarning,
                stacklevel=2,
            )
            device = torch.device("cpu")
            self._allocate(device)
        self._size = 0  # host mirror: the host knows how many items it added
        self._beta_written: float | None = None
        self._updates_since_refresh = 0
        self._invalid_reported = 0  # dropped entries already warned about
        self._graphs = GraphCache() if cuda_graphs and self.device.type == "cuda" else None
        self._sample_slots: dict[int, list[SampleSlot]] = {}

    # ------------------------------------------------------------------ construction

    @property
    def nbytes_estimate(self) -> int:
        """Bytes of memory the buffer holds (an upper bound, before its CUDA graphs' outputs)."""
        lay = self._tree_layout
        cap = lay.capacity
        trees = 2 * 4 * (lay.numel + 1)
        generations, claims = 4 * cap, 8 * (cap + lay.arity)
        keys = 4 * (cap + 1) if self.sampling == "rank" else 0
        return cap * self._rows_layout.row_bytes + trees + generations + claims + keys

    def _allocate(self, device: torch.device) -> None:
        """Choose the back end for ``device`` and allocate every tensor there."""
        cap, lay = self._tree_layout.capacity, self._tree_layout
        self.device = device
        self._cuda_index = device.index if device.type == "cuda" else None
        if isinstance(self._backend_request, str):
            self.backend = self._resolve_backend(self._backend_request, device)
            self._ops = backend_module(self.backend)
        else:  # a kernel module of the caller's (kernel experiments: benchmarks/ablation.py)
            self._ops = self._backend_request
            self.backend = getattr(self._ops, "__name__", type(self._ops).__name__)
        self._rows = torch.zeros(cap, self._rows_layout.row_bytes, dtype=torch.uint8, device=device)
        self._tree = torch.zeros(lay.numel + 1, dtype=torch.float32, device=device)
        self._mintree = torch.full((lay.numel + 1,), float("inf"), dtype=torch.float32, device=device)
        self._gen = torch.zeros(cap, dtype=torch.int32, device=device)
        self._owner = self._ops.make_scratch(lay, device)
        self._counters = torch.zeros(N_COUNTERS, dtype=torch.int64, device=device)
        self._scalars = torch.zeros(N_SCALARS, dtype=torch.float32, device=device)
        self._scalars[S_MAXP] = 1.0  # new items enter at the max priority seen, 1 until then
        self._key = torch.zeros(cap + 1, dtype=torch.float32, device=device) if self.sampling == "rank" else None
        self._words = self._rows.view(torch.int32)
        self._field_views = self._rows_layout.views(self._rows)
        self._beta = self._scalars[S_BETA]

    @staticmethod
    def _resolve_backend(backend: str, device: torch.device) -> str:
        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        if backend == "auto":
            return "triton" if HAS_TRITON and device.type == "cuda" else "torch"
        if backend == "triton":
            if not HAS_TRITON:
                raise ImportError("backend='triton' needs the triton package (pip install triton)")
            if device.type != "cuda" and not interpret:
                raise ValueError(f"backend='triton' runs on CUDA (or on CPU under TRITON_INTERPRET=1), not {device}")
        return backend

    # ------------------------------------------------------------------ properties

    @property
    def capacity(self) -> int:
        return self._tree_layout.capacity

    @property
    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return self._rows_layout.spec()

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Views ``[capacity, *shape]`` of every field's storage (read them; write through ``add``)."""
        return dict(self._field_views)

    def __len__(self) -> int:
        """Filled slots, as the host knows it (adds replayed from a CUDA graph show after :meth:`stats`)."""
        return self._size

    def __repr__(self) -> str:
        return (
            f"PrioritizedReplayBuffer(capacity={self.capacity}, size={self._size}, sampling={self.sampling!r}, "
            f"device={str(self.device)!r}, backend={self.backend!r}, fields={list(self.spec)})"
        )

    # ------------------------------------------------------------------ add

    @_on_own_device
    def add(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Append a batch of transitions at the current max priority, overwriting the oldest when full.

        Args:
            data: every spec field, each ``[n, *shape]`` with the spec's dtype, on the buffer's
                device (copied device to device) or on the CPU. If ``n > capacity`` only the last
                ``capacity`` items are kept.

        Returns:
            [min(n, capacity)] int64 slots written, on the device.
        """
        n = self._rows_layout.check_batch(data, self.device)
        kept = min(n, self.capacity)
        skip = n - kept
        names = [f.name for f in self._rows_layout.fields]
        args = tuple(data[name][skip:] if skip else data[name] for name in names)
        if self._use_graphs():
            key = ("add", n) + tuple((a.dtype, a.device.type) for a in args)
            on_device = all(a.device == self.device for a in args)
            run = self._graphs.run_by_address if on_device else self._graphs.run
            pos, replayed = run(key, args, lambda *xs: self._add(xs, n, skip))
            pos = pos.clone() if replayed else pos
        else:
            pos = self._add(args, n, skip)
        self._size = min(self._size + n, self.capacity)
        return pos

    def _add(self, fields: tuple[torch.Tensor, ...], n: int, skip: int) -> torch.Tensor:
        ops = self._ops
        pos = ops.add_positions(self._counters, self.capacity, n - skip, skip)
        for view, x in zip(self._field_views.values(), fields, strict=True):
            view.index_copy_(0, pos, x.to(self.device, non_blocking=True))
        rank = self.sampling == "rank"
        if rank:
            self._key[pos] = self._scalars[S_MAXP]
        # in rank mode new items take rank 1 (probability weight 1 ** -alpha) until the next refresh
        ops.add_commit(
            self._tree,
            self._mintree,
            self._tree_layout,
            self._gen,
            self._counters,
            self._scalars,
            pos,
            n,
            1.0 if rank else None,
        )
        return pos

    def _use_graphs(self) -> bool:
        return self._graphs is not None and not capturing()

    # ------------------------------------------------------------------ sample

    def _set_beta(self, beta: float | torch.Tensor | None) -> torch.Tensor:
        """The 0-d float32 device tensor the sampling kernel reads this call's beta from.

        A float32 tensor of the caller's is read where it is (no copy kernel) unless the call
        replays the buffer's own graph, whose kernel reads the buffer's scalar."""
        if isinstance(beta, torch.Tensor):
            if beta.dim() != 0 or not beta.dtype.is_floating_point or beta.device != self.device:
                raise ValueError(
                    f"beta tensor must be a 0-d float tensor on {self.device}, got shape {tuple(beta.shape)} "
                    f"{beta.dtype} on {beta.device}"
                )
            if beta.dtype == torch.float32 and not self._use_graphs():
                return beta
            self._beta.copy_(beta)
            self._beta_written = None
            return self._beta
        value = self.beta if beta is None else _check_unit("beta", beta)
        if value != self._beta_written:
            self._beta.fill_(value)
            self._beta_written = value
        return self._beta

    @_on_own_device
    def sample(self, batch_size: int, beta: float | torch.Tensor | None = None) -> SampledBatch:
        """Draw ``batch_size`` transitions with replacement, with their IS weights.

        Args:
            batch_size: B >= 1.
            beta: IS exponent for this call: a float in [0, 1], or a 0-d float device tensor
                (read on the device, so an annealed beta can change between CUDA-graph replays);
                default the buffer's ``beta``.

        Returns:
            A :class:`SampledBatch` of fresh tensors on the device.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._size == 0:
            raise RuntimeError("sample(): the buffer is empty; add() transitions first")
        beta_t = self._set_beta(beta)
        if self._use_graphs():
            return self._sample_graphed(batch_size)
        return self._batch_of(self._split(self._sample(batch_size, beta_t), batch_size))

    def _split(self, flat: torch.Tensor, b: int) -> dict[str, torch.Tensor]:
        """The parts of a flat sample output: rows [B*W], indices [2B as int64], generations [B], weights [B]."""
        w = self._rows_layout.words
        return {
            "rows": flat[: b * w].view(b, w),
            "indices": flat[b * w : b * w + 2 * b].view(torch.int64),
            "generations": flat[b * w + 2 * b : b * w + 3 * b],
            "weights": flat[b * w + 3 * b :].view(torch.float32),
        }

    def _batch_of(self, parts: dict[str, torch.Tensor], with_fields: bool = False) -> SampledBatch:
        """A batch over ``parts``; ``with_fields`` takes the field views from ``parts`` too (sample slots)."""
        fields = {name: parts[name] for name in self.spec} if with_fields else None
        return SampledBatch(
            self._rows_layout, parts["rows"], parts["indices"], parts["weights"], parts["generations"], fields
        )

    def _sample_graphed(self, b: int) -> SampledBatch:
        slots = self._sample_slots.setdefault(b, [])
        for slot in slots:
            if slot.free():
                slot.graph.replay()
                return self._batch_of(slot.tensors, with_fields=True)
        flat = self._sample(b)  # this call's result; it also compiles the kernel before capture
        if len(slots) < _SAMPLE_SLOTS:
            graph = torch.cuda.CUDAGraph()
            with capture(graph):
                static = self._sample(b)
            tensors = self._split(static, b)
            tensors.update(self._rows_layout.views(tensors["rows"]))
            slots.append(SampleSlot(graph, static, tensors))
        return self._batch_of(self._split(flat, b))

    def _sample(self, b: int, beta: torch.Tensor | None = None) -> torch.Tensor:
        """Sample ``b`` draws into one flat int32 tensor (see :meth:`_split` for its parts);
        ``beta`` is the 0-d float32 tensor the kernel reads (default the buffer's scalar)."""
        flat = torch.empty(b * (self._rows_layout.words + 4), dtype=torch.int32, device=self.device)
        out = self._split(flat, b)
        self._ops.sample(
            self._tree,
            self._mintree,
            self._tree_layout,
            self._words,
            self._gen,
            self._counters,
            self.seed,
            b,
            _MODES[self.sampling],
            self._beta if beta is None else beta,
            out["rows"],
            out["indices"],
            out["generations"],
            out["weights"],
        )
        if self.weight_norm == "batch" and self.sampling != "uniform":
            # w_i / max_j w_j = (p_i / min_j p_j) ** -beta over the batch
            out["weights"].div_(out["weights"].amax())
        return flat

    # ------------------------------------------------------------------ priorities

    def _check_indices(self, indices: object, what: str) -> torch.Tensor:
        if not isinstance(indices, torch.Tensor):
            raise TypeError(f"{what}: indices must be a torch.Tensor, got {type(indices).__name__}")
        if indices.dim() != 1:
            raise ValueError(f"{what}: indices must be 1-D [B], got shape {tuple(indices.shape)}")
        if indices.numel() == 0:
            raise ValueError(f"{what}: empty batch of indices")
        if indices.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{what}: indices must be int64 or int32, got {indices.dtype}")
        if indices.device != self.device:
            raise ValueError(f"{what}: indices are on {indices.device}, expected {self.device}")
        if self.device.type == "cpu" or self.strict:
            lo, hi = int(indices.min()), int(indices.max())
            if lo < 0 or hi >= self._size:
                bad = lo if lo < 0 else hi
                raise IndexError(f"{what}: index {bad} out of range [0, {self._size}) (filled slots)")
        return indices.long()

    @_on_own_device
    def update_priorities(self, batch_or_indices: SampledBatch | torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set priorities ``(|td| + eps) ** alpha`` for sampled slots.

        Args:
            batch_or_indices: the :class:`SampledBatch` the TD errors belong to (entries whose slot
                was overwritten since sampling are ignored), or raw [B] slot indices (no such check).
            td_errors: [B] floating tensor on the buffer's device. NaN and ±Inf become the current
                max priority and are counted (:meth:`stats`). For duplicate slots the last wins.
        """
        if isinstance(batch_or_indices, SampledBatch):
            indices, expected = batch_or_indices.indices, batch_or_indices.generations
        else:
            indices, expected = batch_or_indices, None
        indices = self._check_indices(indices, "update_priorities()")
        if not isinstance(td_errors, torch.Tensor):
            raise TypeError(f"update_priorities(): td_errors must be a torch.Tensor, got {type(td_errors).__name__}")
        if not td_errors.dtype.is_floating_point:
            raise TypeError(f"update_priorities(): td_errors must be floating point, got {td_errors.dtype}")
        if td_errors.shape != indices.shape:
            raise ValueError(
                f"update_priorities(): td_errors has shape {tuple(td_errors.shape)}, expected ({indices.numel()},) "
                "to match the indices"
            )
        if td_errors.device != self.device:
            raise ValueError(f"update_priorities(): td_errors are on {td_errors.device}, expected {self.device}")
        if expected is not None and (expected.shape != indices.shape or expected.device != self.device):
            raise ValueError("update_priorities(): the batch's generations do not match its indices")
        td = td_errors.detach().float()
        args = (indices, td) if expected is None else (indices, td, expected)
        if self._use_graphs():
            self._graphs.run_by_address(("update", indices.numel(), expected is not None), args, self._update)
        else:
            self._update(*args)
        if self.sampling == "rank":
            self._updates_since_refresh += 1
            if self._updates_since_refresh >= self.rank_refresh_interval:
                self.refresh_ranks()

    def _update(self, indices: torch.Tensor, td: torch.Tensor, expected: torch.Tensor | None = None) -> None:
        rank = self.sampling == "rank"
        self._ops.update(
            self._key if rank else self._tree,
            self._mintree,
            self._tree_layout,
            self._owner,
            self._gen,
            self._counters,
            self._scalars,
            indices.contiguous(),
            td.contiguous(),
            expected,
            1.0 if rank else self.alpha,
            self.eps,
            leaf_only=rank,
        )

    def priorities(self, indices: torch.Tensor) -> torch.Tensor:
        """Stored sampling priorities of ``indices`` ([B] float32, after alpha).

        In "rank" mode these are the rank weights ``rank ** -alpha`` from the last refresh. On
        CUDA without ``strict``, out-of-range entries come back as NaN instead of raising.
        """
        indices = self._check_indices(indices, "priorities()")
        ok = (indices >= 0) & (indices < self._counters[C_SIZE])
        leaf = self._tree[self._tree_layout.leaf_offset + torch.where(ok, indices, 0)]
        return torch.where(ok, leaf, float("nan"))

    @_on_own_device
    def refresh_ranks(self) -> None:
        """Rank mode: re-sort the stored priorities and give slot of rank r the weight ``r ** -alpha``.

        An argsort of the filled slots (O(N log N); about 1.5 ms at 2^25 on an H200, per
        ``shared/research/algorithms.md`` section 5) plus a rebuild of the tree. Between refreshes
        ranks are stale, as in the PER paper; new items count as rank 1. Called automatically
        every ``rank_refresh_interval`` updates; inside a CUDA graph call it yourself.
        """
        if self.sampling != "rank":
            raise RuntimeError("refresh_ranks() applies to sampling='rank' only")
        n = self._size
        self._updates_since_refresh = 0
        if n == 0:
            return
        order = torch.argsort(self._key[:n], descending=True, stable=True)
        rank = torch.empty(n, dtype=torch.float32, device=self.device)
        rank[order] = torch.arange(1, n + 1, dtype=torch.float32, device=self.device)
        weight = rank.pow(-self.alpha)
        lo = self._tree_layout.leaf_offset
        self._tree[lo : lo + n] = weight
        self._mintree[lo : lo + n] = weight
        reference.rebuild(self._tree, self._mintree, self._tree_layout)

    # ------------------------------------------------------------------ device state

    def stats(self) -> dict[str, Any]:
        """Read the device counters (one host sync) and refresh the host's view of the size.

        Returns:
            dict with ``size``, ``cursor``, ``max_priority``, ``total_priority``, ``rng_offset``, and
            the running counts ``invalid_indices`` (dropped update entries), ``stale_updates``
            (ignored because the slot was overwritten since sampling) and ``nonfinite_td``.

        Warns:
            GperWarning: when invalid indices were dropped since the last call.
        """
        c = self._counters.tolist()
        s = self._scalars.tolist()
        lay = self._tree_layout
        total = float(self._tree[lay.offsets[0] : lay.offsets[0] + lay.arity].double().sum())
        self._size = int(c[C_SIZE])
        out = {
            "size": int(c[C_SIZE]),
            "cursor": int(c[C_CURSOR]),
            "max_priority": s[S_MAXP],
            "total_priority": total,
            "rng_offset": int(c[C_RNG]),
            "invalid_indices": int(c[C_INVALID]),
            "stale_updates": int(c[C_STALE]),
            "nonfinite_td": int(c[C_NONFINITE]),
        }
        new = out["invalid_indices"] - self._invalid_reported
        if new > 0:
            warnings.warn(
                f"gper: {new} update entries had indices outside [0, size) and were dropped "
                "(pass strict=True to raise at the call instead)",
                GperWarning,
                stacklevel=2,
            )
        self._invalid_reported = out["invalid_indices"]
        return out

    # ------------------------------------------------------------------ checkpoint

    def _config(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "spec": {n: (list(shape), str(dtype)) for n, (shape, dtype) in self.spec.items()},
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "sampling": self.sampling,
            "weight_norm": self.weight_norm,
            "arity": self._tree_layout.arity,
            # where each field sits in a storage row: rows saved with another packing (an older
            # gper ordered fields differently) are refused rather than read as scrambled fields
            "row_layout": {f.name: f.offset for f in self._rows_layout.fields}
            | {"row_bytes": self._rows_layout.row_bytes},
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything that defines the buffer: data, trees, generations, cursor, size, RNG state.

        The tensors are the buffer's own (not copies), as with ``nn.Module.state_dict``; save
        them with ``torch.save`` or copy them before changing the buffer.
        """
        sd = {
            "config": self._config(),
            "seed": self.seed,
            "rows": self._rows,
            "tree": self._tree,
            "mintree": self._mintree,
            "gen": self._gen,
            "counters": self._counters,
            "scalars": self._scalars,
            "host": {"size": self._size, "updates_since_refresh": self._updates_since_refresh},
        }
        if self._key is not None:
            sd["key"] = self._key
        return sd

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` in place (tensors keep their addresses, so captured
        CUDA graphs stay valid). The restored buffer draws the same samples as the original.

        Raises:
            ValueError: the state comes from a buffer of another configuration, or is incomplete.
        """
        mine = self._config()
        theirs = state.get("config") if isinstance(state, Mapping) else None
        if theirs != mine:
            diff = sorted(k for k in mine if not isinstance(theirs, Mapping) or theirs.get(k) != mine[k])
            raise ValueError(f"load_state_dict(): configuration differs in {diff}")
        names = ["rows", "tree", "mintree", "gen", "counters", "scalars"] + (["key"] if self._key is not None else [])
        for name in names:
            src, dst = state.get(name), getattr(self, f"_{name}")
            if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(f"load_state_dict(): {name!r} missing or of the wrong shape/dtype")
        host = state.get("host")
        seed = state.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise ValueError(f"load_state_dict(): 'seed' missing or invalid: {seed!r}")
        if not isinstance(host, Mapping) or not {"size", "updates_since_refresh"} <= host.keys():
            raise ValueError("load_state_dict(): 'host' missing or incomplete")
        for name in names:
            getattr(self, f"_{name}").copy_(state[name])
        self.seed = seed
        if self._graphs is not None:
            self._graphs.clear()  # graphs froze the old seed
            self._sample_slots.clear()
        self._size = int(host["size"])
        self._updates_since_refresh = int(host["updates_since_refresh"])
        self._beta_written = None
