"""The walk-forward section of the settings (:attr:`gper.dqn.Config.walk`): the windows of a
market walk-forward run and how each fold trains and picks its checkpoint (gper.walkforward).

``gper train`` shows these flat (``--train-months``, ``--steps-per-bar``, ...), and a
``config.json`` written before this section existed holds them flat: :func:`nest_walk` moves such
names into the section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass
class WalkForward:
    """Walk-forward settings: windows in calendar months, calendar days or bars (one unit), and what
    each fold does with them; every window ``None`` means a plain training run."""

    train_months: int | None = None
    """market walk-forward (with val_months and test_months): each fold trains on this many calendar
    months, keeps the checkpoint that scores best on the next val_months, scores it once on the
    test_months after those, and the next fold starts step_months later (docs/training.md,
    "Walk-forward"); the same in days (train_days ...) or bars (fold_train_bars ...)"""
    val_months: int | None = None
    """market walk-forward: calendar months of each fold's validation window (checkpoint choice)"""
    test_months: int | None = None
    """market walk-forward: calendar months of each fold's test window (scored once)"""
    step_months: int | None = None
    """market walk-forward: calendar months from one fold's start to the next's (default test_months;
    at least test_months, so that test windows never overlap)"""
    train_days: int | None = None
    """market walk-forward in calendar days: the training window"""
    val_days: int | None = None
    """market walk-forward in calendar days: the validation window"""
    test_days: int | None = None
    """market walk-forward in calendar days: the test window"""
    step_days: int | None = None
    """market walk-forward in calendar days: from one fold's start to the next's (default test_days)"""
    fold_train_bars: int | None = None
    """market walk-forward in bars (intraday data): the training window"""
    fold_val_bars: int | None = None
    """market walk-forward in bars: the validation window"""
    fold_test_bars: int | None = None
    """market walk-forward in bars: the test window"""
    fold_step_bars: int | None = None
    """market walk-forward in bars: from one fold's start to the next's (default fold_test_bars)"""
    select_metric: Literal["sharpe", "log_pnl"] = "sharpe"
    """market walk-forward: the validation score that picks a fold's checkpoint: Sharpe after costs
    or log P&L after costs"""
    flat_fallback: bool = True
    """market walk-forward: a fold whose best checkpoint does not beat flat on validation (a score
    of 0 or less) stays flat over its test window"""
    min_deflated_sharpe: float | None = None
    """market walk-forward: a fold also stays flat unless its chosen checkpoint's deflated Sharpe
    ratio (the probability that it beats the best of that many skill-free candidates, from every
    validation of the fold: gper.walkforward.selection) reaches this, e.g. 0.95; None: reported only"""
    trade_band: float = 0.0
    """market walk-forward: a no-trade band in units of the asset: the position traded in validation and
    test (an ensemble's mean) moves to the policy's only where the two differ by more than this, which
    skips the small trades of a changing volatility scale; 0: it follows the policy every bar"""
    steps_per_bar: int | None = None
    """market walk-forward: training env steps per bar of a fold's training window (total_steps, when
    not given, is this times the window's bars)"""
    validations: int = 10
    """market walk-forward: each fold's greedy policy is scored on its validation window every
    total_steps / validations env steps, and once more at the end of training when that falls
    after the last of them (the best one is kept)"""


#: the names of the walk-forward settings (flat on the command line and in older config.json files)
WALK_FIELDS = tuple(f.name for f in dataclasses.fields(WalkForward))

#: walk-forward settings that are not windows: only a walk-forward run reads them
WALK_ONLY = ("steps_per_bar", "validations", "select_metric", "flat_fallback", "min_deflated_sharpe", "trade_band")


def nest_walk(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (a :class:`~gper.dqn.Config`'s, as a dict) with every walk-forward name at its
    top level moved into its ``walk`` dict, which holds all of :class:`WalkForward`'s fields (the
    defaults where neither gives one): what a flat ``config.json`` of an earlier version reads as."""
    nested = {k: v for k, v in settings.items() if k not in WALK_FIELDS}
    given = dict(nested.get("walk") or {}) | {k: settings[k] for k in WALK_FIELDS if k in settings}
    names = set(WALK_FIELDS)
    nested["walk"] = dataclasses.asdict(WalkForward(**{k: v for k, v in given.items() if k in names}))
    return nested


__all__ = ["WALK_FIELDS", "WALK_ONLY", "WalkForward", "nest_walk"]
