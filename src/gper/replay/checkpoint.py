"""The checkpoint form of a buffer: its settings, its tensors by name, and the host's counts.

A state is checked whole before anything is copied, so a refused load leaves the buffer as it
was: first its form (:func:`check_state`: the settings it was saved with, every tensor's shape
and dtype), then what its tensors hold (:func:`check_contents`: counters in range, priorities
finite and within ``P_MAX``, no mass on slots never filled, inner nodes that agree with their
leaves, ...), on the buffer's device and with one host read for all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import (
    C_CURSOR,
    C_INVALID,
    C_SIZE,
    C_TICKET,
    C_TICKET_TOP,
    COUNTS,
    P_MAX,
    P_MIN,
    S_BETA,
    S_MAXP,
)
from gper.ops.tree import reference

#: how far a stored inner node of the sum tree may be from the sum of its leaves, relative to
#: that sum: the float32 rounding of summing K children per level in another order (the back
#: ends sum in different orders), a few levels deep, is below 1e-5
_SUM_RTOL = 1e-4


#: tensors a state or a buffer file may hold for the filled slots only (their first ``size``
#: entries: slots fill in order, and the rows and generations past them are never read)
PREFIX_TENSORS = ("rows", "gen")


def widen_prefixes(state: object, tensors: Mapping[str, torch.Tensor]) -> tuple[object, int | None]:
    """``state`` with a ``rows`` / ``gen`` of the filled slots only widened to the shape of
    ``tensors``' (zeros past them), and how many rows it held (None when whole)."""
    if not isinstance(state, Mapping):
        return state, None  # refused by check_state
    out, held = dict(state), None
    for name in PREFIX_TENSORS:
        mine, theirs = tensors[name], state.get(name)
        if (
            isinstance(theirs, torch.Tensor)
            and theirs.dtype == mine.dtype
            and theirs.dim() == mine.dim()
            and theirs.shape[1:] == mine.shape[1:]
            and theirs.shape[0] < mine.shape[0]
        ):
            out[name] = torch.zeros_like(mine, device=theirs.device)
            out[name][: theirs.shape[0]] = theirs
            if name == "rows":
                held = theirs.shape[0]
    return out, held


def check_state(state: object, config: dict[str, Any], tensors: Mapping[str, torch.Tensor]) -> tuple[int, Mapping]:
    """The ``(seed, host counts)`` of ``state``, after checking that it was saved by a buffer with
    ``config`` and holds every tensor of ``tensors`` with its shape and dtype.

    Raises:
        ValueError: naming the first thing that differs or is missing.
    """
    theirs = state.get("config") if isinstance(state, Mapping) else None
    if theirs != config:
        keys = set(config) | (set(theirs) if isinstance(theirs, Mapping) else set())  # a setting of theirs only too
        diff = sorted(k for k in keys if not isinstance(theirs, Mapping) or theirs.get(k) != config.get(k))
        raise ValueError(f"load_state_dict(): configuration differs in {diff}")
    check_tensors(state, tensors)
    host, seed = state.get("host"), state.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"load_state_dict(): 'seed' missing or invalid: {seed!r}")
    if not isinstance(host, Mapping) or not {"size", "updates_since_refresh"} <= host.keys():
        raise ValueError("load_state_dict(): 'host' missing or incomplete")
    for key in ("size", "updates_since_refresh"):
        value = host[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"load_state_dict(): host[{key!r}] must be an int >= 0, got {value!r}")
    return seed, host


def check_tensors(
    state: Mapping[str, object], tensors: Mapping[str, torch.Tensor], what: str = "load_state_dict()"
) -> None:
    """Raise ValueError unless ``state`` holds every tensor of ``tensors`` with its shape and dtype."""
    for name, dst in tensors.items():
        src = state.get(name)
        if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(f"{what}: {name!r} missing or of the wrong shape/dtype")


def _real_cells(layout: TreeLayout, device: torch.device) -> torch.Tensor:
    """[numel] bool: True on the cells that hold a node (False on each level's padding)."""
    real = torch.zeros(layout.numel, dtype=torch.bool, device=device)
    for off, n in zip(layout.offsets, layout.sizes, strict=True):
        real[off : off + n] = True
    return real


