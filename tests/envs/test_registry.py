"""The registry of environments: names and patterns, what a registration refuses, the presets table."""

from __future__ import annotations

import pytest

from gper.envs import ENV_NAMES, EnvSpec, lookup, register
from gper.envs.cartpole import CartPole
from gper.envs.registry import PRESETS, preset, published, specs


def test_built_in_names_and_presets_in_order():
    assert ENV_NAMES == ("cartpole", "market", "bitflip:<N>", "gym:<ID>", "atari:<Game>")
    assert list(PRESETS) == ["cartpole", "market", "market-walk", "bitflip", "gym", "atari"]
    assert [s.family for s in specs()] == ["cartpole", "market", "bitflip", "gym", "atari"]
    assert preset("cartpole", "cpu")["total_steps"] == 200_000 and preset("cartpole", "cuda")["total_steps"] == 300_000
    assert preset("atari", "cuda")["n_step"] == 3 and preset("atari", "cuda")["weight_norm"] == "batch"
    assert preset("atari", "cpu")["total_steps"] == 20_000
    assert preset("pong", "cpu") is None


@pytest.mark.parametrize(
    ("name", "family"),
    [("cartpole", "cartpole"), ("bitflip:8", "bitflip"), ("bitflip:", "bitflip"), ("gym:CartPole-v1", "gym")],
)
def test_lookup_by_name_or_pattern(name, family):
    assert lookup(name).family == family


@pytest.mark.parametrize("name", ["cartpole:3", "bitflip", "gym", "Cartpole", "pong", ""])
def test_lookup_of_no_registration(name):
    assert lookup(name) is None


@pytest.mark.parametrize(
    ("name", "mean", "spread"),
    [("atari:Pong", 20.25, 0.41), ("atari:pong", 20.25, 0.41), ("atari:BeamRider", 6673.24, 1434.37)],
)
def test_atari_games_carry_cleanrls_published_score_as_a_band(name, mean, spread):
    ((label, low, high),) = published(name)
    assert "CleanRL dqn_atari.py after 10M env steps" in label and f"{mean:g} ± {spread:g}" in label
    assert (low, high) == pytest.approx((mean - spread, mean + spread))


@pytest.mark.parametrize("name", ["atari:MsPacman", "cartpole", "market", "gym:CartPole-v1", "pong", ""])
def test_environments_without_a_published_score_have_none(name):
    assert published(name) == ()


def test_a_family_registers_once():
    with pytest.raises(ValueError, match="an environment 'cartpole' is registered already"):
        register(EnvSpec("cartpole", CartPole, presets={"cuda": {}, "cpu": {}}))


@pytest.mark.parametrize("name", ["Cart", "bitflip:N", "bitflip:<N>:<M>", "", "a b"])
def test_names_are_lowercase_or_a_pattern(name):
    with pytest.raises(ValueError, match="an environment's name is lowercase, or a pattern"):
        EnvSpec(name, CartPole, presets={"cuda": {}, "cpu": {}})


@pytest.mark.parametrize("modes", [(), ("next-step",), ("same-step", "never")])
def test_autoreset_modes_start_with_same_step(modes):
    with pytest.raises(ValueError, match="autoreset modes start with same-step"):
        EnvSpec("x", CartPole, presets={"cuda": {}, "cpu": {}}, autoreset=modes)
