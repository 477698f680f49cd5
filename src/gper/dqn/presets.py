"""The per-environment defaults that :class:`gper.dqn.Config`'s ``None`` fields stand for, per
device type (:func:`gper.dqn.config.resolve` fills them in; ``gper train --help`` lists them)."""

from __future__ import annotations

from typing import Any

# per environment, then per device type: the defaults that None stands for
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole": {
        "cuda": dict(
            total_steps=300_000,  # long enough to reach 475 (docs/training.md, "Results on the H200")
            num_envs=4,
            hidden=(256, 256),
            buffer_size=100_000,
            batch_size=256,
            learning_rate=5e-4,
            max_grad_norm=10.0,
            tau=1.0,
            target_every=200,
            eps_end=0.01,
            exploration_fraction=0.1,
            learning_starts=5_000,
            epoch_steps=10_000,
            solve_return=475.0,
            weight_norm="global",
        ),
        # cartpole is small: the same on the CPU, but shorter (enough there too: docs/training.md)
        "cpu": dict(total_steps=200_000),
    },
    "market": {
        "cuda": dict(
            total_steps=2_000_000,
            num_envs=256,
            hidden=(512, 512),
            buffer_size=2**21,
            batch_size=4096,
            learning_rate=1e-4,
            max_grad_norm=0.0,
            tau=0.005,
            target_every=1,
            eps_end=0.05,
            exploration_fraction=0.3,
            learning_starts=50_000,
            epoch_steps=100_000,
            solve_return=None,
            bars=400_000,
            test_bars=50_000,
            weight_norm="global",
        ),
        "cpu": dict(
            total_steps=300_000,
            num_envs=16,
            hidden=(128, 128),
            buffer_size=2**17,
            batch_size=256,
            learning_starts=10_000,
            epoch_steps=20_000,
            bars=100_000,
            test_bars=20_000,
        ),
    },
    # market walk-forward (gper.walkforward): a fold trains on a window of a few hundred to a few
    # thousand bars, so the network is small and training is counted in passes over the window
    # (steps_per_bar), with validation picking the checkpoint; chosen on validation windows only
    # (benchmarks/market_walk.py, docs/training.md "Walk-forward")
    "market-walk": {
        "cuda": dict(
            # the best of 4 candidates (steps_per_bar 30 / 100 x hidden 64-64 / 256-256) on the
            # validation windows of arch:sp500 and arch:nasdaq, seed 1 (market-walk-select-cpu-20261201-215141);
            # those windows (2002-2017) are also the test windows of earlier folds, so only test years
            # after the validation years used are free of the choice: docs/training.md, walk-forward results
            steps_per_bar=100,
            num_envs=64,
            hidden=(256, 256),
            buffer_size=2**17,
            batch_size=256,
            learning_rate=1e-4,
            max_grad_norm=10.0,
            tau=0.005,
            target_every=1,
            eps_end=0.05,
            exploration_fraction=0.3,
            learning_starts=5_000,
            solve_return=None,
            weight_norm="global",
        ),
        "cpu": {},  # small already: the same on the CPU
    },
    # the bit-flipping task: episodes of N steps, one update per collection step of 16 episodes
    "bitflip": {
        "cuda": dict(
            total_steps=1_000_000,
            num_envs=16,
            hidden=(256,),
            buffer_size=2**20,
            batch_size=1024,
            learning_rate=1e-3,
            max_grad_norm=0.0,
            tau=0.05,
            target_every=1,
            eps_end=0.2,
            exploration_fraction=0.05,
            learning_starts=4096,
            epoch_steps=50_000,
            solve_return=None,
            weight_norm="batch",
        ),
        "cpu": dict(total_steps=300_000, batch_size=256),
    },
    "gym": {
        "cuda": dict(
            total_steps=500_000,
            num_envs=4,
            hidden=(256, 256),
            buffer_size=200_000,
            batch_size=128,
            learning_rate=2.5e-4,
            max_grad_norm=10.0,
            tau=1.0,
            target_every=500,
            eps_end=0.05,
            exploration_fraction=0.2,
            learning_starts=10_000,
            epoch_steps=10_000,
            solve_return=None,
            weight_norm="global",
        ),
        "cpu": {},
    },
}
