"""Config: presets, validation, the device pick and the step plan."""

from __future__ import annotations

import pytest
import torch

from gper.dqn import PRESETS, Config, pick_device, plan_steps, resolve, setup, trains_at

CPU = torch.device("cpu")


def test_presets_fill_every_optional_field():
    for env in ("cartpole", "market", "gym:CartPole-v1"):
        for device in ("cuda", "cpu"):
            cfg = resolve(Config(env=env), torch.device(device))
            assert all(getattr(cfg, f) is not None for f in ("total_steps", "num_envs", "hidden", "batch_size"))
    assert resolve(Config(env="market"), CPU).batch_size < PRESETS["market"]["cuda"]["batch_size"]


def test_the_market_cost_defaults_to_2_bp_on_real_bars_and_1_on_synthetic_prices():
    from gper.envs.market import REAL_COST_BPS, SYNTHETIC_COST_BPS, MarketEnv

    assert (REAL_COST_BPS, SYNTHETIC_COST_BPS) == (2.0, 1.0)
    assert resolve(Config(env="market"), CPU).cost_bps == 1.0
    assert resolve(Config(env="market", data="bars.csv"), CPU).cost_bps == 2.0
    assert resolve(Config(env="market", data="bars.csv", cost_bps=0.5), CPU).cost_bps == 0.5
    assert Config().cost_bps is None  # a resume compares what was asked: None stays None there
    synthetic = MarketEnv.from_source(1, CPU, n_bars=300, test_bars=200, split="test")
    assert synthetic.cost_bps == 1.0


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
        (dict(loss="l1"), "loss must be one of"),
    ],
)
def test_bad_config_is_refused(smoke, change, message):
    with pytest.raises(ValueError, match=message):
        resolve(Config(**{**smoke, **change}), CPU)


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("learning_rate", INF, "learning_rate must be a finite number > 0, got inf"),
        ("learning_rate", NAN, "learning_rate must be a finite number > 0, got nan"),
        ("learning_rate", 0.0, "learning_rate must be a finite number > 0, got 0.0"),
        ("learning_rate", -1e-4, "learning_rate must be a finite number > 0"),
        ("adam_eps", 0.0, "adam_eps must be a finite number > 0, got 0.0"),
        ("adam_eps", -1e-8, "adam_eps must be a finite number > 0"),
        ("adam_eps", NAN, "adam_eps must be a finite number > 0, got nan"),
        ("adam_eps", INF, "adam_eps must be a finite number > 0, got inf"),
        ("adam_eps", True, "adam_eps must be a finite number > 0, got True"),
        ("max_grad_norm", NAN, r"max_grad_norm must be a finite number >= 0 \(0: no clipping\), got nan"),
        ("max_grad_norm", INF, "max_grad_norm must be a finite number >= 0 .*, got inf"),
        ("max_grad_norm", -1.0, "max_grad_norm must be a finite number >= 0"),
        ("gamma", NAN, r"gamma must be in \[0, 1\], got nan"),
        ("gamma", -0.1, r"gamma must be in \[0, 1\]"),
        ("tau", NAN, r"tau must be in \[0, 1\], got nan"),
        ("tau", INF, r"tau must be in \[0, 1\], got inf"),
        ("eps_start", NAN, r"eps_start must be in \[0, 1\]"),
        ("eps_start", 1.5, r"eps_start must be in \[0, 1\]"),
        ("eps_end", INF, r"eps_end must be in \[0, 1\]"),
        ("eps_end", -0.01, r"eps_end must be in \[0, 1\]"),
        ("alpha", NAN, r"alpha must be in \[0, 1\], got nan"),
        ("alpha", 1.5, r"alpha must be in \[0, 1\]"),
        ("beta", -INF, r"beta must be in \[0, 1\], got -inf"),
        ("beta", 2.0, r"beta must be in \[0, 1\]"),
        ("exploration_fraction", NAN, r"exploration_fraction must be in \(0, 1\], got nan"),
        ("exploration_fraction", INF, r"exploration_fraction must be in \(0, 1\]"),
        ("cost_bps", INF, "cost_bps must be a finite number >= 0, got inf"),
        ("cost_bps", NAN, "cost_bps must be a finite number >= 0, got nan"),
        ("cost_bps", -1.0, "cost_bps must be a finite number >= 0"),
        ("solve_return", INF, "solve_return must be a finite number, got inf"),
        ("solve_return", NAN, "solve_return must be a finite number, got nan"),
        ("episode_len", 0, "episode_len must be an integer >= 1, got 0"),
        ("episode_len", 2.5, "episode_len must be an integer >= 1, got 2.5"),
        ("total_steps", INF, "total_steps must be an integer >= 1, got inf"),
        ("learning_starts", NAN, "learning_starts must be an integer, got nan"),
        ("learning_starts", INF, "learning_starts must be an integer, got inf"),
        ("time_every", NAN, "time_every must be an integer, got nan"),
        ("bars", NAN, "bars must be an integer, got nan"),
        ("test_bars", 2.5, "test_bars must be an integer, got 2.5"),
        ("seed", NAN, "seed must be an integer, got nan"),
        ("seed", -1, "seed must be >= 0, got -1"),
    ],
)
def test_non_finite_or_out_of_range_number_is_refused(smoke, name, value, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        resolve(Config(**{**smoke, name: value}), CPU)


def test_numbers_at_the_edges_of_their_ranges_are_accepted(smoke):
    edges = dict(gamma=1.0, tau=1.0, eps_start=0.0, eps_end=1.0, alpha=0.0, beta=1.0, exploration_fraction=1.0)
    edges.update(max_grad_norm=0.0, learning_rate=1e-12, cost_bps=0.0, solve_return=-1e9, episode_len=1)
    cfg = resolve(Config(**{**smoke, **edges}), CPU)
    assert {name: getattr(cfg, name) for name in edges} == edges


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


@pytest.mark.parametrize("population", [1, 2])
def test_adam_eps_is_the_epsilon_of_each_learners_adam(smoke, population):
    """``adam_eps`` reaches the single agent's ``torch.optim.Adam`` (whose param group the fused
    step reads) and a population's :class:`~gper.dqn.population_adam.PopulationAdam`; without it,
    torch's 1e-8."""

    def eps(**change):
        cfg, agent, _ = setup(Config(**smoke | {"population": population} | change), log=lambda *a: None)
        used = agent.adam.eps if population > 1 else agent.optimizer.param_groups[0]["eps"]
        return cfg.adam_eps, used

    assert eps() == (1e-8, 1e-8)
    assert eps(adam_eps=1e-5) == (1e-5, 1e-5)
