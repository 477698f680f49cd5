"""Evaluations of a policy: episodes on a vectorized environment (:func:`run_episodes`), the greedy
policy's periodic evaluation during a run (:class:`Evaluator`), and the environment's test at the
run's end (:func:`final_test`).

:func:`run_episodes` takes any environment with the ``reset(seed)`` / ``step(actions)`` interface of
:class:`gper.envs.base.VecEnv` (copies reset automatically when an episode ends) and a policy
(observations -> actions, on the environment's device). Every copy plays its first episode; a copy
whose episode has ended goes on stepping with the others (the batch keeps its shape) but counts
no more. This is evaluation, outside the training step's CUDA graphs: the host checks every
``check_every`` steps whether all episodes have ended (one synchronisation each time).

The periodic evaluation runs every ``eval_every`` epochs (and after the last one): ``eval_episodes``
episodes on an environment of its own, a second instance of the training one with
``eval_episodes`` copies that each play one episode, on the same device, built once. It draws from
a generator of its own, re-seeded before every evaluation with :func:`eval_seed` (derived from the
run's seed): every evaluation plays the same start states, so successive scores differ by the
policy only, a resumed run evaluates as the uninterrupted one, and neither the training
environment nor torch's generators are touched. Training therefore computes the same with
evaluation on or off. It runs between epochs, outside the CUDA graphs.

What each environment evaluates on (its registration says):

- **cartpole**, **gym:<ID>**: the same task; ``gym:<ID>`` copies are seeded ``eval_seed + i``.
- **bitflip:<N>** (a goal task): the same task, and ``eval/success_rate``, the fraction of episodes
  that reached their goal (ended terminated, not truncated).
- **market**: episodes of ``episode_len`` bars from random start bars of the *held-out* test
  series (its registration's ``eval_split``; the one the final test walks whole), with the training
  series' scale: the curve shows how the policy does on prices it never trained on. Nothing
  selects on it: the final score is that of the final network, so it stays a held-out score.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gper.envs import is_goal_env, registry
from gper.training.environment import build_env
from gper.training.settings import RunSettings


def run_episodes(
    policy: Callable[[torch.Tensor], torch.Tensor],
    env: Any,
    seed: int | None,
    max_steps: int = 100_000,
    check_every: int = 32,
    with_terminated: bool = False,
) -> tuple[list[float], list[int]] | tuple[list[float], list[int], list[bool]]:
    """Play one episode on each of ``env.num_envs`` copies with ``policy``, from ``env.reset(seed)``.

    Args:
        policy: float32 observations ``[N, obs_dim]`` -> int64 actions ``[N]``; run under ``torch.no_grad``.
        env: the environment (see the module docstring); its own random numbers only, so the
            caller's generators are untouched when it owns its generator.
        seed: passed to ``env.reset``: the same seed, the same episodes for the same policy.
        max_steps: stop after this many steps; an episode still running then counts with its
            return and length so far.
        check_every: steps between the host's checks for the end.
        with_terminated: also return whether each episode ended terminated (a goal task: reached
            its goal) rather than truncated or still running.

    Returns:
        (returns, lengths): one float and one int per copy; with ``with_terminated``,
        (returns, lengths, terminated) with one bool per copy.
    """
    obs = env.reset(seed=seed)
    n, device = env.num_envs, obs.device
    returns = torch.zeros(n, dtype=torch.float64, device=device)
    lengths = torch.zeros(n, dtype=torch.int64, device=device)
    running = torch.ones(n, dtype=torch.bool, device=device)
    terminated = torch.zeros(n, dtype=torch.bool, device=device)
    with torch.no_grad():
        for t in range(1, max_steps + 1):
            step = env.step(policy(obs))
            returns += step.reward.to(torch.float64) * running
            lengths += running
            terminated |= running & step.terminated
            running &= ~(step.terminated | step.truncated)
            obs = step.obs
            if t % check_every == 0 and not bool(running.any()):
                break
    if with_terminated:
        return returns.tolist(), lengths.tolist(), terminated.tolist()
    return returns.tolist(), lengths.tolist()


def eval_seed(seed: int) -> int:
    """The evaluation environment's seed for a run of ``seed``: independent of the training streams."""
    return int(np.random.SeedSequence([int(seed), 2]).generate_state(1)[0])


