"""``make_env``: dispatch by name and its argument errors."""

from __future__ import annotations

import pytest
import torch

from gper.envs import make_env
from gper.envs.cartpole import CartPole
from gper.envs.market import MarketEnv


def test_dispatch():
    env = make_env("cartpole", 2, "cpu", seed=1)
    assert isinstance(env, CartPole) and env.num_envs == 2 and env.device == torch.device("cpu")
    market = make_env(
        "market", 3, torch.device("cpu"), seed=1, n_bars=2000, test_bars=400, split="test", episode_len=16
    )
    assert isinstance(market, MarketEnv) and market.episode_len == 16 and len(market.prices) == 400


@pytest.mark.parametrize("name", ["pong", "gym:", "Cartpole", ""])
def test_unknown_name(name):
    with pytest.raises(ValueError, match="unknown environment.*cartpole, market, bitflip:<N>, gym:<ID>"):
        make_env(name, 1, "cpu")


@pytest.mark.parametrize("num_envs", [0, -1, 1.5, True, "4"])
def test_bad_num_envs(num_envs):
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        make_env("cartpole", num_envs, "cpu")
