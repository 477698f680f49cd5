"""Fixtures shared by the walk-forward tests."""

from __future__ import annotations

import pytest
import torch

from gper.envs.folds import WalkSpec, walk_forward_folds
from gper.envs.market_data import synthetic_bars


@pytest.fixture(scope="module")
def fold_setup():
    """500 synthetic bars and the second fold of a 200/60/60 walk over them (one thread: CPU runs
    of a fold are deterministic and leave the other core to a parallel test)."""
    torch.set_num_threads(1)
    bars = synthetic_bars(500, 4)
    fold = walk_forward_folds(bars.time_ns.numpy(), WalkSpec("bars", 200, 60, 60, 60))[1]
    return bars, fold
