"""Gymnasium environments through :class:`gper.envs.gym.GymVecEnv`."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from gper.envs import make_env
from gper.envs.gym import GymVecEnv

gym = pytest.importorskip("gymnasium")


def test_shapes_and_dtypes():
    env = make_env("gym:CartPole-v1", 4, "cpu", seed=0)
    assert isinstance(env, GymVecEnv) and env.name == "gym:CartPole-v1"
    assert (env.obs_dim, env.n_actions, env.graph_safe) == (4, 2, False)
    obs = env.reset(seed=0)
    assert obs.shape == (4, 4) and obs.dtype == torch.float32
    step = env.step(torch.zeros(4, dtype=torch.int64))
    assert step.next_obs.shape == step.obs.shape == (4, 4)
    assert step.reward.dtype == torch.float32 and step.reward.tolist() == [1.0] * 4
    assert step.terminated.dtype == step.truncated.dtype == torch.bool
    env.close()


def test_same_step_autoreset_matches_single_gymnasium_envs():
    """Copy i, seeded seed + i, follows a lone ``gymnasium.make`` env; ended copies reset in the same step."""
    n, seed = 3, 10
    env = GymVecEnv("CartPole-v1", n, "cpu", seed=seed)
    refs = [gym.make("CartPole-v1") for _ in range(n)]
    ref_obs = [r.reset(seed=seed + i)[0] for i, r in enumerate(refs)]
    assert np.array_equal(env.reset(seed=seed).numpy(), np.stack(ref_obs))
    rng = np.random.default_rng(0)
    ended_seen = 0
    for _ in range(200):
        actions = rng.integers(0, 2, n)
        step = env.step(torch.from_numpy(actions))
        for i, ref in enumerate(refs):
            obs, reward, terminated, truncated, _ = ref.step(int(actions[i]))
            assert np.array_equal(step.next_obs[i].numpy(), obs)
            assert (bool(step.terminated[i]), bool(step.truncated[i])) == (terminated, truncated)
            if terminated or truncated:
                ended_seen += 1
                assert not torch.equal(step.obs[i], step.next_obs[i])
                assert (step.obs[i].abs() <= 0.05).all()  # a fresh CartPole state
                # The vector env reset its copy with that copy's own generator, as the lone env does now.
                ref.reset()
                assert np.array_equal(step.obs[i].numpy(), ref.unwrapped.state.astype(np.float32))
            else:
                assert torch.equal(step.obs[i], step.next_obs[i])
    assert ended_seen >= 5
    env.close()


def test_discrete_observations_are_flattened():
    env = GymVecEnv("FrozenLake-v1", 2, "cpu", seed=0, is_slippery=False)
    obs = env.reset(seed=0)
    assert env.obs_dim == 16 and env.n_actions == 4
    assert obs.shape == (2, 16) and obs.sum(1).tolist() == [1.0, 1.0] and obs[:, 0].tolist() == [1.0, 1.0]
    step = env.step(torch.tensor([1, 2]))  # down, right
    assert step.next_obs.argmax(1).tolist() == [4, 1]
    env.close()


def test_non_discrete_action_space_is_refused():
    with pytest.raises(ValueError, match="gym:Pendulum-v1 has action space Box.*only Discrete"):
        GymVecEnv("Pendulum-v1", 2, "cpu")


def test_unknown_id():
    with pytest.raises(ValueError, match="cannot make Gymnasium environment 'NoSuchEnv-v0'"):
        make_env("gym:NoSuchEnv-v0", 2, "cpu")


def test_missing_gymnasium_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r'gym:CartPole-v1 needs Gymnasium: pip install "\.\[gym\]"'):
        GymVecEnv("CartPole-v1", 1, "cpu")


def test_next_step_autoreset_matches_single_gymnasium_envs():
    """In next-step mode the step that ends an episode returns its final observation as both
    ``next_obs`` and ``obs``; the copy's next step is a reset step: reward 0, flags false, and the
    observation a lone env seeded the same way resets to."""
    n, seed = 3, 10
    env = make_env("gym:CartPole-v1", n, "cpu", seed=seed, autoreset="next-step")
    assert env.autoreset == "next-step" and make_env("gym:CartPole-v1", 1, "cpu").autoreset == "same-step"
    refs = [gym.make("CartPole-v1") for _ in range(n)]
    ref_obs = [r.reset(seed=seed + i)[0] for i, r in enumerate(refs)]
    assert np.array_equal(env.reset(seed=seed).numpy(), np.stack(ref_obs))
    rng = np.random.default_rng(0)
    resetting = [False] * n
    ended_seen = 0
    for _ in range(200):
        actions = rng.integers(0, 2, n)
        step = env.step(torch.from_numpy(actions))
        assert torch.equal(step.obs, step.next_obs)
        for i, ref in enumerate(refs):
            if resetting[i]:  # the action is ignored; the copy resets with its own generator
                obs, reward, terminated, truncated = ref.reset()[0], 0.0, False, False
            else:
                obs, reward, terminated, truncated, _ = ref.step(int(actions[i]))
            assert np.array_equal(step.next_obs[i].numpy(), obs)
            assert (float(step.reward[i]), bool(step.terminated[i]), bool(step.truncated[i])) == (
                reward,
                terminated,
                truncated,
            )
            resetting[i] = terminated or truncated
            ended_seen += resetting[i]
    assert ended_seen >= 5
    env.close()


def test_autoreset_modes_are_checked():
    with pytest.raises(ValueError, match="autoreset must be one of same-step, next-step, got 'never'"):
        make_env("gym:CartPole-v1", 1, "cpu", autoreset="never")
    with pytest.raises(ValueError, match="cartpole resets in the same step only"):
        make_env("cartpole", 1, "cpu", autoreset="next-step")
    assert make_env("cartpole", 1, "cpu", autoreset="same-step").autoreset == "same-step"
