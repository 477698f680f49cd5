"""The collect step with its actions chosen in one kernel (:mod:`gper.dqn.fused_act`), the cartpole
step in one (:mod:`gper.envs.cartpole_kernel`) and the episodes recorded in one
(:mod:`gper.training.episodes_kernel`): for a population and for the single agent, step by step
against the torch ops fed the same random numbers (what the replay stores, the next observations,
the counters, the episode records). Under the Triton interpreter on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gper.dqn import Agent, Config
from gper.dqn.build import build_replay
from gper.dqn.config import resolve
from gper.dqn.fused_act import epsilon_greedy_reference
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.sweep import agent_configs
from gper.envs.cartpole import CartPole
from gper.training.environment import build_env
from gper.training.episodes import EpisodeTracker
from helpers import TRITON_ON_CPU

pytestmark = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")

CPU = torch.device("cpu")
BASE = Config(
    env="cartpole", seed=3, device="cpu", total_steps=400, learning_starts=50, batch_size=8, buffer_size=512,
    hidden=(16, 24), num_envs=3, backend="triton", exploration_fraction=0.25, save=False,
)  # fmt: skip
STEPS = 40  # past the end of the exploration decay (0.25 * 400 env steps), with episodes ending


def _reference_step(rng, env_state, env_steps, q, counter, schedule, shape):
    """The collect step's transition as the torch ops make it from the same draws of torch's generator
    (state ``rng``): the coins and random actions first ([*shape, 2]), then the environment's reset states."""
    env = CartPole(env_state.shape[0], CPU, graph_safe_rng=True, backend="torch")
    env.set_state(env_state, env_steps)
    torch.set_rng_state(rng)
    draws = torch.rand(*shape, 2)
    actions = epsilon_greedy_reference(q, draws, counter, *schedule)
    return actions, env.step(actions.reshape(-1)), env


def _check_step(obs0, actions, step, env, learner, rows, first_slot, shape):
    n, e = shape
    d = 4
    # NumPy's sin and cos (the interpreter's) may round apart from PyTorch's in the last bit
    torch.testing.assert_close(learner_env(learner).state, env.state, rtol=1e-13, atol=1e-15)
    assert torch.equal(env.steps, learner_env(learner).steps)
    assert torch.equal(learner.obs.reshape(n, e, -1)[..., :d], step.obs.view(n, e, d))
    at = slice(first_slot, first_slot + e)
    assert torch.equal(rows["action"][:, at], actions.view(n, e))
    assert torch.equal(rows["obs"][:, at], obs0.view(n, e, -1))
    assert torch.equal(rows["next_obs"][:, at, :d], step.next_obs.view(n, e, d))
    assert torch.equal(rows["reward"][:, at], step.reward.view(n, e))
    assert torch.equal(rows["done"][:, at], step.terminated.view(n, e).float())


def learner_env(learner):
    return learner.blocks[0].env if isinstance(learner, PopulationAgent) else learner.env


def _run_against_reference(learner, shape, qvalues, schedule):
    n, e = shape
    tracker = EpisodeTracker(n * e, CPU, agents=n)  # the torch ops' record, fed what the reference steps give
    ends = 0
    for t in range(STEPS):
        env = learner_env(learner)
        env_state, env_steps, obs0 = env.state.clone(), env.steps.clone(), learner.obs.clone()
        counter = learner.counters[0].clone()
        rng = torch.get_rng_state()
        learner.collect_step(None)
        after = torch.get_rng_state()
        actions, step, ref_env = _reference_step(rng, env_state, env_steps, qvalues(obs0), counter, schedule, shape)
        assert torch.equal(torch.get_rng_state(), after)  # the same draws, no more
        rows = {k: v.view(n, -1, *v.shape[2:]) if n == 1 else v for k, v in _storage(learner).items()}
        _check_step(obs0, actions, step, ref_env, learner, rows, t * e, shape)
        assert float(learner.counters[0]) == float(counter) + e
        tracker.record(step.reward, step.terminated | step.truncated, learner.counters[0])
        assert torch.equal(tracker.returns, learner.episodes.returns)
        assert torch.equal(tracker.table[:-1, : learner.episodes.table.shape[1]], learner.episodes.table[:-1])
        ends += int((step.terminated | step.truncated).sum())
    assert ends > 0 and int(learner.episodes.count) == ends


def _storage(learner):
    s = learner.rb.storage
    return s if isinstance(learner, PopulationAgent) else {k: v.unsqueeze(0) for k, v in s.items()}


def test_a_populations_fused_collect_is_its_collect_step():
    cfg = resolve(BASE, CPU)
    n = 2
    pop = PopulationAgent(agent_configs(cfg, n), CPU, 100, exact=False, fused_collect=True)
    assert pop.fused_collect and pop.episodes.kernels == "triton" and pop.blocks[0].env.backend == "triton"
    a = pop._per_agent
    with torch.no_grad():
        _run_against_reference(
            pop, (n, cfg.num_envs), lambda obs: pop.qnet(obs, True), (a.eps_start, a.eps_span, a.decay)
        )


def test_the_single_agents_fused_collect_is_its_collect_step():
    cfg = resolve(dataclasses.replace(BASE, seed=9), CPU)
    torch.manual_seed(cfg.seed)
    env = build_env(cfg, CPU)
    agent = Agent(cfg, env, build_replay(cfg, env.obs_dim, CPU), 100, fused_collect=True)
    assert agent.fused_collect and agent.episodes.kernels == "triton"
    f64 = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    schedule = (f64(cfg.eps_start), f64(cfg.eps_end - cfg.eps_start), f64(cfg.exploration_fraction * cfg.total_steps))
    with torch.no_grad():
        _run_against_reference(agent, (1, cfg.num_envs), lambda obs: agent.qnet(obs).unsqueeze(0), schedule)


