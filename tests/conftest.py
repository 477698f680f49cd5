"""Shared test setup: run the Triton kernels under the interpreter on CPU-only machines, the
back-end and device parametrizations, and the ``gpu`` marker.

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


#: devices a test runs on through the ``device`` fixture: the CPU always, CUDA as a ``gpu`` test
DEVICE_PARAMS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICE_PARAMS)
def device(request) -> torch.device:
    """The device a test runs on: ``cpu``, and ``cuda`` (marked ``gpu``, so skipped without a GPU).

    On CUDA the buffer picks the Triton back end by itself; on the CPU, the torch one."""
    return torch.device(request.param)


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
