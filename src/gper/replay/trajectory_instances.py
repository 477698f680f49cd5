"""A trajectory replay buffer of several instances: :class:`TrajectoryReplayInstances`.

``TrajectoryReplayBuffer(capacity, num_envs, spec, instances=N)`` builds one of these: N
independent trajectory buffers whose rows and priority trees are views ``[i]`` of one
:class:`~gper.replay.instances.InstanceStack` (as the flat kind's,
:mod:`gper.replay.buffer_instances`). Instance ``i`` is a :class:`~gper.TrajectoryReplayBuffer`
of seed ``seed + i`` (and its own ``alpha``, ``beta`` and ``eps`` where given per instance), so
it draws bit for bit what that single buffer draws. The rest of each instance's state (its
streams, its discount scalar, its episode index with ``her``) is its own, small beside the rows;
a state dict holds stacked copies of those. This class checks each call once for all instances
and runs every instance's device work in one call (one CUDA graph of its own on CUDA).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gper._device import on_own_device
from gper.replay.batch import StackedBatch
from gper.replay.checkpoint import check_state
from gper.replay.checks import out_of_memory
from gper.replay.config import ReplayConfig
from gper.replay.graphs import BufferGraphs, capturing
from gper.replay.instance_calls import InstanceCalls
from gper.replay.instances import check_instances, check_seed_room, instance_settings
from gper.replay.trajectory import _SAMPLE_SLOTS, DEFAULT_ETA, TrajectoryReplayBuffer
from gper.replay.trajectory_batch import SequenceBatch, TransitionBatch, TransitionSample
from gper.replay.trajectory_checkpoint import check_host_steps


class TransitionInstanceBatch(StackedBatch, TransitionBatch):
    """Transitions of every instance: each field of a :class:`TransitionBatch` with a leading
    [N] (``[N, B, *shape]``; ``indices``, ``generations``, ``weights``, ``discount`` [N, B])."""

    def __repr__(self) -> str:
        return f"TransitionInstanceBatch(instances={self.instances}, batch_size={self.batch_size}, fields={list(self)})"


class SequenceInstanceBatch(StackedBatch, SequenceBatch):
    """Sequences of every instance: each field of a :class:`SequenceBatch` with a leading [N]
    (``[N, B, S, *shape]``, ``mask`` [N, B, S]; ``indices`` and ``weights`` [N, B])."""

    def __repr__(self) -> str:
        return f"SequenceInstanceBatch(instances={self.instances}, batch_size={self.batch_size}, fields={list(self)})"


class TrajectoryReplayInstances(InstanceCalls, TrajectoryReplayBuffer):
    """N independent trajectory buffers in one storage, built by ``TrajectoryReplayBuffer(...,
    instances=N)`` (whose docstring documents every argument). Calls take and return a leading
    [N] dimension; :attr:`members` are the instances, each a trajectory buffer of its own (read
    them; change the whole through this buffer's calls).

    ``alpha``, ``beta`` and ``eps`` read as a tuple of the N instances' values; assigning one value
    or N values sets them (checked whole first)."""

    _single = TrajectoryReplayBuffer

    def _build(
        self, capacity: int, num_envs: int, spec: Mapping, streams: dict, given: dict, member: None = None
    ) -> None:
        """What ``TrajectoryReplayBuffer.__init__`` builds, for N instances: the stack and its
        members (``streams``: the keywords ``window``, ``obs_keys``, ``autoreset`` and ``her``)."""
        n = check_instances(given["instances"])
        if n is None:
            raise ValueError("TrajectoryReplayInstances needs instances=N (an int >= 1)")
        own = instance_settings(given, n)  # every instance's settings checked before anything is built
        for each in own:
            ReplayConfig.check(capacity, each)
        self._settle(capacity, num_envs, spec, streams, own[0])
        self.instances = n
        self.nbytes_estimate *= n
        make = lambda each, at: TrajectoryReplayBuffer._instance(capacity, num_envs, spec, streams, each, at)  # noqa: E731
        self.members, self._stack = self._build_members(given, capacity, self.layout.row.row_bytes, own, make)
        self._core = self.members[0]._core  # the device, back end and kernels every instance shares
        self._graphs = BufferGraphs(bool(given["cuda_graphs"]) and self.device.type == "cuda", _SAMPLE_SLOTS)
        self._out = TransitionSample(
            self.layout, relabelled=self._her is not None, kind=TransitionInstanceBatch, frame_stack=self.frame_stack
        )
        self._epoch = object()

    # ---------------------------------------------------------------- reads

    @property
    def streams(self) -> torch.Tensor:
        """[N, num_envs, 2] int64: each instance's stream counts (a copy: each instance holds its own)."""
        return torch.stack([m.streams for m in self.members])

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """Views ``[N, num_envs, rows_per_env, *shape]`` of every field's storage (read them)."""
        e, t = self.num_envs, self.rows_per_env
        return {n: v.unflatten(1, (e, t)) for n, v in self.layout.visible.views(self._stack.rows).items()}

    def drawable(self) -> torch.Tensor:
        """[N, capacity] bool: each instance's drawable starts."""
        return torch.stack([m.drawable() for m in self.members])

    def __repr__(self) -> str:
        return (
            f"TrajectoryReplayBuffer(instances={self.instances}, capacity={self.capacity}, num_envs={self.num_envs}, "
            f"window={self.window}, steps={self._steps}, sampling={self.sampling!r}, device={str(self.device)!r}, "
            f"backend={self.backend!r}, fields={list(self.spec)})"
        )

    def stats(self) -> dict[str, list]:
        """Every instance's :meth:`TrajectoryReplayBuffer.stats` (host syncs for each): the keys of
        a single buffer's, each a list of N values (instance ``i``'s at ``[i]``)."""
        per = [m.stats() for m in self.members]
        self._size, self._steps = min(m._size for m in self.members), per[0]["steps"]
        return {name: [p[name] for p in per] for name in per[0]}

    # ---------------------------------------------------------------- add

    @on_own_device
    def add(self, data: Mapping[str, torch.Tensor]) -> None:
        """Append one step of every stream of every instance.

        Args:
            data: the keys of a single buffer's ``add``, each ``[N, num_envs, *shape]`` (instance
                ``i`` adds ``data[key][i]``), on the buffer's device or the CPU.
        """
        views = self._instance_views(data, "num_envs, *shape]: one step of every stream of each instance")
        self.layout.check_step(views, self.num_envs, self.device)
        args = tuple(data[n] for n in self.layout.step_names())
        try:
            self._add_call(self._graphs, args)  # every instance's add in one call (one graph of its own)
        except torch.OutOfMemoryError as err:
            what = f"adding a step of {self.num_envs} streams to each of {self.instances} instances"
            raise out_of_memory(err, self.device, what) from err
        for m in self.members:
            m._count_add()
        self._count_add()

    def _add(self, *args: torch.Tensor) -> None:
        for i, m in enumerate(self.members):
            m._add(*(a[i] for a in args))

    # ---------------------------------------------------------------- sample

    @on_own_device
    def sample(
        self,
        batch_size: int,
        n_step: int = 1,
        gamma: float | torch.Tensor | None = None,
        beta: float | torch.Tensor | None = None,
        relabel: bool | None = None,
    ) -> TransitionInstanceBatch:
        """Draw ``batch_size`` n-step transitions from every instance, as
        :meth:`TrajectoryReplayBuffer.sample`; ``gamma`` and ``beta`` may also be [N] float device
        tensors (one per instance). Instance ``i``'s part (``batch[name][i]``) is what a single
        buffer of seed ``seed + i`` draws."""
        b, n, relabel = self._check_sample(batch_size, n_step, gamma, relabel)
        graphed = self._graphs.active
        # gamma first: its scalars are no part of the state, so a refused gamma leaves the state as it was
        gammas = self._exponents(1.0 if gamma is None else gamma, graphed, "gamma", lambda m: m._gamma)
        betas = self._betas(beta, graphed)
        out = self._out
        try:
            if not graphed:
                batch = out.batch(out.split(self._sample_all(b, n, betas, gammas, relabel)), n)
            else:
                own = [m.tree.beta for m in self.members], [m._gamma_scalar for m in self.members]
                body = lambda: self._sample_all(b, n, *own, relabel)  # noqa: E731
                parts, replayed = self._graphs.samples.run(("sample", b, n, relabel), body, out.with_fields)
                batch = out.batch(parts, n, with_fields=True) if replayed else out.batch(out.split(parts), n)
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing {self.instances} batches of {b}") from err
        return self._stamp(batch)

    def _sample_all(self, b: int, n: int, betas: list, gammas: list, relabel: bool) -> torch.Tensor:
        """Every instance's sample, into the rows of one [N, B * per draw] flat tensor."""
        flat = self._out.empty(b, self.device, (self.instances,))
        # a reward_fn that raises for one instance leaves the ones drawn before it advanced: their
        # counters are put back too (not while a graph is captured: nothing runs then)
        keep = relabel and not (self.device.type == "cuda" and capturing())
        saved = [(m.tree.counters.clone(), m._relabeler.counter.clone()) for m in self.members] if keep else None
        try:
            for i, m in enumerate(self.members):
                m._sample(b, n, betas[i], gammas[i], relabel, flat=flat[i])
        except BaseException:
            for m, (counters, her) in zip(self.members, saved or (), strict=False):
                m.tree.counters.copy_(counters)
                m._relabeler.counter.copy_(her)
            raise
        return flat

    @on_own_device
    def sample_sequences(
        self, batch_size: int, length: int, burn_in: int = 0, beta: float | torch.Tensor | None = None
    ) -> SequenceInstanceBatch:
        """Draw ``batch_size`` sequences from every instance, as
        :meth:`TrajectoryReplayBuffer.sample_sequences` (``beta`` may be [N]): fields ``[N, B, S, ...]``."""
        b, length = self._check_sequences(batch_size, length, burn_in)
        betas = self._betas(beta, False)
        try:
            parts, rows, mask = self._sequence_outputs((self.instances,), b, length, burn_in)
            for i, m in enumerate(self.members):
                own = {name: t[i] for name, t in parts.items()}
                m._sequences_into(betas[i], length, burn_in, own, rows[i], mask[i])
        except torch.OutOfMemoryError as err:
            raise out_of_memory(err, self.device, f"drawing {self.instances} batches of {b} sequences") from err
        batch = SequenceInstanceBatch(
            self.layout, rows, mask, parts["indices"], parts["weights"], parts["generations"], length, burn_in
        )
        return self._stamp(batch)

    # ---------------------------------------------------------------- priorities

    def _index_bound(self) -> int:
        return self.capacity  # every slot is in the tree's range: drawable starts are those with mass

    def _member_alpha(self, member: TrajectoryReplayBuffer) -> float:
        return member.policy.start_alpha(member.alpha)

    @on_own_device
    def update_priorities(
        self,
        batch_or_indices: TransitionInstanceBatch | SequenceInstanceBatch | torch.Tensor,
        td_errors: torch.Tensor,
        eta: float = DEFAULT_ETA,
    ) -> None:
        """Set the priorities of drawn starts, as :meth:`TrajectoryReplayBuffer.update_priorities`
        with a leading [N]: ``td_errors`` [N, B] (for sequences [N, B, length]), raw indices [N, B]."""
        kinds = TransitionInstanceBatch | SequenceInstanceBatch
        batch = batch_or_indices if isinstance(batch_or_indices, kinds) else None
        if isinstance(batch, SequenceInstanceBatch):
            td_errors = batch.start_td(td_errors, eta, self.device)
        self._update_members(batch, batch_or_indices, td_errors, raw_filter=lambda m, idx: m._drawable_only(idx))

    # ---------------------------------------------------------------- state

    def _tensors(self) -> dict[str, torch.Tensor]:
        return self._stack.state_tensors([m._tensors() for m in self.members])

    def _config(self) -> dict[str, Any]:
        return self.members[0]._config() | self._per_instance()

    def _host_counts(self) -> dict[str, int]:
        # the host's size is a lower bound (the one every instance holds at least: they differ
        # once episode ends add rows); steps are every instance's
        size = min(m._size for m in self.members)
        return {"size": size, "updates_since_refresh": self.policy.updates_since_refresh, "steps": self._steps}

    def _all_rows(self) -> torch.Tensor:
        return self._stack.rows

    def _restore(
        self,
        state: Mapping[str, Any],
        flags: torch.Tensor | None,
        copy_rows: Callable[[torch.Tensor], object],
        json_config: bool = False,
    ) -> None:
        """Check every instance's part of ``state`` as its single buffer checks its own, all before
        anything is copied; then copy the rows whole and each instance's part into it."""
        config = json.loads(json.dumps(self._config())) if json_config else self._config()
        seed, host = check_state(state, config, self._tensors())
        check_seed_room(seed, self.instances)
        steps = check_host_steps(host, flags)
        parts = [self._member_state(state, i) for i in range(self.instances)]
        checked = [m._check_contents(parts[i], flags[i], host["size"], steps) for i, m in enumerate(self.members)]
        counts = sorted({s for _, s in checked})
        if len(counts) != 1:
            raise ValueError(f"load_state_dict(): the instances added different numbers of steps: {counts}")
        with torch.no_grad():
            copy_rows(self._stack.rows)
        for i, (m, (invalid, own_steps)) in enumerate(zip(self.members, checked, strict=True)):
            m._load_checked(parts[i], lambda rows: None, seed + i, host, invalid, own_steps)  # rows copied whole
        self._steps, self._size = counts[0], int(host["size"])
        self._restored()