def test_where_the_fused_collect_applies():
    cfg = resolve(BASE, CPU)
    pop = PopulationAgent(agent_configs(cfg, 2), CPU, 100)  # exact on the CPU: the torch ops, each agent's stream
    assert not pop.fused_collect and pop.episodes.kernels == "torch"
    with pytest.raises(ValueError, match="fused_collect"):
        PopulationAgent(agent_configs(cfg, 2), CPU, 100, exact=True, fused_collect=True)
    deep = resolve(dataclasses.replace(BASE, hidden=(8, 8, 8)), CPU)
    with pytest.raises(ValueError, match="fused_collect"):
        PopulationAgent(agent_configs(deep, 2), CPU, 100, exact=False, fused_collect=True)
    torch.manual_seed(0)
    env = build_env(deep, CPU)
    with pytest.raises(ValueError, match="fused_collect"):
        Agent(deep, env, build_replay(deep, env.obs_dim, CPU), 100, fused_collect=True)
    env = build_env(cfg, CPU)
    assert not Agent(cfg, env, build_replay(cfg, env.obs_dim, CPU), 100).fused_collect  # on CUDA only, by default


@pytest.mark.parametrize(
    "changes", [{}, {"tau": 0.05, "max_grad_norm": 0.5, "double_q": False}, {"loss": "mse", "double_q": False}]
)
def test_the_single_agents_fused_learn_is_its_learn_step(changes):
    """Agent(fused_learn=True): the population's learn kernels for one agent, on the optimizer's own
    state, against the learn step's torch ops, from the same replay: TD errors, sums, parameters,
    target, Adam's moments and step counts, to rounding."""
    cfg = resolve(dataclasses.replace(BASE, sampling="uniform", learning_starts=30, **changes), CPU)
    agents = []
    for fused in (False, True):
        torch.manual_seed(cfg.seed)
        env = build_env(dataclasses.replace(cfg, backend="torch"), CPU)
        agents.append(Agent(cfg, env, build_replay(cfg, env.obs_dim, CPU), 100, fused_learn=fused))
    ops, fused = agents
    assert fused.fused_learn and not ops.fused_learn and list(fused.learn.phases) == [
        "per_sample", "upload", "learn", "per_update"
    ]  # fmt: skip
    for agent in agents:
        torch.manual_seed(1)  # the same exploration and resets for both
        for _ in range(12):
            agent.collect_step(None)
    assert torch.equal(ops.rb.storage["obs"], fused.rb.storage["obs"])
    for step in range(1, 6):
        for agent in agents:
            agent.learn_step(step, None)
        torch.testing.assert_close(fused.learn_state.td, ops.learn_state.td, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused.sums, ops.sums, rtol=1e-4, atol=1e-6)
        for a, b in ((fused.qnet, ops.qnet), (fused.target, ops.target)):
            for p, q in zip(a.parameters(), b.parameters(), strict=True):
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        states = [fused.optimizer.state_dict()["state"], ops.optimizer.state_dict()["state"]]
        for k in states[1]:
            assert float(states[0][k]["step"]) == float(states[1][k]["step"]) == step
            torch.testing.assert_close(states[0][k]["exp_avg"], states[1][k]["exp_avg"], rtol=1e-4, atol=1e-7)
    assert float(fused.counters[1]) == 5.0
    # a checkpoint's separate step counts are joined again: the kernel advances one for all
    fused.load_state_dict({k: v for k, v in ops.state_dict().items()})
    counts = [fused.optimizer.state[p]["step"] for p in fused.qnet.parameters()]
    assert all(c is counts[0] for c in counts) and float(counts[0]) == 5.0
    fused.learn_step(6, None)
    assert [float(fused.optimizer.state[p]["step"]) for p in fused.qnet.parameters()] == [6.0] * 6


@pytest.mark.parametrize("fused", [False, True])
def test_a_state_loaded_from_a_live_agent_is_the_loaders_own(fused):
    """load_state_dict(other.state_dict()) in one process: the optimizer's state is copied, not shared
    (torch keeps a loaded tensor of the right dtype and device as it is), so each agent's steps
    move its own moments and counts only."""
    cfg = resolve(dataclasses.replace(BASE, sampling="uniform", learning_starts=30), CPU)
    agents = []
    for _ in range(2):
        torch.manual_seed(cfg.seed)
        env = build_env(dataclasses.replace(cfg, backend="torch"), CPU)
        agents.append(Agent(cfg, env, build_replay(cfg, env.obs_dim, CPU), 100, fused_learn=fused))
    a, b = agents
    for _ in range(12):
        a.collect_step(None)
    a.learn_step(1, None)  # Adam's state exists
    held = {q: dict(b.optimizer.state[q]) for q in b.qnet.parameters() if b.optimizer.state.get(q)}
    b.load_state_dict(a.state_dict())
    for q, tensors in held.items():  # the fused learner made its state at once: loaded into, not replaced
        assert all(b.optimizer.state[q][key] is t for key, t in tensors.items())
    assert len(held) == (6 if fused else 0)
    for p, q in zip(a.qnet.parameters(), b.qnet.parameters(), strict=True):
        for key, value in a.optimizer.state[p].items():
            assert value is not b.optimizer.state[q][key] and torch.equal(value, b.optimizer.state[q][key]), key
    moments = [b.optimizer.state[q]["exp_avg"].clone() for q in b.qnet.parameters()]
    a.learn_step(2, None)
    for q, before in zip(b.qnet.parameters(), moments, strict=True):
        assert torch.equal(b.optimizer.state[q]["exp_avg"], before) and float(b.optimizer.state[q]["step"]) == 1.0
