"""Walk-forward folds of a bar series by calendar time: train, validation and test windows that
roll forward.

Fold ``k`` starts ``k * step`` units after the first bar's unit and holds three adjacent windows,
``train`` units, then ``val``, then ``test``; a bar belongs to the window whose units contain its
timestamp. The unit is a calendar month (``datetime64[M]`` of the bar's UTC time), a calendar
day, or one bar. Folds stop at the last one whose test window lies wholly inside the data's units
(the data's last month or day counts as covered). ``step >= test``, so test windows never
overlap: concatenated, they are one out-of-sample period, each bar scored once.

Windows are half-open bar ranges ``[start, end)``. Every window must hold bars; the training
window needs enough for one observation and a return (:data:`gper.envs.market.MIN_BARS`) and the
validation and test windows need :data:`HISTORY` bars before them (features look back that far).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from gper.envs.market import MIN_BARS, WARMUP

Unit = Literal["months", "days", "bars"]
UNITS: tuple[str, ...] = ("months", "days", "bars")
HISTORY = WARMUP + 1
"""Bars before a validation or test window that its environment reads as history: the first
decision, at the bar before the window, earns the window's first return."""


@dataclass(frozen=True)
class Window:
    """Bars ``[start, end)`` of the series."""

    start: int
    end: int

    @property
    def bars(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Fold:
    """One fold: adjacent training, validation and test windows."""

    index: int
    train: Window
    val: Window
    test: Window


@dataclass(frozen=True)
class WalkSpec:
    """Window lengths in ``unit``: train, validation and test, and the step between folds."""

    unit: Unit
    train: int
    val: int
    test: int
    step: int

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"walk-forward unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        for name in ("train", "val", "test", "step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"the {name} window must be an integer >= 1 {self.unit}, got {value!r}")
        if self.step < self.test:
            raise ValueError(
                f"step ({self.step} {self.unit}) is shorter than the test window ({self.test} {self.unit}): "
                "test windows would overlap, and the out-of-sample period would count bars twice"
            )

    def describe(self) -> str:
        return f"train {self.train}, validation {self.val}, test {self.test}, step {self.step} {self.unit}"


def bar_units(time_ns: np.ndarray, unit: Unit) -> np.ndarray:
    """int64 ``[T]``: each bar's unit number (months or days since the epoch, or its index)."""
    t = np.asarray(time_ns, dtype=np.int64)
    if unit == "bars":
        return np.arange(len(t), dtype=np.int64)
    kind = "M" if unit == "months" else "D"
    return t.astype("datetime64[ns]").astype(f"datetime64[{kind}]").astype(np.int64)


def walk_forward_folds(time_ns: np.ndarray, spec: WalkSpec) -> list[Fold]:
    """The folds of bars at ``time_ns`` (int64 nanoseconds, strictly increasing) under ``spec``.

    Raises:
        ValueError: timestamps out of order, no complete fold, or a fold whose window lacks bars
            (naming the fold and the window).
    """
    t = np.asarray(time_ns, dtype=np.int64)
    if t.ndim != 1 or len(t) < 2:
        raise ValueError(f"walk-forward needs a 1-D series of at least 2 bar times, got shape {list(t.shape)}")
    if not bool((np.diff(t) > 0).all()):
        raise ValueError("bar times must be strictly increasing")
    units = bar_units(t, spec.unit)
    first, last = int(units[0]), int(units[-1])
    span = spec.train + spec.val + spec.test
    folds = []
    k = 0
    while first + k * spec.step + span - 1 <= last:
        s = first + k * spec.step
        edges = np.searchsorted(units, [s, s + spec.train, s + spec.train + spec.val, s + span])
        train, val, test = (Window(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True))
        folds.append(_checked(Fold(k, train, val, test), spec))
        k += 1
    if not folds:
        have = last - first + 1
        raise ValueError(f"no complete fold: {spec.describe()} needs {span} {spec.unit} of data, the bars span {have}")
    return folds


def _checked(fold: Fold, spec: WalkSpec) -> Fold:
    for name in ("train", "val", "test"):
        if getattr(fold, name).bars == 0:
            raise ValueError(f"fold {fold.index}: its {name} window ({getattr(spec, name)} {spec.unit}) holds no bars")
    if fold.train.bars < MIN_BARS:
        raise ValueError(
            f"fold {fold.index}: its training window holds {fold.train.bars} bars, at least {MIN_BARS} needed "
            f"(a longer --train-{spec.unit})"
        )
    return fold  # then val.start >= MIN_BARS > HISTORY: the history before val and test is there


def spec_from(
    months: tuple[int | None, ...], days: tuple[int | None, ...], bars: tuple[int | None, ...]
) -> WalkSpec | None:
    """The :class:`WalkSpec` of (train, val, test, step) given in one unit, or None when none is given.

    Raises:
        ValueError: windows given in two units, or train, val or test missing.
    """
    given = [
        (unit, v) for unit, v in (("months", months), ("days", days), ("bars", bars)) if any(x is not None for x in v)
    ]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"walk-forward windows in one unit only: got {' and '.join(u for u, _ in given)}")
    unit, (train, val, test, step) = given[0]
    missing = [n for n, v in (("train", train), ("val", val), ("test", test)) if v is None]
    if missing:
        raise ValueError(f"walk-forward in {unit} needs the train, val and test windows: {', '.join(missing)} missing")
    return WalkSpec(unit, train, val, test, test if step is None else step)


__all__ = ["HISTORY", "UNITS", "Fold", "WalkSpec", "Window", "bar_units", "spec_from", "walk_forward_folds"]
