"""The checkpoint form of a buffer: its settings, its tensors by name, and the host's counts.

A state is checked whole before anything is copied, so a refused load leaves the buffer as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def check_state(state: object, config: dict[str, Any], tensors: Mapping[str, torch.Tensor]) -> tuple[int, Mapping]:
    """The ``(seed, host counts)`` of ``state``, after checking that it was saved by a buffer with
    ``config`` and holds every tensor of ``tensors`` with its shape and dtype.

    Raises:
        ValueError: naming the first thing that differs or is missing.
    """
    theirs = state.get("config") if isinstance(state, Mapping) else None
    if theirs != config:
        diff = sorted(k for k in config if not isinstance(theirs, Mapping) or theirs.get(k) != config[k])
        raise ValueError(f"load_state_dict(): configuration differs in {diff}")
    for name, dst in tensors.items():
        src = state.get(name)
        if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(f"load_state_dict(): {name!r} missing or of the wrong shape/dtype")
    host, seed = state.get("host"), state.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"load_state_dict(): 'seed' missing or invalid: {seed!r}")
    if not isinstance(host, Mapping) or not {"size", "updates_since_refresh"} <= host.keys():
        raise ValueError("load_state_dict(): 'host' missing or incomplete")
    return seed, host
