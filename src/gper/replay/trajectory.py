"""The trajectory replay buffer: env streams stored in time order, each observation once.

:class:`TrajectoryReplayBuffer` keeps ``num_envs`` streams of ``capacity // num_envs`` rows on the
flat buffer's priority tree, sampling policies, kernels and guarantees, and assembles 1-step and
n-step transitions and whole sequences at sample time, on the device. ``docs/trajectory.md`` has
the layout, how ``add`` reads episode ends (both of Gymnasium's autoreset modes), which starts
are drawable, and what each sample holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from gper._device import on_own_device
from gper.ops import kernels as kernels_of
from gper.ops.state import C_SIZE
from gper.ops.trajectory.reference import T_DISCONTINUITIES, T_STEPS
from gper.replay.checks import (
    check_indices,
    out_of_memory,
)
from gper.replay.config import BufferSettings, ReplayConfig, ReplaySettings, takes_settings, with_defaults
from gper.replay.core import ReplayCore, rebuild
from gper.replay.exponent import ExponentInput
from gper.replay.graphs import BufferGraphs, capturing
from gper.replay.her import HindsightRelabeling, Relabeler
from gper.replay.instances import Member
from gper.replay.stream_state import StreamState
from gper.replay.streams import StreamLayout, check_frame_stack, check_streams
from gper.replay.trajectory_batch import SampleArgs, SequenceBatch, TransitionBatch, TransitionSample
from gper.replay.trajectory_checkpoint import TrajectoryCheckpoint

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

#: captured sample outputs per call shape (a batch may still be alive while the next is drawn)
_SAMPLE_SLOTS = 3
#: R2D2's mix of a sequence's TD errors into one priority (Kapturowski et al. 2019)
DEFAULT_ETA = 0.9


class TrajectoryReplayBuffer(BufferSettings, SampleArgs, TrajectoryCheckpoint):
    """``num_envs`` environment streams in time order, with prioritized sampling of start steps.

    Args:
        capacity: rows in all, a multiple of ``num_envs``; each stream is a ring of
            ``capacity // num_envs`` rows (at least ``window + 2``). A row is one step; an episode's
            final observation takes one more row (``docs/trajectory.md``, *Layout*).
        num_envs: streams; every ``add`` takes one step of each.
        spec: ``{name: (shape, dtype)}`` of a step, with every ``obs_keys`` field and a float32
            scalar ``reward``, e.g. ``{"obs": ((51,), torch.float32), "action": ((), torch.int64),
            "reward": ((), torch.float32)}``. ``terminated`` and ``truncated`` are added for you.

    Keyword Args:
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
        frame_stack: S >= 1. With S > 1, :meth:`sample` returns every observation key and its
            ``next_<key>`` as ``[B, S, *shape]`` stacks of the last S observations, assembled at
            sample time from the rows (each frame is still stored once): the oldest first, zeros
            where a frame is from before the episode's first (``docs/trajectory.md``, *Frame
            stacks*). Observation fields must be whole 4-byte words (an 84 x 84 uint8 frame is);
            not with ``her``. Sequences keep one observation a step.
        **settings: every setting of :class:`~gper.replay.config.ReplaySettings` (``alpha``,
            ``beta``, ``eps``, ``sampling``, ``weight_norm``, ``device``, ``backend``, ``seed``,
            ``strict``, ``arity``, ``cuda_graphs``, ``cpu_fallback``, ``rank_refresh_interval``),
            with the defaults and meaning documented in :class:`~gper.PrioritizedReplayBuffer`,
            except that ``backend`` is "auto", "triton" or "torch". Priorities and IS weights are
            those of the start steps.
    """

    def __new__(cls, *args: Any, **settings: Any) -> TrajectoryReplayBuffer:
        if cls is TrajectoryReplayBuffer and settings.get("instances") is not None:
            from gper.replay.trajectory_instances import TrajectoryReplayInstances

            cls = TrajectoryReplayInstances  # noqa: PLW0642 - the stacked kind of this buffer
        return super().__new__(cls)

    @takes_settings(ReplaySettings)
    def __init__(
        self,
        capacity: int,
        num_envs: int,
        spec: Mapping[str, tuple],
        *,
        window: int = 80,
        obs_keys: tuple[str, ...] = ("obs",),
        autoreset: str = "auto",
        her: HindsightRelabeling | None = None,
        frame_stack: int = 1,
        **settings: Unpack[ReplaySettings],
    ) -> None:
        given = with_defaults("TrajectoryReplayBuffer", settings)
        streams = dict(window=window, obs_keys=obs_keys, autoreset=autoreset, her=her, frame_stack=frame_stack)
        self._build(capacity, num_envs, spec, streams, given)

    # ``help()`` and ``inspect.signature`` show the settings ``__init__`` takes, not ``__new__``'s catch-all
    __new__.__signature__ = __init__.__signature__  # type: ignore[attr-defined]

    @classmethod
    def _instance(cls, capacity: int, num_envs: int, spec: Mapping, streams: dict, given: dict, member: Member):
        """Instance ``member.index`` of a buffer of several: a buffer of ``given`` settings (and the
        ``streams`` keywords) whose rows and tree are views of ``member``'s stack."""
        self = object.__new__(cls)
        self._build(capacity, num_envs, spec, streams, given, member)
        return self

    def _build(
        self, capacity: int, num_envs: int, spec: Mapping, streams: dict, given: dict, member: Member | None = None
    ) -> None:
        cfg = self._settle(capacity, num_envs, spec, streams, given)
        nbytes = self.nbytes_estimate
        self._core = ReplayCore.build(cfg, self.layout.row, given, _SAMPLE_SLOTS, nbytes, self._allocate, member)
        self._gamma = ExponentInput(self._gamma_scalar, "gamma")
        self._out = TransitionSample(self.layout, relabelled=self._her is not None, frame_stack=self.frame_stack)

    def _settle(self, capacity: int, num_envs: int, spec: Mapping, streams: dict, given: dict) -> ReplayConfig:
        """Check the settings and set what the buffer holds beside its core (a buffer of several
        instances too, from its first instance's settings); return the checked config."""
        window, obs_keys, autoreset, her = (streams[k] for k in ("window", "obs_keys", "autoreset", "her"))
        frame_stack = streams.get("frame_stack", 1)
        if not isinstance(given["backend"], str):
            raise TypeError(f"backend must be 'auto', 'triton' or 'torch', got {given['backend']!r}")
        cfg = ReplayConfig.check(capacity, given)
        check_streams(capacity, num_envs, window, autoreset)
        self.autoreset = autoreset
        self._cfg = cfg
        self.strict = bool(given["strict"])
        self.num_envs, self.window, self.rows_per_env = num_envs, window, capacity // num_envs
        self.layout = StreamLayout.build(spec, obs_keys)
        if her is not None and not isinstance(her, HindsightRelabeling):
            raise TypeError(f"her must be a gper.HindsightRelabeling or None, got {type(her).__name__}")
        if her is not None:
            her.check_layout(self.layout)
        self._her = her
        self.frame_stack = check_frame_stack(frame_stack, self.layout, her)
        #: bytes of memory the buffer holds (an upper bound, before its CUDA graphs' outputs)
        self.nbytes_estimate = cfg.estimate_bytes(self.layout.row.row_bytes)
        if her is not None:
            self.nbytes_estimate += Relabeler.estimate_bytes(num_envs, self.rows_per_env)
        self._steps = 0  # add calls, as the host knows them
        self._size = 0  # filled rows, as the host knows them (a lower bound until stats())
        return cfg

    def _allocate(self, core: ReplayCore) -> None:
        """What the trajectory buffer holds beside the core, on the core's device."""
        device, e = core.device, self.num_envs
        self._kernels = kernels_of("trajectory", core.backend)
        # every slot is in the tree's range: drawable starts are the slots with mass, not a prefix
        core.tree.counters[C_SIZE] = core.tree.capacity
        self._streams = StreamState(self.layout, e, self.rows_per_env, self.window, self.autoreset, core)
        self._gamma_scalar = torch.ones((), dtype=torch.float32, device=device)
        her = self._her
        self._relabeler = (
            None
            if her is None
            else Relabeler(her, self.layout, e, self.rows_per_env, device, kernels_of("her", core.backend))
        )

    @property
    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The step's fields as given (``terminated`` and ``truncated`` are the buffer's own)."""
        return self.layout.spec()

    @property
    def streams(self) -> torch.Tensor:
        """[num_envs, 2] int64 device tensor: rows written per stream, and where its episode in progress starts."""
        return self._streams.streams

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

    def __repr__(self) -> str:
        return (
            f"TrajectoryReplayBuffer(capacity={self.capacity}, num_envs={self.num_envs}, window={self.window}, "
            f"steps={self._steps}, sampling={self.sampling!r}, device={str(self.device)!r}, "
            f"backend={self.backend!r}, fields={list(self.spec)}"
            + (f", her={self._her.strategy!r}" if self._her is not None else "")
            + (f", frame_stack={self.frame_stack}" if self.frame_stack > 1 else "")
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
            self._add_call(self._core.graphs, args)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"adding a step of {self.num_envs} streams") from err
        self._count_add()

    def _add_call(self, graphs: BufferGraphs, args: tuple[torch.Tensor, ...]) -> None:
        """:meth:`_add` of a checked step, eagerly or from ``graphs`` (captured per dtype and device)."""
        if not graphs.active:
            self._add(*args)
        else:
            key = ("add",) + tuple((a.dtype, a.device.type) for a in args)
            on_device = all(a.device == self.device for a in args)
            graphs.call(key, args, self._add, by_address=on_device)

    def _count_add(self) -> None:
        self._steps += 1
        # every add writes at least a row a stream (and stats() may have counted more)
        self._size = max(self._size, min(self._steps, self.rows_per_env) * self.num_envs)

    def _add(self, *args: torch.Tensor) -> None:
        before = self.streams.clone() if self._relabeler is not None else None
        self._streams.add(self._core, dict(zip(self.layout.step_names(), args, strict=True)))
        if before is not None:
            self._relabeler.after_add(before, self.streams)

    # ---------------------------------------------------------------- sample

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
        b, n, relabel = self._check_sample(batch_size, n_step, gamma, relabel)
        graphs = self._core.graphs
        graphed = graphs.active
        beta_t = self._core.beta.tensor(self._cfg.beta if beta is None else beta, graphed, checked=beta is None)
        gamma_t = self._gamma.tensor(1.0 if gamma is None else gamma, graphed, checked=gamma is None)
        out = self._out
        try:
            if not graphed:
                batch = out.batch(out.split(self._sample(b, n, beta_t, gamma_t, relabel)), n)
            else:
                run = graphs.samples.run
                body = lambda: self._sample(b, n, self.tree.beta, self._gamma_scalar, relabel)  # noqa: E731
                parts, replayed = run(("sample", b, n, relabel), body, out.with_fields)
                batch = out.batch(parts, n, with_fields=True) if replayed else out.batch(out.split(parts), n)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing a batch of {b}") from err
        return self._core.stamp(batch)

    def _draw(self, b: int, beta: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        self._core.sample_into(parts, beta, self.policy.start_mode)

    def _sample(
        self, b: int, n: int, beta: torch.Tensor, gamma: torch.Tensor, relabel: bool, flat: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A sample's outputs as one flat tensor (``flat``: where to write them, default a new one)."""
        flat = self._out.empty(b, self.device) if flat is None else flat
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
            mode=self.policy.start_mode,
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
        if "obs_stack" in parts:  # the stacks read the drawn starts and the stream counts
            self._streams.stack_frames(self.rows.words, n, parts)
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
        b, length = self._check_sequences(batch_size, length, burn_in)
        beta_t = self._core.beta.tensor(self._cfg.beta if beta is None else beta, False, checked=beta is None)
        try:
            parts, rows, mask = self._sequence_outputs((), b, length, burn_in)
            self._sequences_into(beta_t, length, burn_in, parts, rows, mask)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing {b} sequences") from err
        batch = SequenceBatch(
            self.layout, rows, mask, parts["indices"], parts["weights"], parts["generations"], length, burn_in
        )
        return self._core.stamp(batch)

    def _sequence_outputs(self, lead: tuple[int, ...], b: int, length: int, burn_in: int) -> tuple:
        """``(parts, rows, mask)``: new outputs of ``b`` sequences (``lead``: () or a buffer of
        several instances' (N,)): the starts' draws, the sequences' rows and their mask."""
        w, s, device = self.layout.words, burn_in + length, self.device
        parts = {
            "rows": torch.empty(*lead, b, w, dtype=torch.int32, device=device),
            "indices": torch.empty(*lead, b, dtype=torch.int64, device=device),
            "generations": torch.empty(*lead, b, dtype=torch.int32, device=device),
            "weights": torch.empty(*lead, b, dtype=torch.float32, device=device),
        }
        rows = torch.empty(*lead, b, s + 1, w, dtype=torch.int32, device=device)
        return parts, rows, torch.empty(*lead, b, s, dtype=torch.bool, device=device)

    def _sequences_into(self, beta: torch.Tensor, length: int, burn_in: int, parts: dict, rows, mask) -> None:
        """Draw ``len(parts["indices"])`` starts into ``parts``, their sequences into ``rows`` and ``mask``."""
        self._draw(parts["indices"].numel(), beta, parts)
        self._streams.gather_sequences(self.rows.words, length, burn_in, parts["indices"], rows, mask)

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
            td_errors = batch.start_td(td_errors, eta, self.device)
        indices = batch.indices if batch is not None else batch_or_indices
        alpha = self.policy.start_alpha(self.alpha)
        self._core.update_priorities(
            batch,
            indices,
            td_errors,
            self.capacity,
            self.strict,
            alpha,
            self.eps,
            self.refresh_ranks,
            raw_filter=self._drawable_only,
        )

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
        rank.refresh(self.tree, self.capacity, self.alpha, drawable=self.drawable())

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
        out = self._core.read_counts()
        del out["cursor"]
        t = self._streams.tcounters.tolist()
        held = self.streams[:, 0].clamp(max=self.rows_per_env)
        size, drawable = torch.stack((held.sum(), self.drawable().sum())).tolist()
        out |= {"size": size, "steps": t[T_STEPS], "drawable": drawable, "discontinuities": t[T_DISCONTINUITIES]}
        self._size, self._steps = size, t[T_STEPS]  # adds replayed from a caller's graph count too
        return out

    # ---------------------------------------------------------------- copies

    def _init_args(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this buffer (its current settings, its device)."""
        return self._core.init_args(self._cfg, self.strict) | {
            "num_envs": self.num_envs,
            "spec": self.spec,
            "window": self.window,
            "obs_keys": self.obs_keys,
            "autoreset": self.autoreset,
            "her": self.her,
            "frame_stack": self.frame_stack,
        }

    def __reduce__(self) -> tuple:
        """``copy.deepcopy`` and ``pickle`` rebuild the buffer from its settings and state."""
        return (rebuild, (TrajectoryReplayBuffer, self._init_args(), self.state_dict()))
