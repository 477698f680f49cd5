"""gper: prioritized experience replay that lives on the GPU.

>>> import torch, gper
>>> rb = gper.PrioritizedReplayBuffer(1000, {"obs": ((4,), torch.float32)}, device="cpu")
>>> _ = rb.add({"obs": torch.randn(8, 4)})
>>> rb.sample(4)["obs"].shape
torch.Size([4, 4])
"""

import importlib
from types import ModuleType

from gper.replay import (
    GperWarning,
    HindsightRelabeling,
    PrioritizedReplayBuffer,
    SampledBatch,
    TrajectoryReplayBuffer,
)

__version__ = "0.1.0"
__all__ = [
    "GperWarning",
    "HindsightRelabeling",
    "PrioritizedReplayBuffer",
    "SampledBatch",
    "TrajectoryReplayBuffer",
    "__version__",
]

#: subpackages reachable as attributes after ``import gper`` (``gper.dqn.train(...)``), imported on
#: first use: ``import gper`` stays the replay buffer alone, and nothing below imports them (the
#: layers of docs/design.md); ``gper.bench`` is not among them (``gper bench`` or an explicit import)
_SUBPACKAGES = ("distributed", "dqn", "envs", "integrations", "ops", "replay", "training")


def __getattr__(name: str) -> ModuleType:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"gper.{name}")
    raise AttributeError(f"module 'gper' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBPACKAGES))