def _tree_checks(
    stored_tree: torch.Tensor, stored_min: torch.Tensor, layout: TreeLayout, device: torch.device
) -> dict[str, torch.Tensor]:
    """Named failed-checks of the trees' shape: padding, and inner nodes against a rebuild from the leaves."""
    real = _real_cells(layout, device)
    lo = layout.leaf_offset
    checks: dict[str, torch.Tensor] = {}
    body = slice(0, layout.numel)  # the last cell is the trash cell, which holds anything
    checks["the trees' padding is not 0 (sum) and inf (min)"] = (~real & (stored_tree[body] != 0)).any() | (
        ~real & (stored_min[body] != float("inf"))
    ).any()
    # inner nodes against a rebuild from the leaves (finite leaves only: else the check above fails)
    tree = torch.where(torch.isfinite(stored_tree), stored_tree, 0.0)
    mintree = torch.where(torch.isnan(stored_min), 0.0, stored_min)
    reference.rebuild_trees(tree, mintree, layout)
    inner = real.clone()
    inner[lo:] = False
    stored, want = stored_tree[body], tree[body]
    checks["an inner node of the sum tree differs from the sum of its leaves"] = (
        inner & ~((stored - want).abs() <= _SUM_RTOL * want.abs())
    ).any()
    checks["an inner node of the min tree differs from the min of its leaves"] = (
        inner & (stored_min[body] != mintree[body])
    ).any()
    return checks


def check_contents(
    state: Mapping[str, torch.Tensor],
    layout: TreeLayout,
    host_size: int,
    device: torch.device,
    carries: torch.Tensor | None = None,
    written: torch.Tensor | None = None,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> tuple[int, int]:
    """Check what the tree's tensors of ``state`` hold; return (filled slots, dropped update entries).

    Works on copies on ``device`` (the tree, not the rows: they hold whatever was added) and
    reads the outcome of every check in one host sync.

    Args:
        carries, written: [capacity] bool, for a buffer whose slots do not fill in order (the
            trajectory buffer's): the slots that must have a priority (and no others), and the
            slots ever written (generation >= 1; the others 0). Default: the first ``size`` slots, both.
        extra: more named checks (0-d bool device tensors, True = failed), read in the same sync.

    Raises:
        ValueError: naming every check that failed.
    """
    cap = layout.capacity
    t = {name: state[name].detach().to(device) for name in ("tree", "mintree", "gen", "counters", "scalars")}
    counters, scalars = t["counters"], t["scalars"]
    size, cursor = counters[C_SIZE], counters[C_CURSOR]
    slot = torch.arange(cap, device=device)
    filled = slot < size if carries is None else carries.to(device)
    written = filled if written is None else written.to(device)
    lo = layout.leaf_offset
    leaves, minleaves = t["tree"][lo : lo + cap], t["mintree"][lo : lo + cap]
    maxp = scalars[S_MAXP]
    checks: dict[str, torch.Tensor] = {
        "size is outside [0, capacity]": (size < 0) | (size > cap),
        "cursor is outside [0, capacity)": (cursor < 0) | (cursor >= cap),
        "cursor differs from size before the buffer is full": (size < cap) & (cursor != size),
        "a count (RNG offset, invalid, non-finite or stale updates) is negative": (counters[list(COUNTS)] < 0).any(),
        "a kernel's scratch counter is not 0": (counters[[C_TICKET, C_TICKET_TOP]] != 0).any(),
        "the max priority is not in (0, 2**64]": ~((maxp > 0) & (maxp <= P_MAX)),
        "beta is not in [0, 1]": ~((scalars[S_BETA] >= 0) & (scalars[S_BETA] <= 1)),
        "a priority is negative, NaN, infinite or above 2**64": ~((leaves >= 0) & (leaves <= P_MAX)).all(),
        # a subnormal priority could read as 0 on a GPU (its log2 may flush it)
        "a filled slot has priority 0 or below 2**-126": (filled & (leaves < P_MIN)).any(),
        "a slot never filled has a priority (mass on empty slots)": (~filled & (leaves != 0)).any(),
        "a priority exceeds the max priority": (torch.where(filled, leaves, 0.0) > maxp).any(),
        "the min tree's leaves differ from the sum tree's": (filled & (minleaves != leaves)).any()
        | (~filled & (minleaves != float("inf"))).any(),
        "a filled slot has generation < 1, or a slot never filled one != 0": (written & (t["gen"] < 1)).any()
        | (~written & (t["gen"] != 0)).any(),
    }
    checks |= _tree_checks(t["tree"], t["mintree"], layout, device)
    if "key" in state:  # rank mode's sort keys
        keys = state["key"].detach().to(device)[:cap]
        checks["a rank key is negative, NaN or infinite"] = ~((keys >= 0) & (keys < float("inf"))).all()
        checks["a slot never filled has a rank key"] = (~written & (keys != 0)).any()
    checks |= dict(extra or {})
    names = list(checks)
    failed = torch.stack([checks[n].long() for n in names] + [size, counters[C_INVALID]]).tolist()
    bad = [n for n, f in zip(names, failed[:-2], strict=True) if f]
    if bad:
        raise ValueError(f"load_state_dict(): the state is corrupt: {'; '.join(bad)}")
    n = int(failed[-2])
    if host_size > n:
        raise ValueError(f"load_state_dict(): host size {host_size} exceeds the {n} filled slots")
    return n, int(failed[-1])
