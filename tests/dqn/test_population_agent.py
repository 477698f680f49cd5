"""A population of N DQN agents against N single runs: agent ``i`` trains exactly as the single
run seeded ``seed + i`` on the CPU (observations, replay, parameters, target, Adam, sums)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gper.dqn import Config
from gper.dqn.build import setup
from gper.dqn.config import resolve
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.sweep import Sweep, agent_configs, parse_sweeps
from gper.training.epochs import collect_iterations, train_steps_before

N, ITERS = 3, 150
BASE = Config(
    env="cartpole", seed=4, device="cpu", total_steps=2000, learning_starts=100, batch_size=16, buffer_size=300,
    hidden=(16, 16), num_envs=4, target_every=10, save=False,
)  # fmt: skip


def _train(agent, cfg) -> None:
    """The core's schedule without its host loop: every collect step, then a learn step once past
    learning_starts (train_every 1)."""
    step = 0
    for it in range(ITERS):
        agent.collect_step(None)
        if (it + 1) * cfg.num_envs > cfg.learning_starts:
            step += 1
            agent.learn_step(step, None)


def _population(config: Config, sweeps=(), n: int = N) -> tuple[PopulationAgent, Config]:
    cfg = resolve(config, torch.device("cpu"))
    total = train_steps_before(cfg, collect_iterations(cfg))
    return PopulationAgent(agent_configs(cfg, n, sweeps), torch.device("cpu"), total), cfg


@pytest.mark.parametrize(
    "changes",
    [{}, {"fused_step": False}, {"tau": 0.05}, {"max_grad_norm": 0.0, "sampling": "stratified"}],
    ids=["fused", "unfused", "soft-target", "no-clip-stratified"],
)
def test_agent_i_trains_as_the_single_run_seeded_seed_plus_i(changes):
    config = dataclasses.replace(BASE, **changes)
    _check_against_single_runs(
        *_population(config), [dataclasses.replace(config, seed=config.seed + i) for i in range(N)]
    )


def test_a_sweep_trains_each_grid_point_as_its_single_run():
    sweeps = parse_sweeps(["learning_rate=1e-3,3e-4", "gamma=0.99,0.9", "eps_end=0.05,0.2"])
    config = dataclasses.replace(BASE, tau=0.1)
    pop, cfg = _population(config, sweeps + [Sweep("tau", (0.1, 0.3))], n=1)
    assert pop.agents == 16 and [c.seed for c in pop.cfgs] == list(range(BASE.seed, BASE.seed + 16))
    singles = [
        dataclasses.replace(config, **{k: getattr(c, k) for k in ("seed", "learning_rate", "gamma", "eps_end", "tau")})
        for c in pop.cfgs[::5]
    ]
    pop, cfg = _population(config, sweeps + [Sweep("tau", (0.1, 0.3))], n=1)
    _check_against_single_runs(pop, cfg, singles, agents=range(0, 16, 5))


def _check_against_single_runs(pop, cfg, configs, agents=None) -> None:
    singles = []
    for config in configs:  # each single run alone, as `gper train --seed <seed + i> ...` runs it
        cfg_i, agent, _ = setup(config, log=lambda *a: None)
        _train(agent, cfg_i)
        singles.append(agent)
    _train(pop, cfg)
    for i, single in zip(agents or range(len(configs)), singles, strict=True):
        assert torch.equal(pop.obs[i], single.obs)
        for mine, theirs in zip(pop.qnet.agent(i).parameters(), single.qnet.parameters(), strict=True):
            assert torch.equal(mine, theirs)
        for mine, theirs in zip(pop.target.agent(i).parameters(), single.target.parameters(), strict=True):
            assert torch.equal(mine, theirs)
        assert torch.equal(pop.sums[i], single.sums)
        assert torch.equal(pop.counters, single.counters)
        mine, theirs = pop.rb.members[i].state_dict(), single.rb.state_dict()
        for name in ("rows", "tree", "gen", "counters"):
            assert torch.equal(mine[name], theirs[name]), name


def test_a_population_resumes_from_its_state_as_if_never_stopped():
    whole, cfg = _population(BASE)
    _train(whole, cfg)
    half, _ = _population(BASE)
    for _ in range(ITERS // 2):
        half.collect_step(None)
    resumed, _ = _population(dataclasses.replace(BASE, seed=99))  # another start: the state replaces it
    with pytest.raises(ValueError, match="population of 3 agents, not 2"):
        _population(BASE, n=2)[0].load_state_dict(half.state_dict())
    import copy

    resumed.load_state_dict(copy.deepcopy(half.state_dict()))
    for agent in (half, resumed):
        step = 0
        for it in range(ITERS // 2, ITERS):
            agent.collect_step(None)
            if (it + 1) * cfg.num_envs > cfg.learning_starts:
                step += 1
                agent.learn_step(step + (ITERS // 2 * cfg.num_envs - cfg.learning_starts) // cfg.num_envs, None)
    for mine, theirs in zip(half.qnet.parameters(), resumed.qnet.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(half.obs, resumed.obs)


def test_bad_populations_and_sweeps_are_refused():
    cfg = resolve(BASE, torch.device("cpu"))
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="population must be an int >= 1"):
            agent_configs(cfg, bad)
    with pytest.raises(ValueError, match="at least one agent"):
        PopulationAgent([], torch.device("cpu"), 10)
    with pytest.raises(ValueError, match=r"may differ in .* not in \['batch_size'\]"):
        PopulationAgent([cfg, dataclasses.replace(cfg, batch_size=8)], torch.device("cpu"), 10)
    with pytest.raises(ValueError, match=r"tau values must all be 1 .* or all below 1 .* got \[0.5, 1.0\]"):
        PopulationAgent([dataclasses.replace(cfg, tau=t) for t in (1.0, 0.5)], torch.device("cpu"), 10)
    soft = PopulationAgent([dataclasses.replace(cfg, tau=t) for t in (0.1, 0.5)], torch.device("cpu"), 10)
    # its own kernels follow the replay's back end (torch on the CPU), as the single agent's fused step
    assert soft.kernels == soft.rb.backend == "torch" and soft.qnet.kernels == soft.target.kernels == "torch"
    assert not soft.adam.fused
    for text, match in [
        ("learning_rate", "NAME=V1,V2"),
        ("hidden=1,2", "cannot be swept"),
        ("gamma=0.9,x", "must be numbers"),
        ("gamma=0.9,0.9", "given twice"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_sweeps([text])
    with pytest.raises(ValueError, match="swept more than once"):
        parse_sweeps(["gamma=0.9", "gamma=0.8"])


@pytest.mark.gpu
def test_on_cuda_the_population_trains_in_graphs_without_host_syncs():
    config = dataclasses.replace(BASE, device="cuda")
    cfg = resolve(config, torch.device("cuda"))
    pop = PopulationAgent(agent_configs(cfg, N), torch.device("cuda"), 1000)
    assert not pop.exact and len(pop.blocks) == 1
    _train(pop, cfg)  # past the graphs' warm-up and capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(5):
            pop.collect_step(None)
            pop.learn_step(1000 + step, None)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert pop.collect.use_graphs and pop.learn.use_graphs
    assert torch.isfinite(pop.sums).all() and (pop.sums[:, 0] > 0).all()
    params = list(pop.qnet.parameters())
    assert not torch.equal(params[0][0], params[0][1])  # each agent its own network
    assert pop.greedy(torch.zeros(N * 5, 4, device="cuda")).shape == (N * 5,)
