"""A run's ``precision`` reaches PyTorch's cuBLAS switch while it trains, and is put back after."""

from __future__ import annotations

import pytest
import torch

from gper.dqn import Config
from gper.dqn.algorithm import DQN
from gper.training import trainer
from gper.training.precision import matmul_precision


@pytest.fixture
def tf32_off():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_switch_follows_the_precision_and_is_restored(tf32_off):
    with matmul_precision("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
        with matmul_precision("fp32"):
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32
    assert not torch.backends.cuda.matmul.allow_tf32
    with matmul_precision(None):
        assert not torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError), matmul_precision("tf32"):
        raise RuntimeError("a failed run")
    assert not torch.backends.cuda.matmul.allow_tf32


def test_a_run_trains_at_its_precision(tf32_off, monkeypatch):
    seen = []
    monkeypatch.setattr(trainer, "_train_process", lambda *a: seen.append(torch.backends.cuda.matmul.allow_tf32))
    trainer.train(DQN, Config(env="cartpole", precision="tf32", save=False), log=lambda *a: None)
    trainer.train(DQN, Config(env="cartpole", precision="bf16", save=False), log=lambda *a: None)
    assert seen == [True, False] and not torch.backends.cuda.matmul.allow_tf32
