"""Config: presets, validation, the device pick and the step plan."""

from __future__ import annotations

import pytest
import torch

from gper.dqn import PRESETS, Config, pick_device, plan_steps, resolve, trains_at

CPU = torch.device("cpu")


def test_presets_fill_every_optional_field():
    for env in ("cartpole", "market", "gym:CartPole-v1"):
        for device in ("cuda", "cpu"):
            cfg = resolve(Config(env=env), torch.device(device))
            assert all(getattr(cfg, f) is not None for f in ("total_steps", "num_envs", "hidden", "batch_size"))
    assert resolve(Config(env="market"), CPU).batch_size < PRESETS["market"]["cuda"]["batch_size"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(env="atari"), "unknown environment"),
        (dict(batch_size=0), "batch_size must be an integer >= 1"),
        (dict(gamma=1.5), r"gamma must be in \[0, 1\]"),
        (dict(tau=0.0), "tau must be > 0"),
        (dict(learning_starts=10, batch_size=32), "learning_starts"),
        (dict(hidden=()), "hidden"),
        (dict(exploration_fraction=0.0), "exploration_fraction"),
        (dict(time_every=-1), "time_every"),
        (dict(checkpoint_every=-1), "checkpoint_every must be an integer >= 0"),
        (dict(keep_checkpoints=0), "keep_checkpoints must be an integer >= 1"),
    ],
)
def test_bad_config_is_refused(smoke, change, message):
    with pytest.raises(ValueError, match=message):
        resolve(Config(**{**smoke, **change}), CPU)


def test_plan_counts_training_steps(smoke):
    cfg = resolve(Config(**{**smoke, "num_envs": 4, "train_every": 2}), CPU)
    iterations, trains = plan_steps(cfg)
    assert iterations == 150 and trains == len(range(50, 150, 2))
    assert [it for it in range(54) if trains_at(cfg, it)] == [50, 52]


def test_device_pick():
    assert pick_device("cpu") == CPU
    gpu = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    assert pick_device("auto") == (gpu or CPU)
    if torch.cuda.is_available():
        assert pick_device("cuda").index == torch.cuda.current_device()
    else:
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            pick_device("cuda")
