"""The goal-conditioned protocol: observation layout, and rewards of relabelled goals equal to the env's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gper.envs import GoalEnv, is_goal_env, make_env
from gper.envs.bitflip import BitFlip
from gper.envs.cartpole import CartPole


class Reach(GoalEnv):
    """A goal env whose achieved goal is not the whole observation part: observation (x, y, speed),
    goal (x, y), reward minus the distance to it. Only the protocol's methods: never stepped."""

    goal_dim = 2
    obs_dim = 5

    def achieved_goal(self, observation):
        return observation[..., :2]

    def compute_reward(self, achieved_goal, desired_goal, info=None):
        return -(achieved_goal - desired_goal).norm(dim=-1)

    def compute_terminated(self, achieved_goal, desired_goal, info=None):
        return (achieved_goal - desired_goal).norm(dim=-1) < 0.5


@pytest.mark.parametrize("n", [1, 3, 12])
def test_step_agrees_with_compute_reward_and_compute_terminated(n):
    """Over many random steps, reward and terminated are the protocol's functions of the step's
    achieved goal (its next state) and desired goal (the goal it was collected for), bit for bit."""
    env = BitFlip(n, 128, seed=3)
    rng = np.random.default_rng(n)
    solved = 0
    for _ in range(300):
        # actions that often flip a wrong bit, so that many steps reach their goal
        wrong = (env.state != env.goal).float() + 0.05
        greedy = torch.multinomial(wrong, 1, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
        actions = torch.where(torch.from_numpy(rng.random(128) < 0.7), greedy.squeeze(1), torch.randint(0, n, (128,)))
        step = env.step(actions)
        _, achieved, desired = env.split_goal_obs(step.next_obs)
        reward = env.compute_reward(achieved, desired, {})
        terminated = env.compute_terminated(achieved, desired, {})
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
        assert torch.equal(reward, step.reward) and torch.equal(terminated, step.terminated)
        # bit for bit (0.0 and -0.0 compare equal)
        assert torch.equal(reward.view(torch.int32), step.reward.view(torch.int32))
        solved += int(step.terminated.sum())
    assert solved > 1000


def test_relabelled_goals_of_any_leading_shape():
    """[T, B] goals, broadcasting, goals of another dtype, an info dict: what relabelling passes."""
    env = BitFlip(6, 1, seed=0)
    g = torch.Generator().manual_seed(0)
    achieved = torch.randint(0, 2, (5, 7, 6), generator=g).float()
    desired = achieved.clone()
    desired[0, :, 2] = 1 - desired[0, :, 2]  # row 0 misses by one bit, the rest are reached
    reward = env.compute_reward(achieved, desired, {"unused": torch.zeros(5, 7)})
    assert reward.shape == (5, 7) and reward.dtype == torch.float32
    assert reward[0].eq(-1).all() and reward[1:].eq(0).all()
    assert torch.equal(env.compute_terminated(achieved, desired), reward == 0)
    # one goal for a whole batch, and bool goals against float ones
    assert env.compute_reward(achieved, desired[1, 0]).shape == (5, 7)
    assert torch.equal(env.compute_terminated(achieved.bool(), desired), reward == 0)
    with pytest.raises(ValueError, match=r"desired_goal must be \[\.\.\., 6\], got \[5, 7, 4\]"):
        env.compute_reward(achieved, desired[..., :4])
    with pytest.raises(ValueError, match=r"achieved_goal must be \[\.\.\., 6\]"):
        env.compute_terminated(torch.zeros(()), desired)


def test_split_goal_obs_and_with_desired_goal():
    env = BitFlip(4, 3, seed=1)
    obs = torch.stack([env.observe(), env.step(torch.tensor([0, 1, 2])).obs])  # [2, 3, 8]
    observation, achieved, desired = env.split_goal_obs(obs)
    assert observation.shape == achieved.shape == desired.shape == (2, 3, 4)
    assert torch.equal(achieved, observation)  # bit flipping: the state part is the achieved goal
    assert torch.equal(desired[1], env.goal.float()) and torch.equal(achieved[1], env.state.float())
    assert torch.equal(torch.cat((observation, desired), -1), obs)
    relabelled = env.with_desired_goal(obs, achieved)
    assert torch.equal(relabelled[..., :4], obs[..., :4]) and torch.equal(relabelled[..., 4:], achieved)
    assert env.compute_reward(*env.split_goal_obs(relabelled)[1:]).eq(0).all()
    assert torch.equal(env.with_desired_goal(obs, torch.ones(4))[..., 4:], torch.ones(2, 3, 4))  # broadcast
    with pytest.raises(ValueError, match=r"obs must be \[\.\.\., 8\], got \[3, 7\]"):
        env.split_goal_obs(torch.zeros(3, 7))
    with pytest.raises(ValueError, match=r"desired_goal must be \[\.\.\., 4\]"):
        env.with_desired_goal(obs, torch.zeros(3))


def test_the_protocol_for_an_achieved_goal_inside_the_observation():
    env = Reach()
    obs = torch.tensor([[1.0, 2.0, 9.0, 1.0, 2.25], [0.0, 0.0, 1.0, 3.0, 4.0]])
    observation, achieved, desired = env.split_goal_obs(obs)
    assert observation.tolist() == [[1.0, 2.0, 9.0], [0.0, 0.0, 1.0]]
    assert achieved.tolist() == [[1.0, 2.0], [0.0, 0.0]] and desired.tolist() == [[1.0, 2.25], [3.0, 4.0]]
    assert env.compute_terminated(achieved, desired).tolist() == [True, False]
    assert env.with_desired_goal(obs, achieved)[:, 3:].tolist() == [[1.0, 2.0], [0.0, 0.0]]


def test_is_goal_env():
    assert is_goal_env(BitFlip(3, 1)) and is_goal_env(make_env("bitflip:3", 1, "cpu")) and is_goal_env(Reach())
    assert not is_goal_env(CartPole(1)) and not is_goal_env(object())


def test_a_goal_env_must_implement_the_protocol():
    class Partial(GoalEnv):
        goal_dim = 1

        def achieved_goal(self, observation):
            return observation

    with pytest.raises(TypeError, match="compute_reward"):
        Partial()
