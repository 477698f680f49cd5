"""gper: prioritized experience replay that lives on the GPU.

>>> import torch, gper
>>> rb = gper.PrioritizedReplayBuffer(1000, {"obs": ((4,), torch.float32)}, device="cpu")
>>> _ = rb.add({"obs": torch.randn(8, 4)})
>>> rb.sample(4)["obs"].shape
torch.Size([4, 4])
"""

from gper.replay import GperWarning, PrioritizedReplayBuffer, SampledBatch

__version__ = "0.1.0"
__all__ = ["GperWarning", "PrioritizedReplayBuffer", "SampledBatch", "__version__"]
