"""When the Triton back end cannot work on a device, a buffer that chose it by itself warns once
and runs the torch back end on the same device (the same samples); one that asked for it raises.
When memory runs out after construction, the error says so and what was being done."""

from __future__ import annotations

import warnings

import pytest
import torch

import gper
from gper.ops import probe
from gper.replay import checks, graphs
from gper.replay.batch import FlatSample
from helpers import TRITON_ON_CPU, assert_unchanged, snapshot

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}


@pytest.fixture
def fresh_probe():
    probe.forget()
    checks._TRITON_WARNED.clear()
    yield
    probe.forget()
    checks._TRITON_WARNED.clear()


class _Broken:
    """Stands in for a Triton kernel that fails to compile (as ``kernel[grid](...)`` would)."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("PTX .version 9.9 does not support .target sm_999")

        return launch


def _fill(rb):
    k = torch.arange(40, device=rb.device)
    rb.add({"obs": torch.stack([k * 1.0] * 3, 1), "action": k})
    rb.update_priorities(k, (k % 7).float())
    return rb


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
def test_the_probe_passes_where_triton_works_and_names_what_fails(fresh_probe, monkeypatch):
    cpu = torch.device("cpu")
    assert probe.triton_problem(cpu) is None
    from gper.ops.tree import triton as tree_triton

    monkeypatch.setattr(tree_triton, "_sample_kernel", _Broken())
    assert probe.triton_problem(cpu) is None, "the outcome is kept per device and process"
    probe.forget()
    assert probe.triton_problem(cpu) == "RuntimeError: PTX .version 9.9 does not support .target sm_999"
    with pytest.raises(RuntimeError, match="backend='triton' does not work on cpu: RuntimeError: PTX"):
        gper.PrioritizedReplayBuffer(8, SPEC, device="cpu", backend="triton")


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
def test_the_probe_catches_kernels_that_run_but_disagree(fresh_probe, monkeypatch):
    from gper.ops.tree import triton as tree_triton

    real = tree_triton.sample

    def off_by_one(**kw):
        real(**kw)
        kw["out"].idx.add_(1).clamp_(max=39)

    monkeypatch.setattr(tree_triton, "sample", off_by_one)
    assert probe.triton_problem(torch.device("cpu")) == "its idx differ from the torch back end's"


@pytest.mark.gpu
def test_auto_falls_back_to_torch_on_the_same_gpu_and_warns_once(fresh_probe, monkeypatch):
    from gper.ops.tree import triton as tree_triton

    monkeypatch.setattr(tree_triton, "_update_claim", _Broken())
    with pytest.warns(checks.GperWarning, match=r"Triton back end does not work on cuda:0 \(RuntimeError: PTX"):
        rb = gper.PrioritizedReplayBuffer(40, SPEC, device="cuda", seed=3)
    assert rb.backend == "torch" and rb.device == torch.device("cuda", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per device and process
        again = gper.PrioritizedReplayBuffer(40, SPEC, device="cuda", seed=3)
    assert again.backend == "torch"
    twin = gper.PrioritizedReplayBuffer(40, SPEC, device="cuda", seed=3, backend="torch")
    _fill(rb), _fill(twin)
    for _ in range(3):
        a, b = rb.sample(64), twin.sample(64)
        assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
        assert torch.equal(a["obs"], b["obs"])
    with pytest.raises(RuntimeError, match="backend='triton' does not work on cuda:0"):
        gper.PrioritizedReplayBuffer(40, SPEC, device="cuda", backend="triton")


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_running_out_of_memory_for_a_new_batch_size_says_so_and_changes_nothing(device, monkeypatch):
    rb = _fill(gper.PrioritizedReplayBuffer(40, SPEC, device=device))
    rb.sample(8)
    before = snapshot(rb)
    monkeypatch.setattr(FlatSample, "empty", _out_of_memory)
    with pytest.raises(torch.OutOfMemoryError, match=f"gper: out of memory on {rb.device} drawing a batch of 4096"):
        rb.sample(4096)
    assert_unchanged(rb, before)


@pytest.mark.gpu
def test_a_capture_that_runs_out_of_memory_leaves_the_call_uncaptured(monkeypatch):
    rb = _fill(gper.PrioritizedReplayBuffer(40, SPEC, device="cuda", seed=1))
    twin = _fill(gper.PrioritizedReplayBuffer(40, SPEC, device="cuda", seed=1, cuda_graphs=False))

    def no_memory(graph, pool=None, stream=None):
        raise torch.OutOfMemoryError("CUDA out of memory (capture)")

    monkeypatch.setattr(graphs, "capture", no_memory)
    with pytest.warns(checks.GperWarning, match="out of GPU memory capturing"):
        a = rb.sample(16)
    b = twin.sample(16)
    assert torch.equal(a.indices, b.indices)
    for _ in range(2):
        assert torch.equal(rb.sample(16).indices, twin.sample(16).indices)
