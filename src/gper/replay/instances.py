"""Several independent buffers in one storage: the setting ``instances=N`` and its stacked tensors.

A buffer of ``instances=N`` holds N buffers ("instances"), each with its own tree, cursor, size,
generations, counters, max priority and random stream (instance ``i`` draws with seed
``seed + i``), in tensors with a leading ``[N]`` dimension: :class:`InstanceStack`. Each
instance is a buffer of its own built on views of them (:class:`Member`), so it behaves, bit for
bit, as a single buffer of its settings; the stacked buffer's calls run every instance's work in
one call (one CUDA graph of the buffer's own, and one launch per kernel where the back end draws
for all instances at once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gper.ops import ReplayKernels
from gper.ops.layout import TreeLayout
from gper.ops.state import TreeState
from gper.replay.tree import STATE_NAMES, PriorityTree

#: the settings that may differ between instances (each a float, or a sequence or [N] tensor of them)
PER_INSTANCE = ("alpha", "beta", "eps")


def check_instances(value: object) -> int | None:
    """``instances``: None (one buffer, today's shapes) or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"instances must be None or an int >= 1, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"instances must be None or an int >= 1, got {value}")
    return value


def split_setting(name: str, value: object, n: int) -> list[object]:
    """The value of setting ``name`` for each of ``n`` instances: a float is every instance's; a
    sequence or 1-D tensor of ``n`` gives one each (read on the host once, when the buffer is built:
    each instance's checks then see a plain float)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return [value.item()] * n
        if value.dim() != 1 or value.numel() != n or not (value.dtype.is_floating_point or value.dtype.is_signed):
            shape = tuple(value.shape)
            raise ValueError(f"{name} must be a float or [{n}] values (one per instance), got shape {shape}")
        return value.detach().cpu().double().tolist()
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n:
            raise ValueError(f"{name} must be a float or {n} values (one per instance), got {len(value)}")
        return list(value)
    return [value] * n


def instance_settings(given: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Each instance's own settings: ``given`` with its seed ``seed + i`` and its own
    :data:`PER_INSTANCE` values, as one buffer (no instances, no graphs of its own: the stacked
    buffer captures its calls whole, and handles running out of memory itself)."""
    seed = given["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**63 - n:
        raise ValueError(f"seed must be an int in [0, 2**63 - instances] (instance i uses seed + i), not {seed!r}")
    values = {name: split_setting(name, given[name], n) for name in PER_INSTANCE}
    base = dict(given) | {"instances": None, "cuda_graphs": False, "cpu_fallback": False}
    return [base | {"seed": seed + i} | {name: values[name][i] for name in PER_INSTANCE} for i in range(n)]


def check_seed_room(seed: int, n: int) -> None:
    """A restored ``seed`` must leave room for ``n`` instances (instance ``i`` draws with ``seed + i``)."""
    if seed > 2**63 - n:
        raise ValueError(f"load_state_dict(): seed {seed} leaves no room for {n} instances")


@dataclass
class InstanceStack:
    """The tensors of ``n`` instances with a leading [n] dimension: the rows, the trees' and, by
    name, any a buffer kind adds (:meth:`extra`). Every instance's own tensors are views of these
    (``[i]``), so a whole-buffer state is these tensors, and a kernel that serves every instance
    at once reads them (:meth:`tree_state`)."""

    n: int
    layout: TreeLayout
    rows: torch.Tensor
    tree: dict[str, torch.Tensor]

    @staticmethod
    def build(
        n: int, layout: TreeLayout, row_bytes: int, kernels: ReplayKernels, device: torch.device
    ) -> InstanceStack:
        rows = torch.zeros(n, layout.capacity, row_bytes, dtype=torch.uint8, device=device)
        return InstanceStack(n, layout, rows, PriorityTree.allocate(layout, kernels, device, n))

    def state_tensors(self, per_member: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """A whole-buffer state's tensors from each member's (``per_member``, a single buffer's
        state tensors, by name, in its order): the stack's own rows and trees (no copies), and the
        other tensors, which each member holds apart (rank mode's keys, a trajectory buffer's
        streams), stacked (copies)."""
        own = {"rows": self.rows} | {name: self.tree[name] for name in STATE_NAMES}
        stacked = lambda name: torch.stack([m[name] for m in per_member])  # noqa: E731
        return {name: own[name] if name in own else stacked(name) for name in per_member[0]}

    def load(self, state: Mapping[str, torch.Tensor], copy_rows: Callable[[torch.Tensor], object]) -> None:
        """Copy a checked state's rows (by ``copy_rows(rows)``) and trees into the stack."""
        copy_rows(self.rows)
        for name in STATE_NAMES:
            self.tree[name].copy_(state[name])

    def member(self, i: int) -> Member:
        return Member(self, i)

    def tree_state(self) -> TreeState:
        """Every instance's trees as one :class:`TreeState` whose tensors have a leading [n]."""
        t = self.tree
        return TreeState(self.layout, t["tree"], t["mintree"], t["gen"], t["claims"], t["counters"], t["scalars"])


@dataclass(frozen=True)
class Member:
    """Instance ``index`` of a stack: where its buffer's tensors live."""

    stack: InstanceStack
    index: int

    @property
    def rows(self) -> torch.Tensor:
        return self.stack.rows[self.index]

    def tree_tensors(self) -> dict[str, torch.Tensor]:
        return {name: t[self.index] for name, t in self.stack.tree.items()}


class InstanceSetting:
    """``alpha``, ``beta`` or ``eps`` of a buffer of several instances: a tuple of each instance's
    value; assigning one value or N values sets them (each checked before any is set)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else tuple(getattr(m, self.name) for m in obj.members)

    def __set__(self, obj: Any, value: object) -> None:
        from gper.replay.config import MUTABLE

        values = [MUTABLE[self.name](v) for v in split_setting(self.name, value, obj.instances)]
        for m, v in zip(obj.members, values, strict=True):
            setattr(m, self.name, v)
        if self.name != "beta":  # captured graphs froze alpha and eps; beta is read from a device scalar
            obj._graphs.clear()
