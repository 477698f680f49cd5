"""Stable-Baselines3 on gper's prioritized buffer (Schaul et al. 2016, arXiv:1511.05952).

* :class:`PrioritizedReplayBuffer` (``buffer.py``): a ``replay_buffer_class`` for SB3's DQN, SAC,
  TD3 and DDPG whose transitions live in a :class:`gper.PrioritizedReplayBuffer` on the model's
  device; its ``sample`` adds IS weights and what ``update_priorities`` needs.
* :class:`PrioritizedDQN` (``dqn.py``): SB3's DQN with IS-weighted Huber loss, priorities from the
  TD errors, beta annealed to 1, and no host sync per gradient step.

>>> from gper.integrations.sb3 import PrioritizedDQN
>>> model = PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6))  # doctest: +SKIP
"""

try:
    import stable_baselines3  # noqa: F401
except ImportError as err:  # one line that says how to get it
    raise ImportError('gper.integrations.sb3 needs stable-baselines3: pip install ".[sb3]"') from err

from gper.integrations.sb3.buffer import PrioritizedReplayBuffer, PrioritizedReplayBufferSamples
from gper.integrations.sb3.dqn import PrioritizedDQN, weighted_huber_loss

__all__ = ["PrioritizedDQN", "PrioritizedReplayBuffer", "PrioritizedReplayBufferSamples", "weighted_huber_loss"]
