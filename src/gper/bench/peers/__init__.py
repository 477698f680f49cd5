"""The replay buffers gper is measured against, one module each, found by name and imported lazily.

Each module holds both of a peer's adapters: its timing adapter (for ``gper bench peers`` and,
for gper and the baselines, ``gper bench replay``) and its exactness sampler (for
``gper bench exactness``); :mod:`gper.bench.peers.base` says what a module provides. Importing
this package imports no peer library, and importing a peer's module imports none either:
TorchRL, cpprb and flashbax (``pip install ".[peers]"``) are loaded only when used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

#: registry name (as ``--peers`` takes it) -> module under ``gper.bench.peers``
MODULES: dict[str, str] = {
    "gper": "gper",
    "gper-stratified": "gper",
    "cumsum": "baselines",
    "multinomial": "baselines",
    "torchrl": "torchrl",
    "torchrl-td": "torchrl",
    "torchrl-fp64": "torchrl",
    "cpprb": "cpprb",
    "flashbax": "flashbax",
    "flashbax-x64": "flashbax",
    # the trajectory workload (n-step transitions from streams of steps)
    "gper-traj": "gper_traj",
    "torchrl-nstep": "torchrl_nstep",
    "torchrl-nstep-uniform": "torchrl_nstep",
    "flashbax-traj": "flashbax_traj",
}
#: names an older command line may still use
RENAMED = {"seeds": "cumsum"}


def canonical_name(name: str) -> str:
    """``name``, or its new name if it was renamed (``seeds`` -> ``cumsum``)."""
    return RENAMED.get(name, name)


def load(name: str) -> ModuleType:
    """The module of peer ``name`` (importing it imports no peer library)."""
    try:
        module = MODULES[canonical_name(name)]
    except KeyError:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(MODULES)}") from None
    return importlib.import_module(f"{__name__}.{module}")


def status(name: str, device: torch.device) -> tuple[bool, str]:
    """Whether peer ``name`` can run on ``device``, with its versions, or why it cannot."""
    return load(name).status(canonical_name(name), device)