def due(cfg: RunSettings, epoch: int, last: bool) -> bool:
    """Whether the epoch numbered ``epoch`` (from 1, counted from the run's start) ends with an
    evaluation: every ``eval_every``-th, and the run's last (``last``); none with ``eval_every`` 0."""
    return cfg.eval_every > 0 and (epoch % cfg.eval_every == 0 or last)


class Evaluator:
    """Plays the greedy policy on the evaluation environment (see the module docstring).

    A population of ``agents`` (N > 1) plays ``N * eval_episodes`` copies at once, copies
    ``[i * eval_episodes, (i + 1) * eval_episodes)`` agent ``i``'s (the policy maps every copy's
    observation to its agent's action): the ``eval/`` metrics are over all of them, and each agent's
    mean return is ``agent_<i>/eval/mean_return`` beside them.

    Args:
        cfg: the run's resolved settings.
        device: where the run trains: the evaluation environment lives there too.
        agents: the learner's agents (a population's N).
    """

    def __init__(self, cfg: RunSettings, device: torch.device, agents: int = 1) -> None:
        self.cfg, self.seed, self.agents = cfg, eval_seed(cfg.seed), agents
        spec = registry.lookup(cfg.env)
        split = spec.eval_split if spec is not None else "train"
        copies = cfg.eval_episodes * agents
        self.env = build_env(dataclasses.replace(cfg, num_envs=copies), device, split=split, own_rng=True)

    def run(self, policy: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """One evaluation: the ``eval/`` metrics (mean, std, min and max return, mean length, the
        number of episodes and the seconds it took; a goal task's success rate)."""
        t0 = time.perf_counter()
        goal = is_goal_env(self.env)
        returns, lengths, *reached = run_episodes(policy, self.env, self.seed, with_terminated=goal)
        n = len(returns)
        mean = sum(returns) / n
        success = {"eval/success_rate": sum(reached[0]) / n} if goal else {}
        per_agent = {}
        if self.agents > 1:
            k = self.cfg.eval_episodes
            per_agent = {
                f"agent_{i}/eval/mean_return": sum(returns[i * k : (i + 1) * k]) / k for i in range(self.agents)
            }
        return (
            per_agent
            | success
            | {
                "eval/mean_return": mean,
                "eval/std_return": math.sqrt(sum((r - mean) ** 2 for r in returns) / n),
                "eval/min_return": min(returns),
                "eval/max_return": max(returns),
                "eval/mean_length": sum(lengths) / n,
                "eval/episodes": n,
                "eval/seconds": time.perf_counter() - t0,
            }
        )

    def close(self) -> None:
        self.env.close()


def final_test(
    cfg: RunSettings, policy: Callable[[torch.Tensor], torch.Tensor], device: torch.device, log: Any, stop: Any
) -> dict[str, float] | None:
    """The environment's test at the run's end (:attr:`~gper.envs.registry.EnvSpec.final_test`, market:
    the greedy policy over the held-out prices against buy-and-hold and flat), its line logged;
    None when the environment has none, or when a stop signal (``stop.requested``) arrives before
    it is done (it walks the whole series, seconds on a long one)."""
    spec = registry.lookup(cfg.env)
    if spec is None or spec.final_test is None:
        return None

    def checked(obs: torch.Tensor) -> torch.Tensor:
        if stop.requested:
            raise _TestStopped
        return policy(obs)

    env = build_env(dataclasses.replace(cfg, num_envs=1), device, split="test")
    try:
        result = spec.final_test(checked, env)
    except _TestStopped:
        return None
    finally:
        env.close()
    if spec.describe_final_test is not None:
        log(spec.describe_final_test(result, cfg))
    return result


class _TestStopped(Exception):
    """A stop signal arrived during the final test."""
