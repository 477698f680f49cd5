"""Shared test setup: run the Triton kernels under the interpreter on CPU-only machines, the
back-end and device parametrizations, and the ``gpu`` marker.

The interpreter must be switched on before anything imports Triton (``triton.jit`` reads
``TRITON_INTERPRET`` when a kernel is decorated), so this module sets it first; importing torch
to ask about CUDA is safe because torch does not import Triton.
"""

from __future__ import annotations

import os

# deterministic cuBLAS, read when its first handle is made: without it GPU runs that must match bit
# for bit (a resumed run against the whole one) differed in 4 of 24 tries on a GPU shared by 8
# processes, with it in none (benchmarks/results/gpu-determinism-nvidia-h200-20261204-5853393.md)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from gper._triton import HAS_TRITON  # noqa: E402
from helpers import TRITON_ON_CPU  # noqa: E402

#: back ends a test runs on: torch always; Triton where its kernels can run (see :func:`backend`)
BACKEND_PARAMS = [pytest.param("torch", id="torch"), pytest.param("triton", id="triton")]


def _triton_runs(request) -> bool:
    """Triton runs compiled on CUDA tensors (a test that also takes ``device``, on ``cuda``), and
    on CPU tensors only under the interpreter."""
    if "device" in request.fixturenames and request.getfixturevalue("device").type == "cuda":
        return HAS_TRITON
    return TRITON_ON_CPU


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> str:
    """Back end name, "torch" or "triton".

    Without the ``device`` fixture every tensor stays on the CPU and Triton runs interpreted (skipped
    without triton or ``TRITON_INTERPRET=1``); with it, on ``cuda``, both back ends run on the GPU.
    """
    if request.param == "triton" and not _triton_runs(request):
        pytest.skip("Triton needs triton, and on CPU tensors TRITON_INTERPRET=1")
    return request.param


#: devices a test runs on through the ``device`` fixture: the CPU always, CUDA as a ``gpu`` test
DEVICE_PARAMS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICE_PARAMS)
def device(request) -> torch.device:
    """The device a test runs on: ``cpu``, and ``cuda`` (marked ``gpu``, so skipped without a GPU).

    On CUDA the buffer picks the Triton back end by itself; on the CPU, the torch one. A test that
    takes ``backend`` too runs each back end on each device."""
    return torch.device(request.param)


@pytest.fixture
def ops(backend):
    """The kernel module of ``backend`` (:mod:`gper.ops.tree.reference` or :mod:`gper.ops.tree.triton`)."""
    from gper.ops import kernels

    return kernels("tree", backend)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
