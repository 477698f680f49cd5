"""Populations: N DQN agents of one architecture trained at once, their parameters stacked.

Agent ``i`` of a population of N trains as the single run seeded ``seed + i`` does, bit for bit
on the CPU. The parts, each in its own module:

- :class:`StackedQNetwork` and :func:`stacked_init` (:mod:`gper.dqn.population_net`): the online
  and target networks, weights ``[N, out, in]``, forward ``[N, B, obs_dim] -> [N, B, n_actions]``.
- :func:`population_loss` and :func:`population_td_loss` (:mod:`gper.dqn.population_loss`): each
  agent's double-Q Huber (or squared-error) loss over its own batch; :func:`clip_grad_norms_`, each
  agent's clipping.
- :class:`PopulationAdam`, :func:`hard_update_`, :func:`soft_update_`
  (:mod:`gper.dqn.population_adam`): Adam with each agent's own state (and learning rate, for a
  sweep), and the target updates.

One learn step, as the single agent's unfused one::

    adam.zero_grad()
    total, losses, td = population_loss(qnet, target, x, next_x, action, reward, done, weights, gamma=gamma)
    total.backward()
    clip_grad_norms_([p.grad for p in qnet.parameters()], max_grad_norm)  # where max_grad_norm > 0
    adam.step()
    soft_update_(target, qnet, tau)  # tau < 1; else hard_update_(target, qnet) every target_every steps
"""

from __future__ import annotations

from gper.dqn.population_adam import PopulationAdam, hard_update_, soft_update_
from gper.dqn.population_loss import clip_grad_norms_, population_loss, population_td_loss
from gper.dqn.population_net import StackedLinear, StackedQNetwork, stacked_init

__all__ = [
    "PopulationAdam",
    "StackedLinear",
    "StackedQNetwork",
    "clip_grad_norms_",
    "hard_update_",
    "population_loss",
    "population_td_loss",
    "soft_update_",
    "stacked_init",
]
