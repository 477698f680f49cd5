"""The replay as the learner sees it (gper.dqn.replay_feed): which feed serves which buffer, what
each adds, draws and lays out, its TD target and the loss kernel's bootstrap, the replays a feed
refuses, and an agent whose steps read the replay through its feed alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gper
from gper.dqn import Agent, Config, LearnState, padded_width, replay_spec, resolve, setup, trajectory_spec
from gper.dqn.replay_feed import FlatFeed, GoalTrajectoryFeed, ReplayFeed, TrajectoryFeed, replay_feed
from gper.envs import make_env

CPU = torch.device("cpu")
OBS, WIDTH, ENVS = 4, padded_width(4), 2
SETTINGS = dict(env="cartpole", device="cpu", total_steps=1000, num_envs=ENVS, batch_size=8, hidden=(16,))


def _cfg(**change) -> Config:
    return resolve(Config(**SETTINGS | dict(learning_starts=8, buffer_size=64, epoch_steps=100) | change), CPU)


def _collect(feed, env, steps: int) -> None:
    """``steps`` random steps of ``env`` added through ``feed``, observations padded as the agent pads them."""
    obs = F.pad(env.reset(seed=0), (0, WIDTH - OBS))
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        step = env.step(torch.randint(0, env.n_actions, (env.num_envs,), generator=g))
        feed.add(obs, torch.randint(0, 2, (env.num_envs,)), step, F.pad(step.next_obs, (0, WIDTH - OBS)))
        obs = F.pad(step.obs, (0, WIDTH - OBS))


def test_each_buffer_gets_its_feed():
    env, cfg = make_env("cartpole", ENVS, CPU), _cfg()
    flat = gper.PrioritizedReplayBuffer(64, replay_spec(WIDTH), device=CPU)
    trajectory = gper.TrajectoryReplayBuffer(32, ENVS, trajectory_spec(WIDTH), window=2, backend="torch", device=CPU)
    assert type(replay_feed(cfg, env, flat)) is FlatFeed and replay_feed(cfg, env, flat).replay is flat
    feed = replay_feed(cfg, env, trajectory)
    assert type(feed) is TrajectoryFeed and feed.replay is trajectory and feed.goal_env is None
    assert isinstance(feed, ReplayFeed) and isinstance(replay_feed(cfg, env, flat), ReplayFeed)
    # the trajectory replay's host count of adds reaches window + 1 before the collect graph is captured
    assert replay_feed(cfg, env, flat).collect_warmup == 3 and feed.collect_warmup == 3
    window5 = gper.TrajectoryReplayBuffer(32, ENVS, trajectory_spec(WIDTH), window=5, backend="torch", device=CPU)
    assert replay_feed(cfg, env, window5).collect_warmup == 6


def test_a_goal_task_gets_the_goal_feed():
    settings = dict(env="bitflip:4", device="cpu", total_steps=400, num_envs=2, learning_starts=64, batch_size=8)
    settings |= dict(buffer_size=200, epoch_steps=200, hidden=(16,), her="future", progress=False)
    _, agent, _ = setup(Config(**settings), log=lambda _: None)
    assert type(agent.feed) is GoalTrajectoryFeed and isinstance(agent.feed, ReplayFeed)
    assert agent.feed.goal_env is agent.env is agent.goal_env


def test_the_flat_feed_keeps_done_and_gamma_apart():
    env, cfg = make_env("cartpole", ENVS, CPU), _cfg(gamma=0.9)
    feed = replay_feed(cfg, env, gper.PrioritizedReplayBuffer(64, replay_spec(WIDTH), device=CPU, seed=0))
    _collect(feed, env, 20)
    batch = feed.sample(8, torch.tensor(0.4))
    inputs = LearnState()
    feed.upload(batch, inputs)
    assert inputs.x is batch["obs"] and inputs.next_x is batch["next_obs"] and inputs.weights is batch.weights
    assert inputs.done is batch["done"] and inputs.discount is None
    next_q = torch.randn(8)
    assert torch.equal(feed.target(inputs, next_q), batch["reward"] + 0.9 * (1.0 - batch["done"]) * next_q)
    discount, gamma = feed.loss_discount(inputs)
    assert discount is batch["done"] and gamma == 0.9
    before = feed.replay.priorities(batch.indices)
    feed.update_priorities(batch, torch.full((8,), 5.0))
    assert not torch.equal(feed.replay.priorities(batch.indices), before)


def test_the_trajectory_feed_draws_n_step_returns_and_their_discount():
    env, cfg = make_env("cartpole", ENVS, CPU), _cfg(n_step=3, gamma=0.5)
    rb = gper.TrajectoryReplayBuffer(32, ENVS, trajectory_spec(WIDTH), window=3, backend="torch", device=CPU)
    feed = replay_feed(cfg, env, rb)
    _collect(feed, env, 12)
    batch = feed.sample(8, torch.tensor(0.4))
    assert torch.all((batch["discount"] == 0.125) | (batch["discount"] == 0))  # gamma^3, or 0 where it ended
    inputs = LearnState()
    feed.upload(batch, inputs)
    assert inputs.discount is batch["discount"] and inputs.done is None and inputs.x is batch["obs"]
    next_q = torch.randn(8)
    assert torch.equal(feed.target(inputs, next_q), batch["reward"] + batch["discount"] * next_q)
    discount, gamma = feed.loss_discount(inputs)
    assert discount is batch["discount"] and gamma is None


def test_a_feed_refuses_a_replay_that_cannot_serve_it():
    env = make_env("cartpole", ENVS, CPU)
    flat = gper.PrioritizedReplayBuffer(64, replay_spec(WIDTH), device=CPU)
    with pytest.raises(ValueError, match="n_step 3 needs a TrajectoryReplayBuffer"):
        replay_feed(_cfg(n_step=3), env, flat)
    short = gper.TrajectoryReplayBuffer(32, ENVS, trajectory_spec(WIDTH), window=2, backend="torch", device=CPU)
    with pytest.raises(ValueError, match="window 2 is shorter than n_step 3"):
        replay_feed(_cfg(n_step=3), env, short)
    one = gper.TrajectoryReplayBuffer(32, 1, trajectory_spec(WIDTH), window=1, backend="torch", device=CPU)
    with pytest.raises(ValueError, match="has 1 streams, the environment 2 copies"):
        replay_feed(_cfg(), env, one)
    assert type(replay_feed(_cfg(), env, one, collects=False)) is TrajectoryFeed  # a learner collects nothing


def test_the_agents_steps_read_the_replay_through_the_feed_alone():
    """No step of the agent asks which replay it has, nor reaches past the feed to the buffer."""
    steps = (Agent._collect, Agent.sample_replay, Agent._upload, Agent._fwd_bwd, Agent._fwd_bwd_fused)
    for method in (*steps, Agent._per_update):
        names = set(method.__code__.co_names)  # the globals and attributes the method's code reads
        assert "feed" in names and not names & {"trajectory", "goal_env", "rb", "isinstance"}, method.__name__
