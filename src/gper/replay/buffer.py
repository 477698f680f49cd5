"""The GPU-resident prioritized replay buffer (Schaul et al. 2016, arXiv:1511.05952).

:class:`PrioritizedReplayBuffer` is a façade over a :class:`~gper.replay.core.ReplayCore`: the
packed rows (:class:`~gper.replay.storage.RowStorage`), the priority tree
(:class:`~gper.replay.tree.PriorityTree`), the sampler (:mod:`gper.replay.samplers`), its CUDA
graphs and the update, restore and copy paths every buffer shares. It checks input on the
host from shapes, dtypes and devices only (checks that need device values are done on the
device: see ``strict``), so ``add``, ``sample`` and ``update_priorities`` never synchronise, and
it replays each call shape from a CUDA graph of its own (:mod:`gper.replay.graphs`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from gper._device import on_own_device
from gper.replay.batch import FlatSample, SampledBatch
from gper.replay.checkpoint import PREFIX_TENSORS, check_contents, check_state, widen_prefixes
from gper.replay.checks import (
    check_batch_size,
    check_indices,
    out_of_memory,
)
from gper.replay.config import BufferSettings, ReplayConfig, ReplaySettings, takes_settings, with_defaults
from gper.replay.core import ReplayCore, rebuild
from gper.replay.files import TensorFile, write_tensors
from gper.replay.instances import Member
from gper.replay.storage import RowLayout

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

#: captured sample outputs per batch size: a batch may still be alive while the next is drawn
_SAMPLE_SLOTS = 3


class PrioritizedReplayBuffer(BufferSettings):
    """A ring buffer of transitions with prioritized sampling, entirely on one device.

    Every argument after ``spec`` is a keyword-only setting. They are declared once, as
    :class:`~gper.replay.config.ReplaySettings`, with their defaults in
    :data:`gper.replay.config.DEFAULTS`; the other buffers take them too and refer here.

    Args:
        capacity: slots, any integer >= 1. When full, each ``add`` overwrites the oldest items.
        spec: ``{name: (shape, dtype)}`` of a transition, e.g. ``{"obs": ((51,), torch.float32)}``.

    Keyword Args:
        alpha (default 0.6): priority exponent in [0, 1]: a TD error ``d`` gives priority
            ``(|d| + eps) ** alpha`` (in "rank" mode, sampling probability is proportional to
            ``rank ** -alpha``).
        beta (default 0.4): default importance-sampling exponent in [0, 1] (``sample(beta=...)``
            overrides it).
        eps (default 1e-06): positive offset that keeps every priority above zero.
        sampling (default "proportional"): "proportional" (independent draws, p_i / sum p), "stratified"
            (one draw in each of B equal-mass segments), "rank" (p ∝ 1/rank^alpha, ranks
            refreshed every ``rank_refresh_interval`` updates) or "uniform".
        weight_norm (default "global"): "global" divides IS weights by the largest weight any stored item
            could get (as in the PER paper); "batch" by the largest weight in the batch.
        device (default None): where everything lives; None is "cuda" when available, else "cpu".
        backend (default "auto"): "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch"; or, for
            kernel experiments, a module with the functions of :class:`gper.ops.ReplayKernels`.
            Before Triton is used on a device, a small run of its kernels is checked against the
            torch back end (once per device and process, :mod:`gper.ops.probe`): if they fail to
            compile, launch or agree, "auto" warns and uses the torch back end on the same device
            (same samples, slower), and "triton" raises.
        seed (default 0): Philox key of the sampler; same seed and same calls give the same samples.
        strict (default False): also check index ranges on CUDA at once (costs one host sync per call);
            otherwise out-of-range indices are dropped on the device, counted, and reported by
            :meth:`stats`. On the CPU they always raise at once.
        arity (default 32): children per tree node (a power of two); 32 reads all children in one
            128-byte load.
        cuda_graphs (default True): on CUDA, capture each call shape (``add`` of n items, ``sample`` of B,
            ``update_priorities`` of B) once and replay it on later calls, which cuts the host
            time of an eager call several-fold. Calls made while the caller is capturing its own
            graph launch their kernels directly either way.
        cpu_fallback (default True): if the device runs out of memory at construction, warn and build the
            buffer on the CPU instead of raising.
        rank_refresh_interval (default 100): "rank" mode re-sorts the priorities every this many
            ``update_priorities`` calls (an O(N log N) sort; see :meth:`refresh_ranks`).
        instances (default None): N independent buffers in one storage (a population of agents,
            a sweep of settings), each with its own tree, cursor, size, generations, counters, max
            priority and random stream: instance ``i`` draws exactly what a buffer of ``seed + i``
            draws. Every call serves all N at once: ``add`` takes ``[N, n, *shape]`` per field,
            ``sample(B)`` returns fields ``[N, B, *shape]`` with ``indices``, ``generations`` and
            ``weights`` ``[N, B]``, ``update_priorities`` takes ``[N, B]``; ``alpha``, ``beta`` and
            ``eps`` may then be N values (a list or an [N] tensor). See ``docs/instances.md``.

    Raises:
        TypeError, ValueError: a bad or unknown setting, before anything is allocated.
    """

    def __new__(cls, *args: Any, **settings: Any) -> PrioritizedReplayBuffer:
        if cls is PrioritizedReplayBuffer and settings.get("instances") is not None:
            from gper.replay.buffer_instances import PrioritizedReplayInstances

            cls = PrioritizedReplayInstances  # noqa: PLW0642 - the stacked kind of this buffer
        return super().__new__(cls)

    @takes_settings(ReplaySettings)
    def __init__(self, capacity: int, spec: Mapping[str, tuple], **settings: Unpack[ReplaySettings]) -> None:
        self._build(capacity, spec, with_defaults("PrioritizedReplayBuffer", settings))

    # ``help()`` and ``inspect.signature`` show the settings ``__init__`` takes, not ``__new__``'s catch-all
    __new__.__signature__ = __init__.__signature__  # type: ignore[attr-defined]

    @classmethod
    def _instance(cls, capacity: int, spec: Mapping[str, tuple], given: dict[str, Any], member: Member):
        """Instance ``member.index`` of a buffer of several: a buffer of ``given`` settings whose
        tensors are views of ``member``'s stack."""
        self = object.__new__(cls)
        self._build(capacity, spec, given, member)
        return self

    def _build(
        self, capacity: int, spec: Mapping[str, tuple], given: dict[str, Any], member: Member | None = None
    ) -> None:
        cfg = ReplayConfig.check(capacity, given)
        self._cfg = cfg
        self.strict = bool(given["strict"])
        self._backend_request = given["backend"]
        self._row_layout = RowLayout.build(spec)
        #: bytes of memory the buffer holds (an upper bound, before its CUDA graphs' outputs)
        self.nbytes_estimate = cfg.estimate_bytes(self._row_layout.row_bytes)  # checks arity too
        self._core = ReplayCore.build(cfg, self._row_layout, given, _SAMPLE_SLOTS, self.nbytes_estimate, member=member)
        self._add_plan = self.tree.add_plan(self.rows.field_bytes, self._row_layout.words)
        self._size = 0  # filled slots, as the host knows it (adds replayed from a graph show after stats())
        self._flat = FlatSample(self._row_layout)

    @property
    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return self._row_layout.spec()

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Views ``[capacity, *shape]`` of every field's storage (read them; write through ``add``)."""
        return dict(self.rows.fields)

    def __repr__(self) -> str:
        return (
            f"PrioritizedReplayBuffer(capacity={self.capacity}, size={self._size}, sampling={self.sampling!r}, "
            f"device={str(self.device)!r}, backend={self.backend!r}, fields={list(self.spec)})"
        )

    @on_own_device
    def add(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Append a batch of transitions at the current max priority, overwriting the oldest when full.

        Args:
            data: every spec field, each ``[n, *shape]`` with the spec's dtype, on the buffer's
                device (copied device to device) or on the CPU. If ``n > capacity`` only the last
                ``capacity`` items are kept.

        Returns:
            [min(n, capacity)] int64 slots written, on the device.
        """
        n = self.rows.check_batch(data)
        skip = n - min(n, self.capacity)
        args = self.rows.own_copies(tuple(data[name][skip:] if skip else data[name] for name in self.rows.names))
        try:
            graphs = self._core.graphs
            if not graphs.active:
                pos, replayed = self._add(args, n, skip), False
            else:
                key = ("add", n) + tuple((a.dtype, a.device.type) for a in args)
                on_device = all(a.device == self.device for a in args)
                pos, replayed = graphs.call(key, args, lambda *xs: self._add(xs, n, skip), by_address=on_device)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"adding {n} transitions") from err
        self._size = min(self._size + n, self.capacity)
        return pos.clone() if replayed else pos

    def _add(self, fields: tuple[torch.Tensor, ...], n: int, skip: int) -> torch.Tensor:
        values = self.rows.on_device(fields)
        pos = self.tree.add_rows(
            self.rows.words, self.rows.field_bytes, values, self._add_plan, skip, n, self.policy.new_item_value
        )
        self.policy.on_add(self.tree, pos)
        return pos

    @on_own_device
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
        b = check_batch_size(batch_size)
        if self._size == 0:
            raise RuntimeError("sample(): the buffer is empty; add() transitions first")
        graphs = self._core.graphs
        graphed = graphs.active
        # the default beta was checked when it was set: only a caller's beta is checked here
        beta_t = self._core.beta.tensor(self._cfg.beta if beta is None else beta, graphed, checked=beta is None)
        try:
            if not graphed:
                batch = self._flat.batch(self._draw(b, beta_t))
            else:
                run = graphs.samples.run
                out, replayed = run(b, lambda: self._sample(b, self.tree.beta), self._flat.with_fields)
                batch = self._flat.batch(out, with_fields=True) if replayed else self._flat.batch(self._flat.split(out))
        except torch.OutOfMemoryError as err:
            # the outputs are allocated before any kernel runs: running out there changes nothing
            raise out_of_memory(err, self.device, f"drawing a batch of {b}") from err
        return self._core.stamp(batch)

    def _sample(self, b: int, beta: torch.Tensor) -> torch.Tensor:
        """A sample's outputs, as the one flat tensor a captured graph keeps."""
        return self._draw(b, beta)["flat"]

    def _draw(self, b: int, beta: torch.Tensor) -> dict[str, torch.Tensor]:
        """A sample's outputs, each a view of ``["flat"]`` (:meth:`FlatSample.split`)."""
        flat = self._flat.empty(b, self.device)
        out = self._flat.split(flat)
        self._core.sample_into(out, beta)
        return out | {"flat": flat}

    @on_own_device
    def update_priorities(self, batch_or_indices: SampledBatch | torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set priorities ``(|td| + eps) ** alpha`` for sampled slots.

        Args:
            batch_or_indices: the :class:`SampledBatch` the TD errors belong to (entries whose slot
                was overwritten since sampling are ignored, and so is a whole batch drawn before a
                :meth:`load_state_dict` or by another buffer), or raw [B] slot indices (no such check).
            td_errors: [B] floating tensor on the buffer's device. NaN and ±Inf become the current
                max priority and are counted (:meth:`stats`). For duplicate slots the last wins.
        """
        batch = batch_or_indices if isinstance(batch_or_indices, SampledBatch) else None
        indices = batch.indices if batch is not None else batch_or_indices
        self._core.update_priorities(
            batch, indices, td_errors, self._size, self.strict, self.alpha, self.eps, self.refresh_ranks
        )

    def priorities(self, indices: torch.Tensor) -> torch.Tensor:
        """Stored sampling priorities of ``indices`` ([B] float32, after alpha).

        In "rank" mode these are the rank weights ``rank ** -alpha`` from the last refresh. On
        CUDA without ``strict``, out-of-range entries come back as NaN instead of raising.
        """
        return self.tree.priorities(check_indices(indices, self.device, self._size, self.strict, "priorities()"))

    @on_own_device
    def refresh_ranks(self) -> None:
        """Rank mode: re-sort the stored priorities and give slot of rank r the weight ``r ** -alpha``.

        An argsort of the filled slots (O(N log N)) plus a dense rebuild of the tree. Between
        refreshes ranks are stale, as in the PER paper; new items count as rank 1. Called
        automatically every ``rank_refresh_interval`` updates; inside a CUDA graph call it yourself.
        """
        if self.policy.rank is None:
            raise RuntimeError("refresh_ranks() applies to sampling='rank' only")
        self.policy.rank.refresh(self.tree, self._size, self.alpha)

    def stats(self) -> dict[str, Any]:
        """Read the device counters (one host sync) and refresh the host's view of the size.

        Returns:
            dict with ``size``, ``cursor``, ``max_priority``, ``total_priority``, ``rng_offset``, and
            the running counts ``invalid_indices`` (dropped update entries), ``stale_updates``
            (ignored because the slot was overwritten since sampling) and ``nonfinite_td``.

        Warns:
            GperWarning: when invalid indices were dropped since the last call.
        """
        out = self._core.read_counts()
        self._size = out["size"]
        return out

    def _tensors(self) -> dict[str, torch.Tensor]:
        return self._core.state_tensors()

    def _config(self) -> dict[str, Any]:
        return self._cfg.checkpoint(self._row_layout)

    def state_dict(self) -> dict[str, Any]:
        """Everything that defines the buffer: data, trees, generations, cursor, size, RNG state.

        The tensors are the buffer's own (not copies), as with ``nn.Module.state_dict``; save
        them with ``torch.save`` or copy them before changing the buffer.
        """
        return {"config": self._config(), "seed": self.seed} | self._tensors() | {"host": self._host_counts()}

    def _host_counts(self) -> dict[str, int]:
        return {"size": self._size, "updates_since_refresh": self.policy.updates_since_refresh}

    def load_state_dict(self, state: Mapping[str, Any], before_copy: Callable[[], object] | None = None) -> None:
        """Restore a :meth:`state_dict` in place (tensors keep their addresses, so captured
        CUDA graphs stay valid). The restored buffer draws the same samples as the original.

        The state is checked whole before anything is copied (its settings, every tensor's
        shape and dtype, and what the tree's tensors hold: see :func:`gper.replay.checkpoint.check_contents`),
        which costs one host sync. Batches sampled before the load count as stale afterwards:
        ``update_priorities`` ignores them (and counts them in ``stats()["stale_updates"]``).

        ``rows`` and ``gen`` may hold the filled slots only (their first ``size`` entries, as
        :meth:`save` writes them); the slots past them then read as 0.

        Args:
            state: a :meth:`state_dict`.
            before_copy: called once every check has passed and before anything changes (a
                sharded buffer's ranks agree there: one refusal stops every rank).

        Raises:
            ValueError: the state comes from a buffer of another configuration, is incomplete,
                or is corrupt (naming what is wrong); the buffer is then unchanged.
        """
        state, held = widen_prefixes(state, self._tensors())
        self._restore(state, lambda rows: rows.copy_(state["rows"]), rows_held=held, before_copy=before_copy)

    def save(self, path: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> int:
        """Write the buffer's state to a safetensors file at ``path``, atomically and a chunk at a time.

        The host holds one chunk (:data:`gper.replay.files.CHUNK_BYTES`) at a time, whatever the
        buffer's size; the file appears at ``path`` only once complete (a crash leaves the old
        one). Nothing in it is pickled: :meth:`load` reads it back. It holds the rows and
        generations of the filled slots only (a buffer filled to 1% writes about 1% of its rows)
        and the trees whole (8 bytes a slot of capacity).

        Args:
            path: the file to write (conventionally ``*.safetensors``).
            progress: called as ``progress(bytes_done, bytes_total)`` after each chunk.

        Returns:
            bytes written.
        """
        meta = {"config": self._config(), "seed": self.seed, "host": self._host_counts()}
        tensors = self._tensors()
        # filled slots are 0..size-1 (a ring fills in order): the rows and generations past them
        # are never read, so the file holds only the filled ones and costs what the buffer holds
        filled = int(self.tree.size)  # the device's count (adds replayed from a graph count too)
        for name in PREFIX_TENSORS:
            tensors[name] = tensors[name][:filled]
        return write_tensors(path, tensors, meta, progress)

    def load(self, path: str | os.PathLike, before_copy: Callable[[], object] | None = None) -> None:
        """Restore the state of a file written by :meth:`save`, in place, with the checks of
        :meth:`load_state_dict`; the rows are read a chunk at a time.

        Args:
            path: the file.
            before_copy: as :meth:`load_state_dict`'s.

        Raises:
            ValueError: the file is missing, damaged, not a buffer file, from a buffer of other
                settings, or corrupt (naming what is wrong); the buffer is then unchanged.
            RuntimeError: the file was cut short in place after its checks passed, while its
                rows were being read: the buffer then holds part of it (the message says so). A
                save that replaces the file meanwhile cannot do this: the open file is read.
        """
        with TensorFile(path) as f:
            meta = f.metadata
            state: dict[str, Any] = {"config": meta.get("config"), "seed": meta.get("seed"), "host": meta.get("host")}
            mine = self._tensors()
            held: dict[str, int] = {}  # the filled slots' rows and generations, when the file holds only those
            for name in mine:
                if name not in f.keys():
                    raise ValueError(f"load(): {path} has no tensor {name!r}")
                shape, dtype = f.meta(name)
                full = mine[name].shape
                if name in PREFIX_TENSORS and len(shape) == len(full) and shape[1:] == full[1:] and shape[0] <= full[0]:
                    held[name] = shape[0]
                    shape = full  # checked as the whole tensor; the slots past the filled ones read as 0
                if name == "rows" or (shape, dtype) != (full, mine[name].dtype):
                    # a stand-in carries the shape: the rows are read into place only after every
                    # check, and a tensor of the wrong shape is refused by them
                    state[name] = torch.empty(shape, dtype=dtype, device="meta")
                else:  # read to the device a chunk at a time (the filled slots' part): the checks run there
                    state[name] = torch.zeros(shape, dtype=dtype, device=self.device)
                    try:
                        f.copy_into(name, state[name][: held.get(name, full[0])])
                    except (OSError, ValueError) as err:
                        raise ValueError(f"load(): {err}") from err
            n = held.get("rows", self.capacity)
            read = lambda rows: self._read_rows(f, rows, n, path)  # noqa: E731
            self._restore(state, read, json_config=True, rows_held=n, before_copy=before_copy)

    def _read_rows(self, f: TensorFile, rows: torch.Tensor, n: int, path: str | os.PathLike) -> None:
        try:
            f.copy_into("rows", rows[:n])
            rows[n:].zero_()
        except OSError as err:
            # the file was checked whole, then changed under the open file (truncated in place):
            # the rows are partly overwritten, so the buffer no longer holds a consistent state
            raise RuntimeError(
                f"load(): {path} could not be read to the end after its checks passed ({err}); the buffer "
                "now holds part of it: load a complete file into it, or build a new one"
            ) from err

    def _restore(
        self,
        state: Mapping[str, Any],
        copy_rows: Callable[[torch.Tensor], object],
        json_config: bool = False,
        rows_held: int | None = None,
        before_copy: Callable[[], object] | None = None,
    ) -> None:
        config = json.loads(json.dumps(self._config())) if json_config else self._config()
        seed, host = check_state(state, config, self._tensors())
        size, invalid = check_contents(state, self.tree.layout, host["size"], self.device)
        if rows_held is not None and rows_held < size:
            raise ValueError(f"load_state_dict(): the state holds the rows of {rows_held} slots, but {size} are filled")
        if before_copy is not None:
            before_copy()
        with torch.no_grad():  # tensors that require grad must not pull the buffer into autograd
            self._core.load_tensors(state, copy_rows)
        self._size = size  # the device's count: adds replayed from a caller's graph count too
        self._core.restored(seed, invalid, int(host["updates_since_refresh"]))

    # ---------------------------------------------------------------- copies

    def _init_args(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this buffer (its current settings, its device)."""
        if isinstance(self._backend_request, ModuleType):
            raise TypeError("a buffer built with a kernel module as its backend cannot be copied or pickled")
        return self._core.init_args(self._cfg, self.strict) | {"spec": self.spec}

    def __reduce__(self) -> tuple:
        """``copy.deepcopy`` and ``pickle`` rebuild the buffer from its settings and state (no CUDA
        graphs are copied: the copy captures its own). To store a buffer in a file, prefer
        :meth:`save`, which streams and which :meth:`load` reads without unpickling."""
        return (rebuild, (PrioritizedReplayBuffer, self._init_args(), self.state_dict()))
