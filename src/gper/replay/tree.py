"""The priority tree: K-ary sum and min trees over the slots, with everything their kernels share.

:class:`PriorityTree` owns the device state that defines where samples land: the sum tree (draws),
the min tree (the smallest priority, for IS weights), each slot's generation (so a priority
update can tell that its slot was overwritten since it was sampled), the update's claim buffer,
and the int64 counters and float32 scalars of :mod:`gper.ops.state` (RNG offset, cursor, size,
counts of dropped input, max priority, beta). It holds them in one
:class:`~gper.ops.state.TreeState` (:attr:`PriorityTree.state`), made once, which its methods pass
to the kernels of one back end (:class:`gper.ops.ReplayKernels`); they never read a device value
on the host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from gper.ops import ReplayKernels
from gper.ops.layout import DEFAULT_ARITY, TreeLayout
from gper.ops.state import (
    C_CURSOR,
    C_SIZE,
    C_STALE,
    COUNTER_STATS,
    N_COUNTERS,
    N_SCALARS,
    S_BETA,
    S_MAXP,
    SampleOut,
    TreeState,
)
from gper.ops.tree import reference
from gper.replay.checkpoint import check_tensors

#: the tensors of :meth:`PriorityTree.state_dict`, by checkpoint name
STATE_NAMES = ("tree", "mintree", "gen", "counters", "scalars")


class PriorityTree:
    """Sum and min trees of ``capacity`` leaves on ``device``, driven by ``kernels``.

    Args:
        capacity: slots (leaves), any integer >= 1.
        kernels: the back end (:func:`gper.ops.kernels` of ``"tree"``), or any :class:`~gper.ops.ReplayKernels`.
        device: where every tensor lives.
        arity: children per node, a power of two.

    Attributes:
        layout: the :class:`~gper.ops.layout.TreeLayout`.
        tree: [numel + 1] float32 sum tree (leaves last, one trash cell at the end).
        mintree: [numel + 1] float32 min tree (+inf where nothing is stored).
        gen: [capacity] int32 generation of each slot (bumped by every write).
        claims: the update's claim buffer (all -1 between calls).
        counters: [N_COUNTERS] int64 device counters; scalars: [N_SCALARS] float32 device scalars.
        state: all of these and the layout in one :class:`~gper.ops.state.TreeState`, what the
            kernels take (the tensors never move: :meth:`load_state_dict` copies into them).
    """

    def __init__(
        self,
        capacity: int,
        kernels: ReplayKernels,
        device: torch.device,
        arity: int = DEFAULT_ARITY,
        tensors: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.layout = lay = TreeLayout.build(capacity, arity)
        self.kernels = kernels
        self.device = torch.device(device)
        if tensors is None:
            tensors = self.allocate(lay, kernels, self.device)
        self.tree, self.mintree, self.gen = tensors["tree"], tensors["mintree"], tensors["gen"]
        self.claims, self.counters, self.scalars = tensors["claims"], tensors["counters"], tensors["scalars"]
        self.state = TreeState(lay, self.tree, self.mintree, self.gen, self.claims, self.counters, self.scalars)

    @staticmethod
    def allocate(layout: TreeLayout, kernels: ReplayKernels, device: torch.device, n: int | None = None) -> dict:
        """A new tree's tensors, by name (:data:`STATE_NAMES` and ``claims``): empty trees, max
        priority 1. With ``n``, those of ``n`` trees stacked on a leading dimension (a buffer of
        ``instances=n``, whose trees are views of them)."""
        lead = () if n is None else (n,)
        claims = kernels.make_claims(layout=layout, device=device)
        # stacked trees: each row padded to a multiple of 32 floats (128 bytes), so that every
        # instance's tree starts aligned as a single tree does and a kernel serving all of them
        # keeps its vector loads of K children (a row of numel + 1 would shift each by 4 bytes)
        size = layout.numel + 1
        width = size if n is None else -(-size // 32) * 32
        out = {
            "tree": torch.zeros(*lead, width, dtype=torch.float32, device=device)[..., :size],
            "mintree": torch.full((*lead, width), math.inf, dtype=torch.float32, device=device)[..., :size],
            "gen": torch.zeros(*lead, layout.capacity, dtype=torch.int32, device=device),
            "claims": claims if n is None else claims.expand(n, *claims.shape).contiguous(),
            "counters": torch.zeros(*lead, N_COUNTERS, dtype=torch.int64, device=device),
            "scalars": torch.zeros(*lead, N_SCALARS, dtype=torch.float32, device=device),
        }
        out["scalars"][..., S_MAXP] = 1.0  # new items enter at the max priority seen, 1 until then
        return out

    @classmethod
    def from_leaves(
        cls,
        leaves: torch.Tensor | list[float],
        kernels: ReplayKernels,
        arity: int = DEFAULT_ARITY,
        size: int | None = None,
        device: torch.device | str = "cpu",
    ) -> PriorityTree:
        """A tree whose leaves are ``leaves`` (0 = never drawn) and whose counters report ``size``
        filled slots (default all): for tests and tools that drive the kernels directly."""
        leaves = torch.as_tensor(leaves, dtype=torch.float32, device=device)
        tree = cls(leaves.numel(), kernels, torch.device(device), arity)
        lo = tree.layout.leaf_offset
        tree.tree[lo : lo + leaves.numel()] = leaves
        tree.mintree[lo : lo + leaves.numel()] = torch.where(leaves > 0, leaves, math.inf)
        tree.rebuild()
        tree.counters[C_SIZE] = leaves.numel() if size is None else size
        return tree

    # ---------------------------------------------------------------- reads (0-d device tensors)

    @property
    def capacity(self) -> int:
        return self.layout.capacity

    @property
    def beta(self) -> torch.Tensor:
        """The 0-d float32 device scalar the sampling kernel reads beta from by default."""
        return self.scalars[S_BETA]

    @property
    def size(self) -> torch.Tensor:
        """0-d int64: filled slots, on the device."""
        return self.counters[C_SIZE]

    @property
    def cursor(self) -> torch.Tensor:
        """0-d int64: the next slot to write, on the device."""
        return self.counters[C_CURSOR]

    def _top(self, tree: torch.Tensor) -> torch.Tensor:
        off = self.layout.offsets[0]
        return tree[off : off + self.layout.arity]

    def total(self) -> torch.Tensor:
        """0-d float64 device tensor: the sum of every stored priority (the root's mass)."""
        return self._top(self.tree).double().sum()

    def min(self) -> torch.Tensor:
        """0-d float32 device tensor: the smallest stored priority (+inf when empty)."""
        return self._top(self.mintree).amin()

    def max_priority(self) -> torch.Tensor:
        """0-d float32 device tensor: the running max priority (new items enter at it)."""
        return self.scalars[S_MAXP]

    def leaves(self) -> torch.Tensor:
        """[capacity] view of the sum tree's leaves (the stored priorities)."""
        lo = self.layout.leaf_offset
        return self.tree[lo : lo + self.capacity]

    def priorities(self, indices: torch.Tensor) -> torch.Tensor:
        """Stored priorities of ``indices`` [B] int64; NaN for indices outside [0, size)."""
        ok = (indices >= 0) & (indices < self.size)
        leaf = self.tree[self.layout.leaf_offset + torch.where(ok, indices, 0)]
        return torch.where(ok, leaf, float("nan"))

    def read_counts(self) -> dict[str, int | float]:
        """The counters and scalars as host numbers: one host sync (not for hot paths)."""
        c = self.counters.tolist()
        out: dict[str, int | float] = {name: int(c[i]) for name, i in COUNTER_STATS.items()}
        return out | {"max_priority": float(self.max_priority()), "total_priority": float(self.total())}

    # ---------------------------------------------------------------- writes (device work only)

    def positions(self, n: int, skip: int = 0) -> torch.Tensor:
        """[n] int64 slots for ``n`` new items after skipping ``skip`` (a batch larger than the tree)."""
        return self.kernels.add_positions(state=self.state, n=n, skip=skip)

    def commit(self, positions: torch.Tensor, total: int, leaf_value: float | None = None) -> None:
        """Slots ``positions`` (just written) enter at ``leaf_value`` (default: the max priority),
        their generations advance, and cursor and size move on by ``total`` items."""
        self.kernels.add_commit(state=self.state, pos=positions, total=total, leaf_value=leaf_value)

    def add_plan(self, fields: tuple[tuple[int, int], ...], words: int) -> object:
        """The back end's packing plan for :meth:`add_rows` of rows of ``fields`` (``(byte offset,
        bytes)`` each, ``words`` int32 words a row); made once, when a buffer is built."""
        return self.kernels.make_add_plan(fields=fields, words=words, device=self.device)

    def add_rows(
        self,
        rows: torch.Tensor,
        fields: tuple[tuple[int, int], ...],
        values: tuple[torch.Tensor, ...],
        plan: object,
        skip: int,
        total: int,
        leaf_value: float | None = None,
    ) -> torch.Tensor:
        """The whole add: ``values`` (on the device) written into ``rows`` at the next slots, which
        enter at ``leaf_value`` (default the max priority); cursor and size move on by ``total``.
        Returns the [n] int64 slots written (one launch on the Triton back end)."""
        return self.kernels.add_rows(
            state=self.state,
            rows=rows,
            fields=fields,
            values=values,
            plan=plan,
            skip=skip,
            total=total,
            leaf_value=leaf_value,
        )

    def update(
        self,
        indices: torch.Tensor,
        td: torch.Tensor,
        expected_gen: torch.Tensor | None,
        alpha: float,
        eps: float,
    ) -> None:
        """Priorities ``(|td| + eps) ** alpha`` for ``indices`` (see :func:`gper.ops.tree.reference.update`)."""
        self.kernels.update(
            state=self.state,
            idx=indices.contiguous(),
            td=td.contiguous(),
            expected_gen=expected_gen,
            alpha=alpha,
            eps=eps,
        )

    def count_stale(self, n: int) -> None:
        """Count ``n`` update entries ignored as stale (a whole batch from before a restore)."""
        self.counters[C_STALE] += n

    def set_keys(
        self, keys: torch.Tensor, indices: torch.Tensor, td: torch.Tensor, expected_gen: torch.Tensor | None, eps: float
    ) -> None:
        """Rank mode: sort keys ``|td| + eps`` into ``keys``, with the checks and counts of :meth:`update`."""
        self.kernels.set_keys(
            state=self.state,
            keys=keys,
            idx=indices.contiguous(),
            td=td.contiguous(),
            expected_gen=expected_gen,
            eps=eps,
        )

    def set_leaves(self, values: torch.Tensor) -> None:
        """Leaves ``0 .. len(values)`` of both trees become ``values`` (0: an empty leaf); then :meth:`rebuild`."""
        lo, n = self.layout.leaf_offset, values.numel()
        self.tree[lo : lo + n] = values
        self.mintree[lo : lo + n] = torch.where(values > 0, values, math.inf)  # an empty leaf is no minimum
        self.rebuild()

    def batch_weights(self, indices: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """IS weights of ``indices`` normalised by the smallest of their own priorities (``batch``
        normalisation), computed as the reference back end computes weights, whatever the back end."""
        leaf = self.tree[self.layout.leaf_offset + indices]
        return reference.is_weights(leaf, leaf.amin(), beta)

    def rebuild(self) -> None:
        """Recompute every inner node of both trees from the leaves (O(capacity))."""
        self.kernels.rebuild(state=self.state)

    def sample_into(
        self, rows: torch.Tensor, seed: int, mode: int, beta: torch.Tensor, out: Mapping[str, torch.Tensor]
    ) -> None:
        """Draw ``len(out["indices"])`` slots of ``rows`` into ``out`` (``rows``, ``indices``,
        ``generations``, ``weights``) with IS exponent ``beta`` (0-d float32 device tensor)."""
        self.kernels.sample(
            state=self.state,
            rows=rows,
            seed=seed,
            mode=mode,
            beta=beta,
            out=SampleOut(out["rows"], out["indices"], out["generations"], out["weights"]),
        )

    # ---------------------------------------------------------------- checkpoint

    @staticmethod
    def estimate_bytes(layout: TreeLayout) -> int:
        """Device bytes of a tree of ``layout``: both trees, generations, claims (the larger back end's)."""
        claims = 8 * (layout.capacity + layout.arity + layout.leaf_offset)  # with the climb's counters
        return 2 * 4 * (layout.numel + 1) + 4 * layout.capacity + claims

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {
            "tree": self.tree,
            "mintree": self.mintree,
            "gen": self.gen,
            "counters": self.counters,
            "scalars": self.scalars,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tree's own tensors (not copies), by :data:`STATE_NAMES`."""
        return self._tensors()

    def check_state(self, state: Mapping[str, object], what: str = "load_state_dict()") -> None:
        """Raise ValueError unless ``state`` holds every tensor of :meth:`state_dict` with its shape and dtype."""
        check_tensors(state, self._tensors(), what)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy a :meth:`state_dict` in place (addresses kept, so captured graphs stay valid)."""
        self.check_state(state)
        for name, dst in self._tensors().items():
            dst.copy_(state[name])
