"""The replay library: named state objects and the buffers built from them.

Imports only :mod:`gper.ops` (the kernels) below it; nothing here knows of environments,
trainers or benchmarks.
"""

from gper.replay.batch import SampledBatch
from gper.replay.buffer import GperWarning, PrioritizedReplayBuffer

__all__ = ["GperWarning", "PrioritizedReplayBuffer", "SampledBatch"]
