"""run_episodes: one episode per copy of a vectorized environment, against a plain loop that steps
one copy at a time from the same start state."""

from __future__ import annotations

import torch

from gper.envs.cartpole import CartPole
from gper.training.evaluation import run_episodes


def _lean(obs: torch.Tensor) -> torch.Tensor:
    """A fixed policy that balances for a while: push towards the side the pole leans to."""
    return (obs[:, 2] > 0).to(torch.int64)


def _oracle(start: torch.Tensor) -> tuple[float, int]:
    """One copy's first episode, stepped alone from the start state ``start`` [4]."""
    env = CartPole(1)
    env.set_state(start.reshape(1, 4))
    obs, total, length = env.state.float(), 0.0, 0
    while True:
        step = env.step(_lean(obs))
        total, length = total + float(step.reward), length + 1
        if bool(step.terminated | step.truncated):
            return total, length
        obs = step.obs


def test_each_copy_plays_one_episode_from_its_seeded_start():
    env = CartPole(7, seed=0)
    starts = CartPole(7, seed=123).state.clone()  # what reset(seed=123) draws
    returns, lengths = run_episodes(_lean, env, seed=123)
    expected = [_oracle(s) for s in starts]
    assert returns == [r for r, _ in expected] and lengths == [n for _, n in expected]
    assert len(set(lengths)) > 1  # episodes of different lengths: the ended ones stopped counting
    assert run_episodes(_lean, env, seed=123) == (returns, lengths)  # the same seed, the same episodes


def test_an_env_with_its_own_generator_leaves_torchs_untouched():
    before = torch.get_rng_state()
    run_episodes(_lean, CartPole(3), seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    run_episodes(_lean, CartPole(3, graph_safe_rng=True), seed=5)  # the training env's kind draws from it
    assert not torch.equal(torch.get_rng_state(), before)


def test_episodes_still_running_at_max_steps_count_what_they_have():
    returns, lengths = run_episodes(_lean, CartPole(2, seed=0), seed=1, max_steps=5, check_every=2)
    assert lengths == [5, 5] and returns == [5.0, 5.0]
