"""Adapters that put gper's replay buffer behind other RL libraries' replay APIs.

Each adapter is its own module, imported by name, and needs that library's extra; importing this
package imports none of them.

* :mod:`gper.integrations.torchrl`: ``PrioritizedReplayBuffer``, TorchRL's
  ``TensorDictPrioritizedReplayBuffer`` interface (TensorDict in and out, ``priority_weight``
  for TorchRL's losses, ``update_tensordict_priority``); ``pip install "gper[torchrl]"``.
"""
