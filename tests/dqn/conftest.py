"""Settings of the short trainings the dqn tests run."""

from __future__ import annotations

import pytest
import torch


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


@pytest.fixture
def one_thread():
    """torch on one CPU thread for the test: the tiny networks of these runs gain nothing from more,
    and lose much when the cores are shared with other work (threads wait for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
