"""The learn step's priority update: written from the TD errors where the sampling reads
priorities, skipped under uniform sampling (it reads none), for the single agent and a population;
beta is annealed either way."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gper.dqn import Agent, Config
from gper.dqn.build import build_replay
from gper.dqn.config import resolve
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.sweep import agent_configs
from gper.training.environment import build_env

CPU = torch.device("cpu")
BASE = Config(
    env="cartpole", seed=5, device="cpu", total_steps=400, learning_starts=30, batch_size=8, buffer_size=128,
    hidden=(16, 16), num_envs=3, save=False,
)  # fmt: skip


def _single(cfg: Config) -> Agent:
    torch.manual_seed(cfg.seed)
    env = build_env(cfg, CPU)
    return Agent(cfg, env, build_replay(cfg, env.obs_dim, CPU), 100)


def _population(cfg: Config) -> PopulationAgent:
    return PopulationAgent(agent_configs(cfg, 2), CPU, 100)


def _trees(agent) -> list[torch.Tensor]:
    """Every priority the replay keeps (its sum and min trees), as copies."""
    state = agent.rb.state_dict()
    return [state["tree"].clone(), state["mintree"].clone()]


@pytest.mark.parametrize("build", [_single, _population], ids=["single", "population"])
@pytest.mark.parametrize("sampling", ["uniform", "proportional", "stratified"])
def test_priorities_are_updated_unless_sampling_is_uniform(build, sampling):
    cfg = resolve(dataclasses.replace(BASE, sampling=sampling), CPU)
    agent = build(cfg)
    for _ in range(12):
        agent.collect_step(None)
    before, beta = _trees(agent), agent.beta_t.clone()
    for step in range(1, 4):
        agent.learn_step(step, None)
    after = _trees(agent)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert unchanged == (sampling == "uniform")
    assert bool((agent.beta_t > beta).all())  # annealed all the same


def test_the_replays_own_sampling_decides():
    """An agent whose settings say uniform but whose replay samples proportionally updates its
    priorities: the replay's mode is what reads them."""
    cfg = resolve(dataclasses.replace(BASE, sampling="uniform"), CPU)
    torch.manual_seed(cfg.seed)
    env = build_env(cfg, CPU)
    agent = Agent(cfg, env, build_replay(dataclasses.replace(cfg, sampling="proportional"), env.obs_dim, CPU), 100)
    for _ in range(12):
        agent.collect_step(None)
    before = _trees(agent)
    agent.learn_step(1, None)
    assert not all(torch.equal(a, b) for a, b in zip(before, _trees(agent), strict=True))
