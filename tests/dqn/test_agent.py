"""The agent: network, observation padding, the learning phases' state, the batch-source seam,
the learn-only constructor and the target update."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gper
from gper.dqn import (
    Agent,
    Config,
    FixedBatch,
    LearnState,
    QNetwork,
    padded_width,
    replay_spec,
    resolve,
    setup,
)
from gper.dqn.agent import SUM_ABS_TD, SUM_LOSS, SUM_Q

CPU = torch.device("cpu")
OBS, ACTIONS, BATCH = 4, 2, 32


def _transitions(n: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    return {
        "obs": torch.randn(n, OBS, device=device, generator=g),
        "next_obs": torch.randn(n, OBS, device=device, generator=g),
        "action": torch.randint(0, ACTIONS, (n,), device=device, generator=g),
        "reward": torch.randn(n, device=device, generator=g),
        "done": (torch.rand(n, device=device, generator=g) < 0.2).float(),
    }


def _learner(device: torch.device, batch_source=None, **change) -> Agent:
    """A learn-only agent on a replay of 256 random transitions (the cartpole preset's learning settings)."""
    settings = dict(env="cartpole", device=str(device), total_steps=10_000, num_envs=1, learning_starts=BATCH)
    settings |= dict(batch_size=BATCH, buffer_size=256, hidden=(16,), epoch_steps=100) | change
    cfg = resolve(Config(**settings), device)
    rb = gper.PrioritizedReplayBuffer(256, replay_spec(padded_width(OBS)), device=device, seed=0)
    rb.add(_transitions(256, device, seed=1))
    return Agent.for_learning(OBS, ACTIONS, cfg, rb, total_train_steps=100, batch_source=batch_source)


def _params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


# ---------------------------------------------------------------------------- network, padding


def test_network_shape():
    net = QNetwork(51, 45, (512, 512))
    assert net(torch.zeros(3, 51)).shape == (3, 45)
    assert sum(p.numel() for p in net.parameters()) == 51 * 512 + 512 + 512 * 512 + 512 + 512 * 45 + 45


def test_agent_pads_observations_to_16_bytes(smoke):
    assert [padded_width(d) for d in (1, 4, 5, 51, 52)] == [4, 4, 8, 52, 52]
    cfg, agent, _ = setup(Config(**(smoke | dict(env="market", bars=3000, test_bars=1000, num_envs=4))))
    assert agent.env.obs_dim == 51 and agent.obs_width == 52 and agent.qnet.net[0].in_features == 52
    assert agent.rb.spec["obs"] == ((52,), torch.float32)
    for _ in range(3):
        agent.collect.run()
    rows = agent.rb.storage["obs"][: len(agent.rb)]
    assert len(agent.rb) == 12 and torch.all(rows[:, 51] == 0) and torch.any(rows[:, :51] != 0)
    assert torch.all(agent.rb.storage["next_obs"][:12, 51] == 0)
    assert agent.greedy(torch.zeros(5, 51)).shape == (5,)


# ---------------------------------------------------------------------------- learn state, batch sources


def test_learn_state_holds_what_the_phases_pass():
    names = [f.name for f in dataclasses.fields(LearnState)]
    assert names == ["batch", "x", "next_x", "action", "reward", "done", "discount", "weights", "td", "grads"]
    agent = _learner(CPU)
    assert agent.from_replay and agent.batch_source == agent.sample_replay  # the default source
    slots = torch.arange(256)
    before = agent.rb.priorities(slots)
    agent.learn.run()
    s = agent.learn_state
    assert isinstance(s.batch, gper.SampledBatch) and s.batch.batch_size == BATCH
    assert torch.equal(s.x, s.batch["obs"]) and torch.equal(s.next_x, s.batch["next_obs"])
    assert s.action.dtype == torch.int64 and s.reward.shape == s.done.shape == s.weights.shape == (BATCH,)
    assert s.td.shape == (BATCH,) and not s.td.requires_grad
    assert len(s.grads) == len(list(agent.qnet.parameters())) and all(g is not None for g in s.grads)
    # per_update turned the TD errors into the drawn rows' priorities
    assert not torch.equal(agent.rb.priorities(s.batch.indices), before[s.batch.indices])


def test_fixed_batch_source_feeds_every_learn_step(device):
    """A batch source other than the replay: every step learns from it (eagerly the source is
    called once a step; captured, the graphs replay what it returned), beta anneals, and no
    priority changes, because the batch is not a draw from the replay."""
    batch = FixedBatch(_transitions(BATCH, device, seed=2))
    assert torch.equal(batch.weights, torch.ones(BATCH, device=device)) and set(batch) == set(replay_spec(OBS))
    calls = []

    def source():
        calls.append(1)
        return batch

    agent = _learner(device, batch_source=source)
    assert not agent.from_replay
    slots = torch.arange(256, device=device)
    priorities, stats = agent.rb.priorities(slots), agent.rb.stats()
    before = _params(agent.qnet)
    steps = agent.learn.warmup + 3
    for _ in range(steps):
        agent.learn.run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert agent.learn.captured == (device.type == "cuda")
    if device.type == "cpu":
        assert len(calls) == steps
    assert agent.learn_state.batch is batch and agent.learn_state.x is batch["obs"]
    assert torch.equal(agent.rb.priorities(slots), priorities) and agent.rb.stats() == stats
    assert agent.counters[1].item() == steps
    torch.testing.assert_close(agent.beta_t.cpu(), torch.tensor(0.4 + steps * 0.6 / 100))
    assert all(not torch.equal(a, p) for a, p in zip(before, agent.qnet.parameters(), strict=True))
    assert all(torch.isfinite(p).all() for p in agent.qnet.parameters())


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_a_learn_step_from_a_fixed_batch_is_the_dqn_update(loss):
    """One learn step against the same update written out (double-Q, Huber or squared error x IS
    weights, clipping, Adam)."""
    fields = _transitions(BATCH, CPU, seed=3)
    weights = torch.rand(BATCH, generator=torch.Generator().manual_seed(4)) + 0.5
    agent = _learner(CPU, batch_source=lambda: FixedBatch(fields, weights), loss=loss)
    cfg = agent.cfg
    qnet, target = copy.deepcopy(agent.qnet), copy.deepcopy(agent.target)
    optimizer = torch.optim.Adam(qnet.parameters(), lr=cfg.learning_rate)
    q = qnet(fields["obs"]).gather(1, fields["action"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_action = qnet(fields["next_obs"]).argmax(dim=1, keepdim=True)
        next_q = target(fields["next_obs"]).gather(1, next_action).squeeze(1)
        y = fields["reward"] + cfg.gamma * (1.0 - fields["done"]) * next_q
    each = F.huber_loss(q, y, reduction="none", delta=1.0) if loss == "huber" else (q - y) * (q - y)
    loss = (each * weights).mean()
    loss.backward()
    nn.utils.clip_grad_norm_(qnet.parameters(), cfg.max_grad_norm)
    optimizer.step()

    agent.learn.run()
    for got, want in zip(agent.qnet.parameters(), qnet.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(agent.learn_state.td, (q - y).detach())
    sums = agent.sums.float()
    torch.testing.assert_close(sums[SUM_LOSS], loss.detach())
    torch.testing.assert_close(sums[SUM_Q], q.detach().mean())
    torch.testing.assert_close(sums[SUM_ABS_TD], (q - y).detach().abs().mean())


def test_learn_only_agent_has_no_environment():
    agent = _learner(CPU)
    assert agent.env.num_envs == 1 and agent.obs_width == padded_width(OBS) and agent.device == CPU
    with pytest.raises(RuntimeError, match="only learns"):
        agent.collect.run()


# ---------------------------------------------------------------------------- target network


def test_update_target_copies_every_target_every_steps_when_tau_is_1():
    agent = _learner(CPU, tau=1.0, target_every=3)
    with torch.no_grad():
        for p in agent.qnet.parameters():
            p.add_(1.0)
    start = _params(agent.target)
    for step in (1, 2):
        agent.update_target(step)
        assert all(torch.equal(a, b) for a, b in zip(start, agent.target.parameters(), strict=True))
    agent.update_target(3)
    assert all(torch.equal(a, b) for a, b in zip(agent.qnet.parameters(), agent.target.parameters(), strict=True))


def test_soft_target_update_runs_in_the_learn_step_not_in_update_target():
    fields = _transitions(BATCH, CPU, seed=5)
    agent = _learner(CPU, tau=0.25, target_every=1, batch_source=lambda: FixedBatch(fields))
    with torch.no_grad():
        for p in agent.qnet.parameters():
            p.add_(1.0)
    start = _params(agent.target)
    for step in range(1, 5):
        agent.update_target(step)
    assert all(torch.equal(a, b) for a, b in zip(start, agent.target.parameters(), strict=True))
    agent.learn.run()
    for old, new, online in zip(start, agent.target.parameters(), agent.qnet.parameters(), strict=True):
        torch.testing.assert_close(new, torch.lerp(old, online.detach(), 0.25))


def test_a_market_agent_of_three_actions(smoke, tmp_path):
    """--actions 3: the network chooses among short, flat and long; an even count is refused."""
    from gper.dqn import train

    market = smoke | dict(env="market", bars=3000, test_bars=1000, num_envs=4, actions=3)
    cfg, agent, _ = setup(Config(**market))
    assert agent.env.n_actions == 3 and agent.qnet.net[-1].out_features == 3
    results = train(Config(**market, run_dir=str(tmp_path)), log=lambda _: None)
    assert results.env_steps == cfg.total_steps
    with pytest.raises(ValueError, match="odd integer >= 3"):
        resolve(Config(**(market | {"actions": 4})), CPU)


def test_a_market_agent_with_volatility_targeting(smoke, tmp_path):
    """--vol-target 0.15: the training, evaluation and test environments hold the scaled positions;
    a target out of range is refused."""
    from gper.dqn import train
    from gper.training.environment import build_env

    market = smoke | dict(env="market", bars=3000, test_bars=1000, num_envs=4, vol_target=0.15, eval_every=1)
    cfg, agent, _ = setup(Config(**market))
    assert agent.env.vol_scale is not None and build_env(cfg, CPU, split="test").vol_scale is not None
    results = train(Config(**market, run_dir=str(tmp_path)), log=lambda _: None)
    assert results.env_steps == cfg.total_steps and results.eval_mean_return is not None
    for bad in (0.0, -0.1, 11.0, True):
        with pytest.raises(ValueError, match="vol_target must be an annual volatility"):
            resolve(Config(**(market | {"vol_target": bad})), CPU)
    # a turnover penalty is the training environment's lesson: the evaluation's scores leave it out
    taxed = resolve(Config(**(market | {"turnover_bps": 5.0})), CPU)
    assert build_env(taxed, CPU).penalty == 5e-4 and build_env(taxed, CPU, split="test").penalty == 0.0
