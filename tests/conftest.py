"""Shared test setup: run the Triton kernels under the interpreter on CPU-only machines, the
back-end parametrization, and the ``gpu`` marker.

The interpreter must be switched on before anything imports Triton (``triton.jit`` reads
``TRITON_INTERPRET`` when a kernel is decorated), so this module sets it first; importing torch
to ask about CUDA is safe because torch does not import Triton.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from helpers import TRITON_ON_CPU  # noqa: E402

#: back ends the CPU tests run on: torch always, Triton when its kernels can run on CPU tensors
BACKEND_PARAMS = [
    pytest.param("torch", id="torch"),
    pytest.param(
        "triton",
        id="triton",
        marks=pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton on CPU tensors needs triton and TRITON_INTERPRET=1"),
    ),
]


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> str:
    """Back end name, "torch" or "triton" (interpreted: every tensor stays on the CPU)."""
    return request.param


@pytest.fixture
def ops(backend):
    """The kernel module of ``backend`` (:mod:`gper.ops.reference` or :mod:`gper.ops.triton_ops`)."""
    from gper.ops import backend_module

    return backend_module(backend)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
