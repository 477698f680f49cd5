"""The trajectory buffer's kernels: ``reference`` (torch, any device) and ``triton``, the same
functions with the same signatures (:data:`CONTRACT`); the tree-touching ones take the tree's
:class:`~gper.ops.state.TreeState` as ``state``."""

from __future__ import annotations

#: the functions every back end of this family provides
CONTRACT = ("stream_add", "sample_transitions", "gather_sequences", "stack_frames")
