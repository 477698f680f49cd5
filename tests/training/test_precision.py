"""A run's ``precision`` reaches PyTorch's cuBLAS and cuDNN switches while it trains, and is put back after."""

from __future__ import annotations

import pytest
import torch

from gper.dqn import Config
from gper.dqn.algorithm import DQN
from gper.training import trainer
from gper.training.precision import matmul_precision


@pytest.fixture
def tf32_off():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _switches() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_the_switches_follow_the_precision_and_are_restored(tf32_off):
    with matmul_precision("tf32"):
        assert _switches() == (True, True)
        with matmul_precision("fp32"):  # full FP32 convolutions too, where PyTorch's default is TF32
            assert _switches() == (False, False)
        assert _switches() == (True, True)
    assert _switches() == (False, False)
    with matmul_precision(None):
        assert _switches() == (False, False)
    with pytest.raises(RuntimeError), matmul_precision("tf32"):
        raise RuntimeError("a failed run")
    assert _switches() == (False, False)


def test_a_run_trains_at_its_precision(tf32_off, monkeypatch):
    seen = []
    monkeypatch.setattr(trainer, "_train_process", lambda *a: seen.append(_switches()))
    trainer.train(DQN, Config(env="cartpole", precision="tf32", save=False), log=lambda *a: None)
    trainer.train(DQN, Config(env="cartpole", precision="bf16", save=False), log=lambda *a: None)
    assert seen == [(True, True), (False, False)] and _switches() == (False, False)
