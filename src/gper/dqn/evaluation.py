"""The greedy policy's periodic evaluation: every ``eval_every`` epochs (and after the last one),
``eval_episodes`` episodes on an environment of its own.

The evaluation environment is a second instance of the training one, with ``eval_episodes``
copies that each play one episode (:func:`gper.training.evaluation.run_episodes`), on the same
device, built once. It draws from a generator of its own, re-seeded before every evaluation with
:func:`eval_seed` (derived from the run's seed): every evaluation plays the same start states, so
successive scores differ by the policy only, a resumed run evaluates as the uninterrupted one, and
neither the training environment nor torch's generators are touched. Training therefore computes
the same with evaluation on or off. It runs between epochs, outside the CUDA graphs.

- **cartpole**, **gym:<ID>**: the same task; ``gym:<ID>`` copies are seeded ``eval_seed + i``.
- **bitflip:<N>** (a goal task): the same task, and ``eval/success_rate``, the fraction of episodes
  that reached their goal (ended terminated, not truncated).
- **market**: episodes of ``episode_len`` bars from random start bars of the *held-out* test
  series (the one the final score walks whole), with the training series' scale: the curve shows
  how the policy does on prices it never trained on. Nothing selects on it: the final score is
  that of the final network, so it stays a held-out score.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from gper.dqn.config import Config
from gper.envs import VecEnv, is_goal_env
from gper.training.evaluation import run_episodes


def eval_seed(seed: int) -> int:
    """The evaluation environment's seed for a run of ``seed``: independent of the training streams."""
    return int(np.random.SeedSequence([int(seed), 2]).generate_state(1)[0])


def due(cfg: Config, epoch: int, last: bool) -> bool:
    """Whether the epoch numbered ``epoch`` (from 1, counted from the run's start) ends with an
    evaluation: every ``eval_every``-th, and the run's last (``last``); none with ``eval_every`` 0."""
    return cfg.eval_every > 0 and (epoch % cfg.eval_every == 0 or last)


class Evaluator:
    """Plays the greedy policy on the evaluation environment (see the module docstring).

    Args:
        cfg: the run's resolved settings.
        build: ``build(cfg, split, own_rng)`` -> the environment (:func:`gper.dqn.loop.build_env`).
    """

    def __init__(self, cfg: Config, build: Callable[..., VecEnv]) -> None:
        self.cfg, self.seed = cfg, eval_seed(cfg.seed)
        split = "test" if cfg.env == "market" else "train"
        self.env = build(dataclasses.replace(cfg, num_envs=cfg.eval_episodes), split=split, own_rng=True)

    def run(self, policy: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """One evaluation: the ``eval/`` metrics (mean, std, min and max return, mean length, the
        number of episodes and the seconds it took; a goal task's success rate)."""
        t0 = time.perf_counter()
        goal = is_goal_env(self.env)
        returns, lengths, *reached = run_episodes(policy, self.env, self.seed, with_terminated=goal)
        n = len(returns)
        mean = sum(returns) / n
        success = {"eval/success_rate": sum(reached[0]) / n} if goal else {}
        return success | {
            "eval/mean_return": mean,
            "eval/std_return": math.sqrt(sum((r - mean) ** 2 for r in returns) / n),
            "eval/min_return": min(returns),
            "eval/max_return": max(returns),
            "eval/mean_length": sum(lengths) / n,
            "eval/episodes": n,
            "eval/seconds": time.perf_counter() - t0,
        }

    def close(self) -> None:
        self.env.close()
