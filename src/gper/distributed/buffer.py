"""A prioritized replay buffer sharded over a process group: one :class:`gper.PrioritizedReplayBuffer`
per rank, and the collectives that make the shards sample as one buffer (``mode="exact"``) or
as one unbiased estimate of it (``mode="local"``). The math is in :mod:`gper.distributed.shards`.

Every step has static shapes and keeps its counters on the device: ``sample`` and
``update_priorities`` read nothing on the host (the one exception: until the buffer has been
seen non-empty once, ``sample`` reads the gathered sizes to refuse an empty buffer on every rank
alike), so a step can later be captured in a CUDA graph with NCCL.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from gper._device import canonical_device
from gper.distributed import shards
from gper.distributed.batch import ShardedBatch
from gper.distributed.checkpoint import load_agreed, state_problem
from gper.distributed.collectives import Group
from gper.ops import kernels
from gper.ops.state import C_INVALID, C_NONFINITE, C_STALE
from gper.ops.tree import reference
from gper.replay import PrioritizedReplayBuffer
from gper.replay.checks import check_batch_size, check_td
from gper.replay.config import CommonSettings, check_seed, takes_settings, with_defaults
from gper.replay.exponent import ExponentInput
from gper.replay.samplers import SHARDED_SAMPLING

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

MODES = ("exact", "local")
SAMPLING = SHARDED_SAMPLING
#: the settings checksum a rank whose shard could not be built sends (a crc32 is never negative)
_FAILED = -1


class ShardedPrioritizedReplayBuffer:
    """Prioritized replay over the ranks of a process group, ``capacity / world_size`` slots per rank.

    Every rank builds it with the same arguments and calls ``sample`` and ``update_priorities``
    in lockstep with the same batch size (they are collectives); ``add`` writes to this rank's
    shard only and needs no other rank.

    Args:
        capacity: slots over all ranks, a multiple of the world size.
        spec: as :class:`gper.PrioritizedReplayBuffer`.

    Keyword Args:
        mode: "exact" (the distribution of one buffer over every shard; rows move to the rank
            that drew them) or "local" (each rank draws its own shard; weights carry the shard
            ratio ``world_size * T_k / sum T``; no row moves).
        group: the process group, default the world.
        **settings: the shard's settings, :class:`~gper.replay.config.CommonSettings` (``alpha``,
            ``beta``, ``eps``, ``sampling``, ``weight_norm``, ``device``, ``backend``, ``seed``,
            ``strict``, ``arity``, ``cuda_graphs``), with the defaults and meaning documented in
            :class:`gper.PrioritizedReplayBuffer`, except: ``sampling`` is "proportional",
            "stratified" or "uniform" ("rank" is refused: a global rank needs a sort over every
            shard); ``device`` is this rank's (default the current CUDA device, else the CPU; with
            NCCL, call ``torch.cuda.set_device(local_rank)`` first); ``seed`` is the Philox key of
            every stream (the shared one and each shard's own): the same seed, world size and
            calls give the same samples. A shard never falls back to the CPU.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
        ValueError: a bad setting, ``capacity`` not a multiple of the world size, or settings that
            differ between ranks (checked with one all-gather at construction).
    """

    @takes_settings(CommonSettings)
    def __init__(
        self,
        capacity: int,
        spec: Mapping[str, tuple],
        *,
        mode: str = "exact",
        group: Any = None,
        **settings: Unpack[CommonSettings],
    ) -> None:
        given = with_defaults("ShardedPrioritizedReplayBuffer", settings, CommonSettings)
        sampling, seed, device = given["sampling"], given["seed"], given["device"]
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if sampling == "rank":
            raise ValueError(
                "sampling='rank' is not supported by a sharded buffer (a global rank needs a sort over "
                f"every shard); use one of {SAMPLING}"
            )
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
        self.group = Group(group)
        w = self.group.world_size
        if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity % w:
            raise ValueError(
                f"capacity {capacity} is not a multiple of the world size {w}: every rank holds "
                f"capacity / world_size slots (e.g. {capacity - capacity % w or w})"
            )
        check_seed(seed)
        self.mode = mode
        self._seed = seed
        self._shared_key = shards.derive_key(seed, 0)
        try:
            #: this rank's shard: a whole buffer of capacity / world_size slots (``add`` goes to it)
            self.shard = PrioritizedReplayBuffer(
                capacity // w if isinstance(capacity, int) else capacity,
                spec,
                # a shard on another device than its peers' would break the collectives: no fall-back
                **given | {"seed": shards.derive_key(seed, 1 + self.group.rank), "cpu_fallback": False},
            )
        except Exception:
            # the other ranks wait in the settings' all-gather below: join it (as failed), so that
            # they raise too instead of waiting, then raise this rank's own error
            self._join_as_failed(device)
            raise
        self.device = self.shard.device
        self.capacity = capacity
        # exact mode's draws and routing: in Triton where the shard runs Triton (bit for bit the
        # torch reference's, so the back end changes no draw)
        self._kernels = kernels("shard", "triton" if self.shard.backend == "triton" else "torch")
        #: [1] int64 counter of the draws every rank shares (advanced alike on every rank)
        self._shared_rng = torch.zeros(1, dtype=torch.int64, device=self.device)
        # [1] int64 scratch of the Triton draws' counter advance (0 between calls; not state)
        self._draw_ticket = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._beta = ExponentInput(torch.zeros((), dtype=torch.float32, device=self.device))
        self._seen_filled = False  # once any shard holds an item, the buffer never empties again
        self._epoch = object()
        self._check_same_settings()

    def _join_as_failed(self, device: Any) -> None:
        """This rank's part of :meth:`_check_same_settings` when its shard could not be built."""
        try:
            where = canonical_device(device)
        except ValueError:
            where = torch.device("cpu")
        self.group.all_gather(torch.tensor([_FAILED], dtype=torch.int64, device=where))

    # ---------------------------------------------------------------- settings

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def sampling(self) -> str:
        return self.shard.sampling

    @property
    def weight_norm(self) -> str:
        return self.shard.weight_norm

    @property
    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return self.shard.spec

    @property
    def backend(self) -> str:
        """The kernels the shard runs ("triton" or "torch")."""
        return self.shard.backend

    @property
    def nbytes_estimate(self) -> int:
        """Device bytes of this rank's shard."""
        return self.shard.nbytes_estimate

    def _settings(self) -> dict[str, Any]:
        return self.shard.state_dict()["config"] | {"mode": self.mode, "seed": self.seed, "world_size": self.world_size}

    def _check_same_settings(self) -> None:
        """One all-gather of a checksum of the settings: ranks built differently would otherwise
        hang or mix shapes in the first collective."""
        crc = zlib.crc32(repr(sorted(self._settings().items())).encode())
        got = self.group.all_gather(torch.tensor([crc], dtype=torch.int64, device=self.device))
        failed = (got.view(-1) == _FAILED).nonzero().view(-1).tolist()
        if failed:
            raise RuntimeError(
                f"ShardedPrioritizedReplayBuffer: the shard of rank{'s' if len(failed) > 1 else ''} "
                f"{', '.join(map(str, failed))} could not be built (that rank raised the cause)"
            )
        if bool((got != crc).any()):
            raise ValueError(
                "the ranks built ShardedPrioritizedReplayBuffer with different settings (checksums "
                f"{got.view(-1).tolist()}): every rank must pass the same capacity, spec, alpha, beta, eps, "
                "sampling, weight_norm, mode and seed"
            )

    def __len__(self) -> int:
        """Filled slots of this rank's shard, as the host knows it (:meth:`stats` has the global size)."""
        return len(self.shard)

    def __repr__(self) -> str:
        return (
            f"ShardedPrioritizedReplayBuffer(capacity={self.capacity}, world_size={self.world_size}, "
            f"rank={self.rank}, mode={self.mode!r}, sampling={self.sampling!r}, device={str(self.device)!r})"
        )

    # ---------------------------------------------------------------- add / sample

    def add(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Append transitions to this rank's shard (see :meth:`gper.PrioritizedReplayBuffer.add`).

        Returns:
            [n] int64 slots written in this rank's shard.
        """
        return self.shard.add(data)

    def _gather_meta(self) -> torch.Tensor:
        """[W, 4] float64 of every shard (:data:`shards.META_TOTAL` ...): one all-gather of 32 bytes a rank."""
        tree, lay = self.shard.tree, self.shard.tree.layout
        top = lay.offsets[0]
        mine = self._kernels.shard_meta(
            total=tree.total(), mintop=tree.mintree[top : top + lay.arity], size=tree.size, maxp=tree.max_priority()
        )
        return self.group.all_gather(mine)

    def _check_filled(self, meta: torch.Tensor) -> None:
        # decided from the gathered sizes, so every rank raises alike (none is left in a collective)
        if self._seen_filled:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("sample(): draw once before a CUDA graph capture (the first draw checks for items)")
        if float(meta[:, shards.META_SIZE].sum()) == 0:
            raise RuntimeError("sample(): every shard is empty; add() transitions on at least one rank first")
        self._seen_filled = True

    def sample(self, batch_size: int, beta: float | torch.Tensor | None = None) -> ShardedBatch:
        """Draw ``batch_size`` rows on this rank (``world_size * batch_size`` over the group) with their IS weights.

        A collective: every rank calls it with the same ``batch_size``.

        Args:
            batch_size: b >= 1 rows for this rank.
            beta: IS exponent for this call (float in [0, 1] or 0-d float device tensor); default the buffer's.

        Returns:
            A :class:`ShardedBatch`: rows ``[b, ...]``, ``indices``/``owners`` of each row's slot and
            shard, ``weights`` [b] float32 final IS weights (with the shard ratio in local mode).

        Raises:
            RuntimeError: every shard is empty (on every rank alike).
        """
        b = check_batch_size(batch_size)
        beta_t = self._beta.tensor(self.shard.beta if beta is None else beta, graphed=False, checked=beta is None)
        meta = self._gather_meta()
        self._check_filled(meta)
        # new items enter at the max priority of every shard, as in one buffer (device write, no sync)
        self.shard.tree.max_priority().copy_(meta[:, shards.META_MAX].amax())
        if self.mode == "exact":
            batch = self._sample_exact(b, beta_t, meta)
        else:
            batch = self._sample_local(b, beta_t, meta)
        batch.source = self._epoch
        return batch

    def _descend(self, n: int, beta: torch.Tensor, fractions: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """``n`` draws from this rank's shard: its own kernels, or the stratified descent from
        given fractions of its mass (exact stratified mode)."""
        core, tree = self.shard.core, self.shard.tree
        if fractions is None:
            words = core.rows.layout.words
            out = {
                "rows": torch.empty(n, words, dtype=torch.int32, device=self.device),
                "indices": torch.empty(n, dtype=torch.int64, device=self.device),
                "generations": torch.empty(n, dtype=torch.int32, device=self.device),
                "weights": torch.empty(n, dtype=torch.float32, device=self.device),
            }
            core.draw_into(out, beta)
            return out
        node, _ = reference.descend_from(tree.tree, tree.layout, fractions, tree.size)
        return {"rows": core.rows.words.index_select(0, node), "indices": node, "generations": tree.gen[node]}

    def _weights(
        self, p: torch.Tensor, beta: torch.Tensor, meta: torch.Tensor, drawn: torch.Tensor | None = None
    ) -> torch.Tensor:
        """IS weights ``(p / p_min) ** -beta``: p_min the smallest stored priority of every shard
        (global) or of the group's whole batch (batch, one all-reduce; ``drawn``, a 0-d bool device
        tensor, False: this rank's draws are none, an empty shard's); 1 in uniform mode."""
        if self.sampling == "uniform":
            return torch.ones_like(p)
        if self.weight_norm == "global":
            pmin = meta[:, shards.META_MIN].amin().float()
        else:
            # no tensor from a host value here: on a GPU it would be a copy that a graph capture refuses
            local = p.amin() if drawn is None else torch.where(drawn, p.amin(), torch.inf)
            pmin = self.group.all_reduce_min(local.reshape(1))[0]
        return reference.is_weights(p, pmin, beta)

    def _sample_exact(self, b: int, beta: torch.Tensor, meta: torch.Tensor) -> ShardedBatch:
        w, r = self.world_size, self.rank
        n = w * b
        mass = shards.masses(meta, self.sampling == "uniform")
        # one cumsum in rank order: every rank (and either back end) holds the same bits
        _, owner, fractions = self._kernels.shared_draws(
            cum=mass.cumsum(0),
            mass=mass,
            counter=self._shared_rng,
            ticket=self._draw_ticket,
            key=self._shared_key,
            n=n,
            stratified=self.sampling == "stratified",
            rank=r,
        )  # owner: [n], the same on every rank
        out = self._descend(n, beta, fractions)
        # the draws of other shards are zero in what this rank sends, so the sum over ranks is each
        # draw's owner's words, bit for bit; draw j * W + k goes to rank k (its rows span every stratum)
        packed = self._kernels.pack_rows(
            rows=out["rows"],
            indices=out["indices"],
            generations=out["generations"],
            leaves=self.shard.tree.leaves(),
            owner=owner,
            rank=r,
            world=w,
        )
        recv = self.group.reduce_scatter_sum(packed)
        rows, indices, gens, p, owners = self._kernels.unpack_rows(recv=recv, owner=owner, rank=r, world=w)
        weights = self._weights(p, beta, meta)
        return ShardedBatch(self.shard.rows.layout, rows, indices, weights, gens, owners)

    def _sample_local(self, b: int, beta: torch.Tensor, meta: torch.Tensor) -> ShardedBatch:
        out = self._descend(b, beta, None)
        mass = shards.masses(meta, self.sampling == "uniform")
        # the ratio W T_k / S; an empty shard draws slot 0 of priority 0: its ratio is 0, and so is its weight
        ratio, p, owners = self._kernels.local_priorities(
            cum=mass.cumsum(0),
            mass=mass,
            leaves=self.shard.tree.leaves(),
            indices=out["indices"],
            rank=self.rank,
            uniform=self.sampling == "uniform",
        )
        drawn = ratio > 0 if self.weight_norm == "batch" else None  # (global weights need no all-reduce)
        weights = self._kernels.local_weights(ratio=ratio, weights=self._weights(p, beta, meta, drawn=drawn))
        return ShardedBatch(self.shard.rows.layout, out["rows"], out["indices"], weights, out["generations"], owners)

    # ---------------------------------------------------------------- priorities

    def update_priorities(self, batch: ShardedBatch, td_errors: torch.Tensor) -> None:
        """Set priorities ``(|td| + eps) ** alpha`` of a batch's slots on the shards that own them.

        A collective in exact mode (one all-gather of 16 bytes a row, then a 4-byte all-reduce of
        the max priority, so that new items enter at the group's): every rank calls it in
        lockstep. Entries whose slot was overwritten since sampling are ignored and counted
        (``stats()["stale_updates"]``), as is a whole batch drawn before a :meth:`load_state_dict`
        or by another buffer. For a slot drawn more than once the last entry wins, in the order
        (rank, position in its batch).

        The arguments are checked on each rank before the collective: a bad ``td_errors`` on one
        rank only raises there and leaves the other ranks waiting in the all-gather (until the
        process group's timeout), so pass every rank the same shapes.

        Args:
            batch: the :class:`ShardedBatch` this rank drew.
            td_errors: [b] floating, on this rank's device.
        """
        if not isinstance(batch, ShardedBatch):
            raise TypeError(f"update_priorities(): expected the ShardedBatch of sample(), got {type(batch).__name__}")
        td = check_td(td_errors, batch.indices, self.device)
        stale = batch.source is not self._epoch
        tree, shard = self.shard.tree, self.shard
        if self.mode == "local":
            if stale:
                tree.count_stale(batch.indices.numel())
            elif len(shard) > 0:  # an empty shard's draws carry weight 0 and own no slot
                shard.core.set_priorities(batch.indices, td, batch.generations, shard.alpha, shard.eps)
            return
        mine = self._kernels.pack_updates(
            owners=batch.owners, indices=batch.indices, generations=batch.generations, td=td, stale=stale
        )
        every = self.group.all_gather(mine).view(-1, 4)  # rank-major: the order "last wins" follows
        if stale:
            tree.count_stale(batch.indices.numel())
        if len(shard) > 0:
            # entries of other shards are made stale (a generation that cannot match) and not counted
            slot, expected, td_all = self._kernels.unpack_updates(state=tree.state, every=every, rank=self.rank)
            shard.core.set_priorities(slot, td_all, expected, shard.alpha, shard.eps)
        # the max priority over every shard now, as one buffer's (4 bytes): items added before the
        # next sample enter at it, not at this shard's own max
        self.group.all_reduce_max(tree.max_priority().view(1))

    # ---------------------------------------------------------------- stats / checkpoints

    def stats(self) -> dict[str, Any]:
        """The group's figures (a collective: one all-gather and a host sync; not for hot paths).

        Returns:
            dict with ``size`` (N over every shard), ``total_priority`` (S), ``min_priority``,
            ``max_priority``, ``shard_sizes`` and ``shard_totals`` (lists in rank order),
            ``max_ratio_deviation`` (max over shards of ``|r_k - 1|``, ``r_k = W T_k / S``: local
            mode's weight factor, whose spread is its extra variance), the group's sums of
            ``stale_updates``, ``invalid_indices`` and ``nonfinite_td``, and ``shard``: this rank's
            own :meth:`gper.PrioritizedReplayBuffer.stats`.
        """
        tree = self.shard.tree
        counts = tree.counters[[C_STALE, C_INVALID, C_NONFINITE]].double()
        mine = torch.cat([torch.stack([tree.total(), tree.size.double(), tree.min().double()]), counts])
        meta = self.group.all_gather(torch.cat([mine, tree.max_priority().double().reshape(1)])).cpu()
        mass = meta[:, 1] if self.sampling == "uniform" else meta[:, 0]
        s = float(mass.sum())
        ratio_dev = float((self.world_size * mass / s - 1).abs().max()) if s > 0 else float("nan")
        return {
            "world_size": self.world_size,
            "mode": self.mode,
            "size": int(meta[:, 1].sum()),
            "total_priority": float(meta[:, 0].sum()),
            "min_priority": float(meta[:, 2].min()),
            "max_priority": float(meta[:, 6].max()),
            "shard_sizes": [int(x) for x in meta[:, 1]],
            "shard_totals": [float(x) for x in meta[:, 0]],
            "max_ratio_deviation": ratio_dev,
            "stale_updates": int(meta[:, 3].sum()),
            "invalid_indices": int(meta[:, 4].sum()),
            "nonfinite_td": int(meta[:, 5].sum()),
            "shard": self.shard.stats(),
        }

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard (:meth:`gper.PrioritizedReplayBuffer.state_dict`) plus what the group
        shares: world size, rank, mode, seed and the shared draws' counter. Save one per rank."""
        meta = {"world_size": self.world_size, "rank": self.rank, "mode": self.mode, "seed": self.seed}
        return {"shard": self.shard.state_dict(), "distributed": meta, "shared_rng": self._shared_rng}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore this rank's :meth:`state_dict` (a collective: every rank loads its own, in lockstep).

        Then the group draws what it would have drawn after the save. The group's part of every
        rank's state is checked on every rank (one all-gather) before anything changes.

        Raises:
            ValueError: on every rank, if any rank's state comes from another world size, rank,
                mode or seed, the ranks' shared counters differ, or the shard's own checks
                (:meth:`gper.PrioritizedReplayBuffer.load_state_dict`) refuse any rank's shard;
                then no rank changes.
        """
        self._load_agreed(
            state, "load_state_dict()", lambda agree: self.shard.load_state_dict(state["shard"], before_copy=agree)
        )

    def save(self, path: str | os.PathLike) -> dict[str, Any]:
        """Write this rank's shard to the file ``path`` (:meth:`gper.PrioritizedReplayBuffer.save`:
        streamed, atomic) and return the group's part of the state (world size, rank, mode, seed,
        the shared draws' counter as an int), to keep beside it and hand to :meth:`load`.
        Not a collective: each rank saves its own."""
        self.shard.save(path)
        state = self.state_dict()
        return {"distributed": state["distributed"], "shared_rng": int(state["shared_rng"])}

    def load(self, path: str | os.PathLike, group_state: Mapping[str, Any]) -> None:
        """Restore this rank's shard from the file :meth:`save` wrote and the group state it returned
        (a collective, checked as :meth:`load_state_dict` is, before the file is read).

        Raises:
            ValueError: as :meth:`load_state_dict`; or the file is refused by the shard's own checks.
        """
        rng = group_state.get("shared_rng") if isinstance(group_state, Mapping) else None
        state = dict(group_state) if isinstance(group_state, Mapping) else {}
        if isinstance(rng, int) and not isinstance(rng, bool):
            state["shared_rng"] = torch.tensor([rng], dtype=torch.int64)
        state["shard"] = path
        self._load_agreed(state, "load()", lambda agree: self.shard.load(path, before_copy=agree))

    def _load_agreed(self, state: Mapping[str, Any], what: str, load: Any) -> None:
        """Load this rank's shard with ``load(agree)`` once every rank agrees (:func:`load_agreed`)."""
        problem = state_problem(state, self.world_size, self.rank, self.mode, self.seed)
        load_agreed(self.group, self.device, state, self._shared_rng, problem, what, load)
        self._restored(state["shared_rng"])

    def _restored(self, shared_rng: torch.Tensor) -> None:
        self._shared_rng.copy_(shared_rng)
        self._seen_filled = False
        self._epoch = object()  # batches drawn before the load are stale now
