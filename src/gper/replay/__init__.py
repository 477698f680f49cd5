"""The replay library: the buffer's state as named objects, and the buffer built from them.

* :class:`PriorityTree` (``tree.py``): sum and min trees, generations, claims, device counters;
* :class:`RowStorage` (``storage.py``): the packed rows of every field and their views;
* :class:`SamplingPolicy` (``samplers/``, one file a mode, and their registry): proportional,
  stratified, rank or uniform, and the IS-weight normalisation;
* :class:`ReplayCore` (``core.py``): the three above, the buffer's CUDA graphs and state
  identity, and the add/update/restore/copy paths every buffer shares;
* :class:`ReplaySettings` (``config.py``): the keyword settings every buffer takes, declared once
  with their defaults (``DEFAULTS``) and checks;
* :class:`SampledBatch` (``batch.py``): what ``sample`` returns;
* :class:`PrioritizedReplayBuffer` (``buffer.py``): the façade over a core (its CUDA graphs:
  ``graphs.py``);
* :class:`TrajectoryReplayBuffer` (``trajectory.py``): env streams in time order on a core,
  each observation stored once (rows: ``streams.py``; the streams' state: ``stream_state.py``; what it samples:
  ``trajectory_batch.py``; its checkpoint methods and checks: ``trajectory_checkpoint.py``);
* :class:`HindsightRelabeling` (``her.py``): goals relabelled at sample time in the trajectory
  buffer (HER), on the episode index of ``episodes.py``.

Imports only :mod:`gper.ops` (the kernels) below it; nothing here knows of environments,
trainers or benchmarks.
"""

from gper.replay.batch import SampledBatch
from gper.replay.buffer import PrioritizedReplayBuffer
from gper.replay.checks import GperWarning
from gper.replay.config import ReplaySettings
from gper.replay.core import ReplayCore
from gper.replay.her import HindsightRelabeling
from gper.replay.samplers import SamplingPolicy
from gper.replay.storage import RowLayout, RowStorage
from gper.replay.trajectory import TrajectoryReplayBuffer
from gper.replay.trajectory_batch import SequenceBatch, TransitionBatch
from gper.replay.tree import PriorityTree

__all__ = [
    "GperWarning",
    "HindsightRelabeling",
    "PrioritizedReplayBuffer",
    "PriorityTree",
    "ReplayCore",
    "ReplaySettings",
    "RowLayout",
    "RowStorage",
    "SampledBatch",
    "SamplingPolicy",
    "SequenceBatch",
    "TrajectoryReplayBuffer",
    "TransitionBatch",
]
