"""The trajectory replay buffer: env streams stored in time order, each observation once.

:class:`TrajectoryReplayBuffer` keeps ``num_envs`` streams of ``capacity // num_envs`` rows on the
flat buffer's priority tree, sampling policies, kernels and guarantees, and assembles 1-step and
n-step transitions and whole sequences at sample time, on the device. ``docs/trajectory.md`` has
the layout, how ``add`` reads episode ends (both of Gymnasium's autoreset modes), which starts
are drawable, and what each sample holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gper._device import canonical_device, on_own_device
from gper.ops import kernels as kernels_of
from gper.ops.layout import DEFAULT_ARITY
from gper.ops.state import C_SIZE, MODE_PROPORTIONAL, MODE_UNIFORM
from gper.ops.trajectory.reference import AUTORESET, N_TCOUNTERS, T_DISCONTINUITIES, T_STEPS
from gper.replay.backends import choose_backend
from gper.replay.checks import (
    check_batch_size,
    check_generations,
    check_indices,
    check_td,
    check_unit,
    out_of_memory,
    warn_cpu_fallback,
    warn_dropped,
)
from gper.replay.config import BufferSettings, ReplayConfig
from gper.replay.graphs import BufferGraphs, capturing
from gper.replay.her import HindsightRelabeling, Relabeler
from gper.replay.sampling import BetaInput, SamplingPolicy
from gper.replay.storage import RowStorage
from gper.replay.streams import STEP_FLAGS, StepPacker, StreamLayout
from gper.replay.trajectory_batch import SequenceBatch, TransitionBatch, TransitionSample
from gper.replay.trajectory_checkpoint import TrajectoryCheckpoint
from gper.replay.tree import PriorityTree

#: captured sample outputs per call shape (a batch may still be alive while the next is drawn)
_SAMPLE_SLOTS = 3
#: R2D2's mix of a sequence's TD errors into one priority (Kapturowski et al. 2019)
DEFAULT_ETA = 0.9


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TrajectoryReplayBuffer(BufferSettings, TrajectoryCheckpoint):
    """``num_envs`` environment streams in time order, with prioritized sampling of start steps.

    Args:
        capacity: rows in all, a multiple of ``num_envs``; each stream is a ring of
            ``capacity // num_envs`` rows (at least ``window + 2``). A row is one step; an episode's
            final observation takes one more row (``docs/trajectory.md``, *Layout*).
        num_envs: streams; every ``add`` takes one step of each.
        spec: ``{name: (shape, dtype)}`` of a step, with every ``obs_keys`` field and a float32
            scalar ``reward``, e.g. ``{"obs": ((51,), torch.float32), "action": ((), torch.int64),
            "reward": ((), torch.float32)}``. ``terminated`` and ``truncated`` are added for you.
        alpha, beta, eps, sampling, weight_norm, seed, strict, cpu_fallback, rank_refresh_interval,
        arity, cuda_graphs, device, backend: as :class:`~gper.PrioritizedReplayBuffer` (``backend``
            "auto", "triton" or "torch"). Priorities and IS weights are those of the start steps.
        window: the longest look-ahead of any sample: ``n_step`` of :meth:`sample` and ``length`` of
            :meth:`sample_sequences` are at most ``window``. A step becomes drawable once the
            ``window`` steps after it are written, or its episode ended within them.
        obs_keys: the observation fields: stored once, and ``add`` takes ``next_<key>`` for each.
        autoreset: how a step after an episode end is read. "auto": as Gymnasium's next-step reset
            step (dropped: its observation is the final one) when its observation equals the
            final one bit for bit, else as the next episode's first step; "same-step": always the
            next episode's first step (environments that reset in the step that ended, or loops
            that reset by hand); "next-step": always a reset step. Pass it when you know it: an
            environment whose first observation can equal its last (a bandit, a constant
            observation) reads as next-step under "auto" and loses the step after each end.
        her: a :class:`~gper.HindsightRelabeling` to relabel goals when sampling (the goal fields
            among ``obs_keys``; ``docs/trajectory.md``, *Hindsight relabelling*), or None. With it,
            ``add`` also keeps an episode index (about 12 bytes a slot) and batches have ``relabelled``.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        spec: Mapping[str, tuple],
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        sampling: str = "proportional",
        weight_norm: str = "global",
        window: int = 80,
        obs_keys: tuple[str, ...] = ("obs",),
        autoreset: str = "auto",
        device: str | torch.device | None = None,
        backend: str = "auto",
        seed: int = 0,
        strict: bool = False,
        cpu_fallback: bool = True,
        rank_refresh_interval: int = 100,
        arity: int = DEFAULT_ARITY,
        cuda_graphs: bool = True,
        her: HindsightRelabeling | None = None,
    ) -> None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
        cfg = ReplayConfig.check(
            capacity, alpha, beta, eps, sampling, weight_norm, seed, rank_refresh_interval, arity, backend
        )
        if not _is_int(num_envs) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if not _is_int(window) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if autoreset not in AUTORESET:
            raise ValueError(f"autoreset must be one of {tuple(AUTORESET)}, got {autoreset!r}")
        self.autoreset = autoreset
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
        self._cfg = cfg
        self._seed = cfg.seed
        self.strict = bool(strict)
        self._backend_request = backend
        self.num_envs, self.window, self.rows_per_env = num_envs, window, capacity // num_envs
        self.layout = StreamLayout.build(spec, obs_keys)
        if her is not None and not isinstance(her, HindsightRelabeling):
            raise TypeError(f"her must be a gper.HindsightRelabeling or None, got {type(her).__name__}")
        if her is not None:
            her.check_layout(self.layout)
        self._her = her
        #: bytes of memory the buffer holds (an upper bound, before its CUDA graphs' outputs)
        self.nbytes_estimate = cfg.estimate_bytes(self.layout.row.row_bytes)
        if her is not None:
            self.nbytes_estimate += Relabeler.estimate_bytes(num_envs, self.rows_per_env)
        device = canonical_device(device)
        try:
            self._allocate(device)
        except torch.OutOfMemoryError:
            if not cpu_fallback or device.type == "cpu":
                raise
            warn_cpu_fallback(device, capacity, self.nbytes_estimate)
            self._allocate(torch.device("cpu"))
        self._steps = 0  # add calls, as the host knows them
        self._size = 0  # filled rows, as the host knows them (a lower bound until stats())
        self._invalid_reported = 0
        self._beta = BetaInput(self.tree.beta)
        self._gamma = BetaInput(self._gamma_scalar, "gamma")
        self._graphs = BufferGraphs(cuda_graphs and self.device.type == "cuda", _SAMPLE_SLOTS)
        self._out = TransitionSample(self.layout, relabelled=her is not None)
        self._epoch = object()

    def _allocate(self, device: torch.device) -> None:
        self.device = device
        self.backend, kernels = choose_backend(self._backend_request, device)
        self._kernels = kernels_of("trajectory", self.backend)
        cfg, e, w = self._cfg, self.num_envs, self.layout.words
        self.rows = RowStorage(self.layout.row, cfg.capacity, device)
        self.tree = PriorityTree(cfg.capacity, kernels, device, cfg.arity)
        # every slot is in the tree's range: drawable starts are the slots with mass, not a prefix
        self.tree.counters[C_SIZE] = cfg.capacity
        self.policy = SamplingPolicy.build(
            cfg.sampling, cfg.weight_norm, cfg.capacity, device, cfg.rank_refresh_interval
        )
        self.streams = torch.zeros(e, 2, dtype=torch.int64, device=device)
        self.pending = torch.zeros(e, w, dtype=torch.int32, device=device)
        self.tcounters = torch.zeros(N_TCOUNTERS, dtype=torch.int64, device=device)
        self._gamma_scalar = torch.ones((), dtype=torch.float32, device=device)
        self._obs_mask = self.layout.obs_mask(device)
        self._packer = StepPacker(self.layout, e, device)
        self._plan = self._packer.word_plan() if self.backend == "triton" else None
        her = self._her
        self._relabeler = (
            None
            if her is None
            else Relabeler(her, self.layout, e, self.rows_per_env, device, kernels_of("her", self.backend))
        )

    @property
    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The step's fields as given (``terminated`` and ``truncated`` are the buffer's own)."""
        return self.layout.spec()

    @property
    def her(self) -> HindsightRelabeling | None:
        """The hindsight relabelling :meth:`sample` applies (fixed when the buffer is built), or None."""
        return self._her

    @property
    def obs_keys(self) -> tuple[str, ...]:
        """The observation fields (each stored once; ``add`` takes ``next_<key>`` for each)."""
        return self.layout.obs_keys

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Views ``[num_envs, rows_per_env, *shape]`` of every field's storage (row ``k`` of stream
        ``e`` at ``[e, k % rows_per_env]``; read them, write through ``add``)."""
        e, t = self.num_envs, self.rows_per_env
        return {n: v.unflatten(0, (e, t)) for n, v in self.layout.visible.views(self.rows.rows).items()}

    def __len__(self) -> int:
        """Filled rows, as the host knows it (exact after :meth:`stats`)."""
        return self._size

    def __repr__(self) -> str:
        return (
            f"TrajectoryReplayBuffer(capacity={self.capacity}, num_envs={self.num_envs}, window={self.window}, "
            f"steps={self._steps}, sampling={self.sampling!r}, device={str(self.device)!r}, "
            f"backend={self.backend!r}, fields={list(self.spec)}"
            + (f", her={self._her.strategy!r}" if self._her is not None else "")
            + ")"
        )

    # ---------------------------------------------------------------- add

    @on_own_device
    def add(self, data: Mapping[str, torch.Tensor]) -> None:
        """Append one step of every stream (``docs/trajectory.md``, *How add reads the episode structure*).

        Args:
            data: every spec field, ``next_<key>`` for each observation key (the true next
                observation: the final one where the episode ended), and bool ``terminated`` and
                ``truncated``; each ``[num_envs, *shape]`` with the spec's dtype, on the buffer's
                device or on the CPU.
        """
        self.layout.check_step(data, self.num_envs, self.device)
        names = self.layout.step_names()
        args = tuple(data[n] for n in names)
        try:
            if not self._graphs.active:
                self._add(*args)
            else:
                key = ("add",) + tuple((a.dtype, a.device.type) for a in args)
                on_device = all(a.device == self.device for a in args)
                self._graphs.call(key, args, self._add, by_address=on_device)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"adding a step of {self.num_envs} streams") from err
        self._steps += 1
        # every add writes at least a row a stream (and stats() may have counted more)
        self._size = max(self._size, min(self._steps, self.rows_per_env) * self.num_envs)

    def _add(self, *args: torch.Tensor) -> None:
        data = dict(zip(self.layout.step_names(), args, strict=True))
        tree = self.tree
        direct = {}  # the Triton add reads the step's tensors itself where their fields are whole words
        if self._plan is not None:
            keys, plan = self._plan
            staged = None
            flags = tuple(data[n].detach().to(self.device, non_blocking=True).contiguous() for n in STEP_FLAGS)
            direct = {"sources": tuple(self._packer.words_of(data, keys)), "plan": plan, "flags": flags}
        else:
            staged = self._packer.pack(data)
        before = self.streams.clone() if self._relabeler is not None else None
        self._kernels.stream_add(
            state=tree.state,
            keys=self.policy.rank.keys if self.policy.rank is not None else None,
            rows=self.rows.words,
            staged=staged,
            streams=self.streams,
            pending=self.pending,
            tcounters=self.tcounters,
            obs_mask=self._obs_mask,
            flags_col=self.layout.flags_col,
            rows_per_env=self.rows_per_env,
            window=self.window,
            autoreset=AUTORESET[self.autoreset],
            value=self._new_start_value,
            **direct,
        )
        if before is not None:
            self._relabeler.after_add(before, self.streams)

    @property
    def _new_start_value(self) -> float | None:
        """The tree value of a start that becomes drawable: the max priority, or 1 (rank 1; uniform)."""
        return 1.0 if self.sampling in ("rank", "uniform") else None

    # ---------------------------------------------------------------- sample

    def _check_drawable(self, what: str) -> None:
        if self._steps <= self.window:
            raise RuntimeError(
                f"{what}: {self._steps} steps added; a start is drawable once the window={self.window} steps "
                f"after it are written, so sampling needs window + 1 = {self.window + 1} steps (or build the "
                "buffer with a smaller window)"
            )

    def _kernel_mode(self) -> int:
        # uniform draws are proportional over the drawable starts, whose tree values are all 1
        mode = self.policy.kernel_mode
        return MODE_PROPORTIONAL if mode == MODE_UNIFORM else mode

    def _check_steps(self, name: str, value: object) -> int:
        if not _is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= self.window:
            raise ValueError(f"{name} must be in [1, window={self.window}], got {value}")
        return value

    @on_own_device
    def sample(
        self,
        batch_size: int,
        n_step: int = 1,
        gamma: float | torch.Tensor | None = None,
        beta: float | torch.Tensor | None = None,
        relabel: bool | None = None,
    ) -> TransitionBatch:
        """Draw ``batch_size`` n-step transitions with replacement, with their IS weights.

        Args:
            batch_size: B >= 1.
            n_step: steps per transition, 1 .. ``window`` (fewer where the episode ended first).
            gamma: discount in [0, 1], a float or a 0-d float device tensor (read on the device, so
                it may change between CUDA-graph replays); may be None for ``n_step=1`` (then
                ``discount`` is ``1 - terminated``).
            beta: IS exponent for this call (as the flat buffer's); default the buffer's ``beta``.
            relabel: relabel goals (a buffer built with ``her``: the default); False draws the
                stored goals (evaluation, debugging; ``relabelled`` is then all False).

        Returns:
            A :class:`TransitionBatch` (``docs/trajectory.md`` says what each field holds).

        Raises:
            ValueError: bad arguments, or (relabelling) a ``reward_fn`` / ``terminated_fn`` that does
                not return one value per step.
        """
        b = check_batch_size(batch_size)
        n = self._check_steps("n_step", n_step)
        if gamma is None and n > 1:
            raise ValueError(f"sample(n_step={n}) needs gamma for the n-step return")
        if relabel is not None and not isinstance(relabel, bool):
            raise TypeError(f"relabel must be a bool or None, got {type(relabel).__name__}")
        if relabel and self.her is None:
            raise ValueError("sample(relabel=True) needs a buffer built with her=gper.HindsightRelabeling(...)")
        relabel = self.her is not None and relabel is not False
        self._check_drawable("sample()")
        graphed = self._graphs.active
        beta_t = self._beta.tensor(self._cfg.beta if beta is None else beta, graphed, checked=beta is None)
        gamma_t = self._gamma.tensor(1.0 if gamma is None else gamma, graphed, checked=gamma is None)
        out = self._out
        try:
            if not graphed:
                batch = out.batch(out.split(self._sample(b, n, beta_t, gamma_t, relabel)), n)
            else:
                run = self._graphs.samples.run
                body = lambda: self._sample(b, n, self.tree.beta, self._gamma_scalar, relabel)  # noqa: E731
                parts, replayed = run(("sample", b, n, relabel), body, out.with_fields)
                batch = out.batch(parts, n, with_fields=True) if replayed else out.batch(out.split(parts), n)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing a batch of {b}") from err
        batch.source = self._epoch
        return batch

    def _draw(self, b: int, beta: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        self.tree.sample_into(self.rows.words, self.seed, self._kernel_mode(), beta, parts)
        self.policy.normalise(parts, self.tree, beta)

    def _sample(self, b: int, n: int, beta: torch.Tensor, gamma: torch.Tensor, relabel: bool) -> torch.Tensor:
        flat = self._out.empty(b, self.device)
        parts = self._out.split(flat)
        tree = self.tree
        # the draw advances the tree's random counter before reward_fn / terminated_fn run: a copy to
        # put back should they fail (not while a graph is captured: nothing runs then, and a copy
        # would be one more kernel in every replay)
        counters = tree.counters.clone() if relabel and not (self.device.type == "cuda" and capturing()) else None
        self._kernels.sample_transitions(
            state=tree.state,
            rows=self.rows.words,
            seed=self.seed,
            mode=self._kernel_mode(),
            beta=beta,
            gamma=gamma,
            n_step=n,
            rows_per_env=self.rows_per_env,
            reward_col=self.layout.reward_col,
            flags_col=self.layout.flags_col,
            out_rows=parts["rows"],
            out_next=parts["next_rows"],
            out_idx=parts["indices"],
            out_gen=parts["generations"],
            out_w=parts["weights"],
            out_discount=parts["discount"],
        )
        self.policy.normalise(parts, tree, beta)
        if relabel:  # on the drawn rows, in the same graph: the goal is drawn given the transition
            try:
                self._relabeler.relabel(parts, self.rows.words, self.streams, n, gamma, self.seed)
            except BaseException:
                if counters is not None:  # a failed call leaves the buffer as it was
                    tree.counters.copy_(counters)
                raise
        elif "relabelled" in parts:
            parts["relabelled"].zero_()
        return flat

    @on_own_device
    def sample_sequences(
        self, batch_size: int, length: int, burn_in: int = 0, beta: float | torch.Tensor | None = None
    ) -> SequenceBatch:
        """Draw ``batch_size`` sequences of ``burn_in + length`` steps, one priority per start.

        Sequences keep their stored goals: a buffer built with ``her`` relabels :meth:`sample`'s
        transitions only.

        Args:
            batch_size: B >= 1.
            length: steps from the start on, 1 .. ``window`` (masked past the episode's end).
            burn_in: steps before the start, >= 0 (masked where they belong to an earlier episode
                or were overwritten): a recurrent learner's warm-up (R2D2).
            beta: IS exponent for this call; default the buffer's ``beta``.

        Returns:
            A :class:`SequenceBatch`: fields ``[B, burn_in + length, ...]`` and ``mask``.
        """
        b = check_batch_size(batch_size)
        length = self._check_steps("length", length)
        if not _is_int(burn_in) or burn_in < 0:
            raise ValueError(f"burn_in must be an int >= 0, got {burn_in!r}")
        self._check_drawable("sample_sequences()")
        beta_t = self._beta.tensor(self._cfg.beta if beta is None else beta, False, checked=beta is None)
        w = self.layout.words
        try:
            start = torch.empty(b, w, dtype=torch.int32, device=self.device)
            parts = {
                "rows": start,
                "indices": torch.empty(b, dtype=torch.int64, device=self.device),
                "generations": torch.empty(b, dtype=torch.int32, device=self.device),
                "weights": torch.empty(b, dtype=torch.float32, device=self.device),
            }
            self._draw(b, beta_t, parts)
            rows = torch.empty(b, burn_in + length + 1, w, dtype=torch.int32, device=self.device)
            mask = torch.empty(b, burn_in + length, dtype=torch.bool, device=self.device)
            self._kernels.gather_sequences(
                rows=self.rows.words,
                streams=self.streams,
                rows_per_env=self.rows_per_env,
                length=length,
                burn_in=burn_in,
                obs_mask=self._obs_mask,
                flags_col=self.layout.flags_col,
                idx=parts["indices"],
                out_rows=rows,
                out_mask=mask,
            )
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing {b} sequences") from err
        batch = SequenceBatch(
            self.layout, rows, mask, parts["indices"], parts["weights"], parts["generations"], length, burn_in
        )
        batch.source = self._epoch
        return batch

    # ---------------------------------------------------------------- priorities

    @on_own_device
    def update_priorities(
        self,
        batch_or_indices: TransitionBatch | SequenceBatch | torch.Tensor,
        td_errors: torch.Tensor,
        eta: float = DEFAULT_ETA,
    ) -> None:
        """Set the priorities ``(|td| + eps) ** alpha`` of drawn starts.

        Args:
            batch_or_indices: a batch from :meth:`sample` or :meth:`sample_sequences` (entries whose
                start was overwritten since are ignored, as is a whole batch from before a load or
                from another buffer), or raw [B] slot indices (no such check; slots that are not
                drawable starts are dropped and counted, so they never become drawable).
            td_errors: [B] for transitions and indices; [B, length] for sequences (the steps after
                the burn-in), mixed per start as ``eta * max|td| + (1 - eta) * mean|td|`` over its
                masked steps. NaN and ±Inf give the max priority and are counted.
            eta: the sequences' mix (R2D2's 0.9; transitions and indices do not use it).
        """
        batch = batch_or_indices if isinstance(batch_or_indices, TransitionBatch | SequenceBatch) else None
        if isinstance(batch, SequenceBatch):
            td_errors = self._sequence_td(batch, td_errors, eta)
        if batch is not None and batch.source is not self._epoch:
            check_td(td_errors, batch.indices, self.device)
            self.tree.count_stale(batch.indices.numel())
            return
        raw = batch.indices if batch is not None else batch_or_indices
        indices = check_indices(raw, self.device, self.capacity, self.strict, "update_priorities()")
        td = check_td(td_errors, indices, self.device)
        if batch is None:
            indices = self._drawable_only(indices)
        expected = check_generations(batch.generations, indices) if batch is not None else None
        args = (indices, td) if expected is None else (indices, td, expected)
        try:
            self._graphs.call(("update", indices.numel(), expected is not None), args, self._update, by_address=True)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"updating {indices.numel()} priorities") from err
        if self.policy.count_update():
            self.refresh_ranks()

    def _sequence_td(self, batch: SequenceBatch, td: object, eta: object) -> torch.Tensor:
        eta = check_unit("eta", eta)
        if not isinstance(td, torch.Tensor):
            raise TypeError(f"update_priorities(): td_errors must be a torch.Tensor, got {type(td).__name__}")
        want = (batch.batch_size, batch.length)
        if tuple(td.shape) != want or not td.dtype.is_floating_point or td.device != self.device:
            raise ValueError(
                f"update_priorities(): a sequence batch's td_errors must be a float tensor {want} (the steps after "
                f"the burn-in) on {self.device}; got {tuple(td.shape)} {td.dtype} on {td.device}"
            )
        mask = batch.mask[:, batch.burn_in :]
        a = torch.where(mask, td.detach().float().abs(), 0.0)
        mean = a.sum(dim=1) / mask.sum(dim=1).clamp_min(1)
        return eta * a.amax(dim=1) + (1.0 - eta) * mean

    def _drawable_only(self, indices: torch.Tensor) -> torch.Tensor:
        """Raw indices with the slots that are not drawable starts replaced by -1 (dropped and
        counted by the update): a raw update must not give mass to a start that is not drawable."""
        leaf = self.tree.leaves()[indices.clamp(0, self.capacity - 1)]
        ok = (indices >= 0) & (indices < self.capacity) & (leaf > 0)
        if self.strict:  # one host sync, as strict index checks cost
            bad = (~ok).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                raise IndexError(f"update_priorities(): slot {int(indices[i])} is not a drawable start")
        return torch.where(ok, indices, -1)

    def _update(self, indices: torch.Tensor, td: torch.Tensor, expected: torch.Tensor | None = None) -> None:
        # uniform mode keeps every drawable start at 1: alpha 0 makes every priority 1
        alpha = 0.0 if self.sampling == "uniform" else self.alpha
        self.policy.update(self.tree, indices, td, expected, alpha, self.eps)

    def priorities(self, indices: torch.Tensor) -> torch.Tensor:
        """Stored priorities of slots ``indices`` ([B] float32; 0 where a slot is not a drawable start)."""
        return self.tree.priorities(check_indices(indices, self.device, self.capacity, self.strict, "priorities()"))

    def drawable(self) -> torch.Tensor:
        """[capacity] bool device tensor: the slots that are drawable starts (no host sync)."""
        return self.tree.leaves() > 0

    @on_own_device
    def refresh_ranks(self) -> None:
        """Rank mode: re-rank the drawable starts by their sort keys (an O(N log N) argsort and a
        tree rebuild); called every ``rank_refresh_interval`` updates."""
        rank = self.policy.rank
        if rank is None:
            raise RuntimeError("refresh_ranks() applies to sampling='rank' only")
        rank.updates_since_refresh = 0
        ok = self.drawable()
        keys = torch.where(ok, rank.keys[: self.capacity], -float("inf"))
        order = torch.argsort(keys, descending=True, stable=True)
        r = torch.empty(self.capacity, dtype=torch.float32, device=self.device)
        r[order] = torch.arange(1, self.capacity + 1, dtype=torch.float32, device=self.device)
        w = torch.where(ok, r.pow(-self.alpha), 0.0)
        lo = self.tree.layout.leaf_offset
        self.tree.tree[lo : lo + self.capacity] = w
        self.tree.mintree[lo : lo + self.capacity] = torch.where(ok, w, float("inf"))
        self.tree.rebuild()

    # ---------------------------------------------------------------- counts

    def stats(self) -> dict[str, Any]:
        """Read the device counters (host syncs) and refresh the host's view of the size.

        Returns:
            dict with ``size`` (filled rows), ``steps`` (add calls), ``drawable`` (drawable
            starts), ``discontinuities`` (steps whose ``obs`` differed from the previous step's
            ``next_obs`` with no episode end flagged: see ``docs/trajectory.md``),
            ``max_priority``, ``total_priority``, ``rng_offset``, ``invalid_indices``,
            ``stale_updates`` and ``nonfinite_td``.
        """
        out = self.tree.read_counts()
        del out["cursor"]
        t = self.tcounters.tolist()
        held = self.streams[:, 0].clamp(max=self.rows_per_env)
        size, drawable = torch.stack((held.sum(), self.drawable().sum())).tolist()
        out |= {"size": size, "steps": t[T_STEPS], "drawable": drawable, "discontinuities": t[T_DISCONTINUITIES]}
        self._size, self._steps = size, t[T_STEPS]  # adds replayed from a caller's graph count too
        self._invalid_reported = warn_dropped(out["invalid_indices"], self._invalid_reported)
        return out

    # ---------------------------------------------------------------- copies

    def _init_args(self) -> dict[str, Any]:
        cfg = self._cfg
        return {
            "capacity": cfg.capacity,
            "num_envs": self.num_envs,
            "spec": self.spec,
            "alpha": cfg.alpha,
            "beta": cfg.beta,
            "eps": cfg.eps,
            "sampling": cfg.sampling,
            "weight_norm": cfg.weight_norm,
            "window": self.window,
            "obs_keys": self.obs_keys,
            "autoreset": self.autoreset,
            "device": str(self.device),
            "backend": self.backend,
            "seed": self.seed,
            "strict": self.strict,
            "cpu_fallback": False,
            "rank_refresh_interval": cfg.rank_refresh_interval,
            "arity": cfg.arity,
            "cuda_graphs": self._graphs.enabled,
            "her": self.her,
        }

    def __reduce__(self) -> tuple:
        """``copy.deepcopy`` and ``pickle`` rebuild the buffer from its settings and state."""
        return (_rebuild, (self._init_args(), self.state_dict()))


def _rebuild(args: dict[str, Any], state: Mapping[str, Any]) -> TrajectoryReplayBuffer:
    rb = TrajectoryReplayBuffer(**args)
    rb.load_state_dict(state)
    return rb
