"""A walk-forward fold's outcome: its calendar windows, the checkpoint it chose, and the per-bar
log P&L and trades of the policy, of buy-and-hold and of the classical baselines
(:mod:`gper.walkforward.baselines`) on its test bars.

Each fold trains on one calendar window, picks a checkpoint on the next (validation) and trades
the one after (test) once. Flat (position 0 throughout) earns 0 with no trades, so it needs no
arrays. The folds' test windows never overlap: joined in time order (:func:`in_time_order`) they
are one walk through data no checkpoint was trained or chosen on.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gper.walkforward.baselines import BASELINES
from gper.walkforward.scores import check_times, pnl_scores

#: the per-bar arrays of a fold besides its times
ARRAYS = ("policy_pnl", "policy_traded", "hold_pnl", "hold_traded")


def iso(time_ns: int) -> str:
    """An ISO 8601 date (``2024-03-01``) of a bar at midnight UTC, else its date and time to the second."""
    t = np.datetime64(int(time_ns), "ns")
    day = t.astype("datetime64[D]")
    return str(day) if t == day else str(t.astype("datetime64[s]"))


@dataclass
class Window:
    """A span of bars: the ISO dates (:func:`iso`) of its first and last bar, and how many bars it holds."""

    start: str
    end: str
    bars: int

    def __post_init__(self) -> None:
        if not (isinstance(self.start, str) and isinstance(self.end, str)):
            raise ValueError(f"a window's start and end must be ISO strings, got {self.start!r} and {self.end!r}")
        if isinstance(self.bars, bool) or not isinstance(self.bars, (int, np.integer)) or self.bars < 0:
            raise ValueError(f"a window's bars must be an int >= 0, got {self.bars!r}")
        self.bars = int(self.bars)

    @classmethod
    def of(cls, time_ns: np.ndarray) -> Window:
        """The window of bars at ``time_ns`` (int64 ``[n]``, ``n >= 1``, strictly increasing)."""
        times = check_times("time_ns", time_ns)
        if len(times) == 0:
            raise ValueError("a window needs at least one bar")
        return cls(iso(times[0]), iso(times[-1]), len(times))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Window:
        return cls(d["start"], d["end"], d["bars"])


def _array(name: str, values: np.ndarray, n: int) -> np.ndarray:
    out = np.asarray(values)
    if out.ndim != 1 or len(out) != n:
        raise ValueError(f"{name} must be 1-D of the {n} test bars, got shape {list(out.shape)}")
    if not (np.issubdtype(out.dtype, np.floating) or np.issubdtype(out.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {out.dtype}")
    out = out.astype(np.float64)
    if not np.isfinite(out).all():
        raise ValueError(f"{name} must be finite: bar {int(np.flatnonzero(~np.isfinite(out))[0])} is not")
    return out


def _members(name: str, members: tuple[np.ndarray, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(members, (tuple, list)) or len(members) != 2:
        raise ValueError(f"{name} must be a pair (log_pnl, traded) of [S, {n}] arrays")
    pnl, traded = (np.asarray(a) for a in members)
    if pnl.ndim != 2 or pnl.shape != traded.shape or pnl.shape[1] != n or pnl.shape[0] < 1:
        raise ValueError(
            f"{name} must be two [S, {n}] arrays (S >= 1), got shapes {list(pnl.shape)} and {list(traded.shape)}"
        )
    pnl, traded = (
        np.stack([_array(f"{name} {what} of member {i}", row, n) for i, row in enumerate(a)])
        for what, a in (("log P&L", pnl), ("traded", traded))
    )
    if (traded < 0).any():
        raise ValueError(f"{name}: traded must be >= 0 (it is |p' - p|)")
    return pnl, traded


@dataclass
class FoldOutcome:
    """One fold: its windows, the checkpoint it chose, and what its test bars earned.

    Attributes:
        index: the fold's number.
        train, val, test: its training, validation and test windows.
        chosen: the checkpoint picked on the validation window, free-form and JSON-serialisable,
            e.g. ``{"epoch": 3, "env_step": 120000, "val_sharpe": 0.05, "flat": False}``.
        time_ns: int64 ``[n]``, ``n >= 1``, strictly increasing: the time of each test bar whose
            return is earned.
        policy_pnl, policy_traded: float64 ``[n]``: the policy's log P&L after costs and ``|p' - p|``.
        hold_pnl, hold_traded: float64 ``[n]``: the same for buy-and-hold (+1 throughout, the entry
            cost paid on the first bar: :func:`gper.walkforward.scores.buy_and_hold`).
        baselines: ``{name: (log_pnl, traded)}``, float64 ``[n]`` each, for the classical baselines
            of :data:`~gper.walkforward.baselines.BASELINES` (:func:`~gper.walkforward.baselines.baseline_walk`);
            empty for a fold recorded before they were reported.
        members: for an ensemble (:mod:`gper.walkforward.ensemble`), each member's ``(log_pnl,
            traded)`` as it would trade alone, float64 ``[S, n]`` each (the policy's arrays are
            the ensemble's); None for a single policy.
    """

    index: int
    train: Window
    val: Window
    test: Window
    chosen: dict[str, Any]
    time_ns: np.ndarray
    policy_pnl: np.ndarray
    policy_traded: np.ndarray
    hold_pnl: np.ndarray
    hold_traded: np.ndarray = field(repr=False)
    baselines: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    members: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, (int, np.integer)):
            raise ValueError(f"a fold's index must be an int, got {self.index!r}")
        self.index = int(self.index)
        for name in ("train", "val", "test"):
            if not isinstance(getattr(self, name), Window):
                raise ValueError(
                    f"fold {self.index}: {name} must be a Window, got {type(getattr(self, name)).__name__}"
                )
        if not isinstance(self.chosen, dict):
            raise ValueError(f"fold {self.index}: chosen must be a dict, got {type(self.chosen).__name__}")
        self.time_ns = check_times(f"fold {self.index}: time_ns", self.time_ns).copy()
        n = len(self.time_ns)
        if n == 0:
            raise ValueError(f"fold {self.index}: the test window needs at least one bar")
        for name in ARRAYS:
            setattr(self, name, _array(f"fold {self.index}: {name}", getattr(self, name), n))
        for name in ("policy_traded", "hold_traded"):
            if (getattr(self, name) < 0).any():
                raise ValueError(f"fold {self.index}: {name} must be >= 0 (it is |p' - p|)")
        if not isinstance(self.baselines, dict) or not set(self.baselines) <= set(BASELINES):
            raise ValueError(f"fold {self.index}: baselines must be a dict of some of {list(BASELINES)}")
        checked = {}
        for name in BASELINES:
            if name in self.baselines:
                pnl, traded = self.baselines[name]
                traded = _array(f"fold {self.index}: {name} traded", traded, n)
                if (traded < 0).any():
                    raise ValueError(f"fold {self.index}: {name} traded must be >= 0 (it is |p' - p|)")
                checked[name] = (_array(f"fold {self.index}: {name} log P&L", pnl, n), traded)
        self.baselines = checked
        if self.members is not None:
            self.members = _members(f"fold {self.index}: members", self.members, n)

    def member_scores(self, bars_per_year: float | None) -> list[dict[str, float | int | None]]:
        """:func:`pnl_scores` of each member of an ensemble on this fold's test bars (empty for a single policy)."""
        if self.members is None:
            return []
        return [pnl_scores(p, t, bars_per_year) for p, t in zip(*self.members, strict=True)]

    def scores(self, bars_per_year: float | None) -> dict[str, dict[str, float | int | None]]:
        """:func:`pnl_scores` of the policy, buy-and-hold, flat and the baselines on this fold's test bars."""
        zeros = np.zeros(len(self.time_ns))
        return {
            "policy": pnl_scores(self.policy_pnl, self.policy_traded, bars_per_year),
            "buy_and_hold": pnl_scores(self.hold_pnl, self.hold_traded, bars_per_year),
            "flat": pnl_scores(zeros, zeros, bars_per_year),
            **{name: pnl_scores(pnl, traded, bars_per_year) for name, (pnl, traded) in self.baselines.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, arrays as lists (``time_ns`` as ints): JSON-serialisable."""
        out: dict[str, Any] = {"index": self.index, "chosen": self.chosen}
        out.update({name: getattr(self, name).to_dict() for name in ("train", "val", "test")})
        out["time_ns"] = self.time_ns.tolist()
        out.update({name: getattr(self, name).tolist() for name in ARRAYS})
        out["baselines"] = {name: {"pnl": p.tolist(), "traded": t.tolist()} for name, (p, t) in self.baselines.items()}
        if self.members is not None:
            out["members"] = {"pnl": self.members[0].tolist(), "traded": self.members[1].tolist()}
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FoldOutcome:
        """The fold that :meth:`to_dict` wrote."""
        windows = {name: Window.from_dict(d[name]) for name in ("train", "val", "test")}
        arrays = {name: np.asarray(d[name], dtype=np.float64) for name in ARRAYS}
        baselines = {
            name: (np.asarray(b["pnl"]), np.asarray(b["traded"])) for name, b in d.get("baselines", {}).items()
        }
        members = d.get("members")
        if members is not None:
            members = (np.asarray(members["pnl"], dtype=np.float64), np.asarray(members["traded"], dtype=np.float64))
        return cls(
            d["index"], chosen=d["chosen"], time_ns=np.asarray(d["time_ns"], dtype=np.int64), **windows, **arrays,
            baselines=baselines, members=members,
        )  # fmt: skip


def in_time_order(folds: list[FoldOutcome]) -> list[FoldOutcome]:
    """The folds sorted by their first test bar; ValueError if two share an index or their test bars overlap."""
    if not folds:
        raise ValueError("a walk-forward report needs at least one fold")
    seen: set[int] = set()
    for fold in folds:
        if not isinstance(fold, FoldOutcome):
            raise ValueError(f"folds must be FoldOutcome, got {type(fold).__name__}")
        if fold.index in seen:
            raise ValueError(f"two folds have index {fold.index}")
        seen.add(fold.index)
    ordered = sorted(folds, key=lambda f: int(f.time_ns[0]))
    for before, after in itertools.pairwise(ordered):
        if after.time_ns[0] <= before.time_ns[-1]:
            raise ValueError(
                f"the test bars of folds {before.index} (to {iso(before.time_ns[-1])}) and {after.index} "
                f"(from {iso(after.time_ns[0])}) overlap: out-of-sample time must be strictly increasing"
            )
    return ordered
