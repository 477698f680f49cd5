"""Adapters that put gper's replay buffer behind other RL libraries' replay APIs.

Each adapter imports its library when it is imported itself (never here), and raises ImportError
naming the pip extra when that library is missing:

* :mod:`gper.integrations.sb3`: Stable-Baselines3's ``ReplayBuffer`` interface and a prioritized
  ``DQN`` (``pip install ".[sb3]"``).
* :mod:`gper.integrations.torchrl`: ``PrioritizedReplayBuffer``, TorchRL's
  ``TensorDictPrioritizedReplayBuffer`` interface (TensorDict in and out, ``priority_weight``
  for TorchRL's losses, ``update_tensordict_priority``); ``pip install ".[torchrl]"``.
"""
