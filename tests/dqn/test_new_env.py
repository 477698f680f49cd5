"""The environment seam: an environment defined here and registered once (``gper.envs.register``)
is known to ``make_env``, trains through :func:`gper.dqn.train` on its presets, and shows in
``gper train --help`` with its help line and presets."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from gper.cli import main
from gper.dqn import PRESETS, Config, train
from gper.envs import ENV_NAMES, EnvSpec, Step, UnknownEnvironment, VecEnv, make_env, register, unregister


class Coin(VecEnv):
    """Name the side of a coin the observation shows (reward 1 when the action matches it); each
    step tosses the coin again, and an episode lasts ``tosses`` steps."""

    name = "coin"
    obs_dim = 2
    n_actions = 2

    def __init__(self, tosses: int, num_envs: int, device: torch.device, seed: int = 0, shown: float = 1.0) -> None:
        self.name, self.tosses, self.num_envs, self.device = f"coin:{tosses}", tosses, num_envs, device
        self.shown = shown  # what the observation's hot entry holds: a setting of the run reaches the factory
        self.generator = torch.Generator(device).manual_seed(seed)
        self.side = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=device)

    def _toss(self) -> torch.Tensor:
        self.side = torch.randint(2, (self.num_envs,), generator=self.generator, device=self.device)
        return torch.nn.functional.one_hot(self.side, 2).float() * self.shown

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self.steps.zero_()
        return self._toss()

    def step(self, actions: torch.Tensor) -> Step:
        reward = (actions == self.side).float()
        self.steps += 1
        truncated = self.steps >= self.tosses
        self.steps.masked_fill_(truncated, 0)
        obs = self._toss()  # the next toss is the next episode's first observation too
        return Step(obs, reward, torch.zeros_like(truncated), truncated, obs)


MADE: list[Coin] = []  # every coin make_coin made


def make_coin(tosses: str, num_envs: int, device: torch.device, seed: int = 0, **kwargs) -> Coin:
    if not tosses.isdigit() or int(tosses) < 1:
        raise UnknownEnvironment(f"coin:{tosses}")
    MADE.append(Coin(int(tosses), num_envs, device, seed=seed, **kwargs))
    return MADE[-1]


COIN = EnvSpec(
    "coin:<K>",
    make_coin,
    help="name the side of a coin, K tosses an episode",
    graph_safe_rng=False,
    settings=lambda run, split: {"shown": run.cost_bps},
    presets={
        "cuda": dict(
            total_steps=4_000,
            num_envs=4,
            hidden=(8,),
            buffer_size=2_000,
            batch_size=64,
            learning_rate=1e-3,
            max_grad_norm=10.0,
            tau=1.0,
            target_every=50,
            eps_end=0.05,
            exploration_fraction=0.5,
            learning_starts=100,
            epoch_steps=200,
            solve_return=3.0,
            weight_norm="global",
        ),
        "cpu": dict(total_steps=400, batch_size=16),
    },
)


@pytest.fixture
def coin():
    register(COIN)
    yield COIN
    unregister(COIN.name)


def test_a_registered_environment_is_made_by_name(coin):
    from gper import envs

    env = make_env("coin:3", 2, "cpu", seed=1)
    assert isinstance(env, Coin) and env.tosses == 3 and env.num_envs == 2
    assert envs.ENV_NAMES == (*ENV_NAMES, "coin:<K>") and PRESETS["coin"] is coin.presets
    with pytest.raises(ValueError, match=r"unknown environment .coin:x.: expected one of .*atari:<Game>, coin:<K>"):
        make_env("coin:x", 1, "cpu")
    with pytest.raises(ValueError, match="coin:3 resets in the same step only: next-step autoreset is for gym:<ID>"):
        make_env("coin:3", 1, "cpu", autoreset="next-step")


def test_a_registered_environment_trains_on_its_presets(coin, tmp_path):
    MADE.clear()
    results = train(Config(env="coin:4", device="cpu", cost_bps=2.0, run_dir=str(tmp_path), progress=False))
    # the training env and the evaluation's both get the run's settings; the training one the preset's num_envs
    assert len(MADE) == 2 and all(env.shown == 2.0 for env in MADE) and MADE[0].num_envs == 4
    assert results.env_steps == 400 and results.train_steps > 0 and results.episodes == 400 // 4
    assert results.mean_return_last100 > 0


def test_published_scores_reach_the_runs_plot(tmp_path, monkeypatch):
    from gper.training import trainer

    drawn = []

    def plot_run(*args, **kwargs):  # the real plot, its arguments kept
        drawn.append(args)
        return real(*args, **kwargs)

    real = trainer.plot_run
    monkeypatch.setattr(trainer, "plot_run", plot_run)
    spec = register(dataclasses.replace(COIN, published=lambda name: [(f"a paper's {name}", 2.0, 3.0)]))
    try:
        train(Config(env="coin:4", device="cpu", cost_bps=2.0, run_dir=str(tmp_path), progress=False))
    finally:
        unregister(spec.name)
    assert drawn and drawn[-1][4] == (("a paper's coin:4", 2.0, 3.0),)
    assert any(tmp_path.rglob("plot.png"))


def test_gone_after_unregister(coin):
    unregister(coin.name)
    with pytest.raises(ValueError, match="unknown environment 'coin:2'"):
        make_env("coin:2", 1, "cpu")
    assert "coin" not in PRESETS
    register(coin)  # for the fixture's unregister


def test_help_shows_its_line_and_presets(coin, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--env", "coin:4", "--device", "cpu", "--help"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    env = re.split(r" --(?!env )", out.split(" --env ")[1])[0]
    assert "84x84 frames stacked by 4), or coin:<K> (name the side" in env
    assert "(default for --env coin:4 on the CPU: 400)" in out and "(default for --env coin:4 on the CPU: 16)" in out
    assert "coin:<K> 4000 / 400" in out and "coin:<K> 3.0" in out  # the presets table: CUDA / CPU
