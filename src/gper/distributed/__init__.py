"""Prioritized replay sharded over the ranks of a ``torch.distributed`` process group.

Each rank holds one shard, a :class:`gper.PrioritizedReplayBuffer` of ``capacity / world_size``
slots on its own device, and every rank draws its part of one global batch:

* ``mode="exact"``: the draws follow the distribution of one buffer over all shards,
  ``P(i) = p_i / sum over every shard``; rows travel to the rank that drew them in one
  reduce-scatter of equal size, priorities back to the shard that owns each slot in one
  all-gather (:mod:`gper.distributed.shards` holds the math);
* ``mode="local"``: each rank draws from its own shard and weights carry the shard ratio
  ``world_size * T_k / sum T``, so the loss is unbiased for the same distribution; no row moves.

``docs/distributed.md`` says how to launch, what each mode costs per step, and the math.
"""

from gper.distributed.batch import ShardedBatch
from gper.distributed.buffer import ShardedPrioritizedReplayBuffer

__all__ = ["ShardedBatch", "ShardedPrioritizedReplayBuffer"]
