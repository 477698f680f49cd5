"""A sharded buffer's exact-mode kernels: ``reference`` (torch, any device) and ``triton``, the
same functions with the same signatures (:data:`CONTRACT`); the one that touches a shard's tree
(``unpack_updates``) takes its :class:`~gper.ops.state.TreeState` as ``state``."""

from __future__ import annotations

#: the functions every back end of this family provides
CONTRACT = (
    "shard_meta",
    "shared_draws",
    "pack_rows",
    "unpack_rows",
    "pack_updates",
    "unpack_updates",
    "local_priorities",
    "local_weights",
)
