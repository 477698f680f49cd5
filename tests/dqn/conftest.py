"""Settings of the short trainings the dqn tests run."""

from __future__ import annotations

import pytest


@pytest.fixture
def smoke() -> dict:
    """A short cartpole run on the CPU: a few hundred steps, every part of the loop exercised."""
    return dict(
        env="cartpole",
        device="cpu",
        total_steps=600,
        learning_starts=200,
        batch_size=32,
        buffer_size=1000,
        epoch_steps=200,
        hidden=(16,),
        progress=False,
    )
