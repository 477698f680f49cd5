"""Hindsight relabelling's kernels: ``reference`` (torch, any device) and ``triton``, the same
functions with the same signatures (:data:`CONTRACT`)."""

from __future__ import annotations

#: the functions every back end of this family provides
CONTRACT = ("episode_index_add", "her_pick", "her_finish")
