"""Samplers, one file each, and the registry every buffer takes its modes from.

* ``proportional``: independent draws, ``P(i) = p_i / sum(p)`` (Schaul et al. 2016, eq. 1);
* ``stratified``: one draw in each of B equal-mass segments (the PER paper's variant);
* ``rank``: ``P(i) ∝ rank(i) ** -alpha``, ranks by ``|td| + eps``, re-sorted every
  ``refresh_interval`` updates;
* ``uniform``: every filled slot equally likely, IS weights 1.

:data:`SAMPLERS` maps a name to its class; :data:`SAMPLING` lists the names, :data:`SHARDED_SAMPLING` those a
sharded buffer can draw. CONTRIBUTING.md says how to add one.
"""

from gper.replay.samplers.base import SAMPLERS, WEIGHT_NORMS, PriorityUpdate, SamplingPolicy
from gper.replay.samplers.proportional import ProportionalSampler
from gper.replay.samplers.rank import RankKeys, RankSampler
from gper.replay.samplers.stratified import StratifiedSampler
from gper.replay.samplers.uniform import UniformSampler

SAMPLERS.update({cls.mode: cls for cls in (ProportionalSampler, StratifiedSampler, RankSampler, UniformSampler)})
SAMPLING = tuple(SAMPLERS)
SHARDED_SAMPLING = tuple(name for name, cls in SAMPLERS.items() if cls.shardable)

__all__ = [
    "SAMPLERS",
    "SAMPLING",
    "SHARDED_SAMPLING",
    "WEIGHT_NORMS",
    "PriorityUpdate",
    "ProportionalSampler",
    "RankKeys",
    "RankSampler",
    "SamplingPolicy",
    "StratifiedSampler",
    "UniformSampler",
]
