"""Input that is legal but hostile: tensors that require grad, slices of the buffer's own storage,
every supported dtype, beta tensors out of range or requiring grad. The buffer stores exactly
what it was given and never joins the caller's autograd graph."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

import gper
from gper.replay.storage import DTYPES
from helpers import assert_unchanged, snapshot

SPEC = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}


def _buffer(device, capacity=16, **kw):
    return gper.PrioritizedReplayBuffer(capacity, SPEC, device=device, **kw)


@pytest.mark.parametrize("graphs", [True, False])
def test_add_of_tensors_that_require_grad_stores_values_not_a_graph(device, graphs):
    rb = _buffer(device, cuda_graphs=graphs)
    net = torch.nn.Linear(3, 4).to(device)
    refs = []
    for step in range(4):  # on CUDA, later adds replay the buffer's captured add
        x = torch.randn(5, 3, device=device)
        out = net(x)  # requires grad, with a graph back to the network's weights
        refs.append(weakref.ref(out))
        slots = rb.add({"obs": out, "action": torch.arange(5, device=device)})
        assert torch.equal(rb.storage["obs"][slots], out.detach()), f"add {step} stored other values"
        del out
    gc.collect()
    assert all(r() is None for r in refs), "the buffer keeps added tensors (and their graphs) alive"
    for t in [rb.rows.rows, *rb.storage.values()]:
        assert not t.requires_grad and t.grad_fn is None
    batch = rb.sample(8)
    assert not batch["obs"].requires_grad and not batch.weights.requires_grad


@pytest.mark.parametrize("graphs", [True, False])
def test_add_of_a_slice_of_the_buffers_own_storage_copies_it_first(device, graphs):
    rb = _buffer(device, capacity=16, cuda_graphs=graphs)
    k = torch.arange(16, device=device)
    rb.add({"obs": torch.stack([k * 1.0] * 4, 1), "action": k})
    rb.add({"obs": rb.storage["obs"][:3].clone(), "action": k[:3]})  # cursor now at 3
    for start in (0, 5):
        # rows [start, start + 10) written at the cursor: the source and target overlap
        src = {name: view[start : start + 10] for name, view in rb.storage.items()}
        want = src["obs"].clone(), src["action"].clone()
        slots = rb.add(src)
        assert torch.equal(rb.storage["obs"][slots], want[0]), f"overlapping add from {start} corrupted the data"
        assert torch.equal(rb.storage["action"][slots], want[1])


def test_every_supported_dtype_round_trips(device):
    spec = {f"f_{str(d).removeprefix('torch.')}": ((3,), d) for d in DTYPES}
    rb = gper.PrioritizedReplayBuffer(8, spec, device=device)
    g = torch.Generator().manual_seed(0)
    data = {}
    for name, (shape, d) in spec.items():
        x = torch.randn(5, *shape, generator=g) * 50
        data[name] = (x > 0) if d == torch.bool else x.to(d)
    for step in range(3):
        slots = rb.add({k: v.to(device) for k, v in data.items()})
        batch = rb.sample(16)
        for name in spec:
            assert torch.equal(rb.storage[name][slots].cpu(), data[name]), f"{name}, add {step}"
            assert torch.equal(batch[name], rb.storage[name][batch.indices]), f"{name}, sample {step}"


@pytest.mark.parametrize("beta", [1.5, -0.5, float("nan"), float("inf")])
def test_an_out_of_range_beta_tensor_is_refused_on_the_cpu(beta):
    rb = _buffer("cpu")
    rb.add({"obs": torch.ones(4, 4), "action": torch.arange(4)})
    before = snapshot(rb)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        rb.sample(2, beta=torch.tensor(beta))
    assert_unchanged(rb, before)


@pytest.mark.gpu
@pytest.mark.parametrize("beta, like", [(1.5, 1.0), (-0.5, 0.0), (float("nan"), 1.0)])
def test_an_out_of_range_beta_tensor_is_clamped_on_the_gpu(beta, like):
    """On a GPU checking the value would cost a host sync: the kernel clamps it instead."""
    rb = _buffer("cuda", capacity=64)
    k = torch.arange(64, device="cuda")
    rb.add({"obs": torch.ones(64, 4, device="cuda"), "action": k})
    rb.update_priorities(k, k.float())
    a = rb.sample(32, beta=torch.tensor(beta, device="cuda"))
    twin = _buffer("cuda", capacity=64)
    twin.add({"obs": torch.ones(64, 4, device="cuda"), "action": k})
    twin.update_priorities(k, k.float())
    b = twin.sample(32, beta=like)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
    copy.deepcopy(rb)  # the buffer's beta scalar holds the clamped value: its state still restores
    for _ in range(2):  # also through the buffer's own graphs, whose beta is the scalar
        rb.sample(32, beta=torch.tensor(beta, device="cuda"))
    copy.deepcopy(rb)


@pytest.mark.gpu
def test_assigning_beta_keeps_the_buffers_graphs_and_alpha_recaptures(monkeypatch):
    """beta is read from a device scalar, so its graphs stay; alpha was captured, so they go."""
    from gper.replay import graphs

    captures = []
    real = graphs.capture

    def counting(graph, pool=None, stream=None):
        captures.append(1)
        return real(graph, pool, stream)

    monkeypatch.setattr(graphs, "capture", counting)
    rb = _buffer("cuda", capacity=64)
    rb.add({"obs": torch.ones(64, 4, device="cuda"), "action": torch.arange(64, device="cuda")})
    for _ in range(3):
        rb.sample(32)
    n = len(captures)
    for step in range(5):
        rb.beta = 0.4 + 0.1 * step
        rb.sample(32)
    assert len(captures) == n, "assigning beta recaptured"
    rb.alpha = 0.3
    rb.sample(32)
    assert len(captures) > n, "alpha changed and the old graphs were kept"


def test_a_beta_tensor_that_requires_grad_keeps_the_buffer_out_of_autograd(device):
    for graphs in (True, False):
        rb = _buffer(device, cuda_graphs=graphs)
        rb.add({"obs": torch.ones(4, 4, device=device), "action": torch.arange(4, device=device)})
        rb.update_priorities(torch.arange(4, device=device), torch.tensor([1.0, 2.0, 3.0, 4.0], device=device))
        beta = torch.tensor(0.5, device=device, requires_grad=True)
        for _ in range(3):
            batch = rb.sample(4, beta=beta * 1.0)
            assert not batch.weights.requires_grad and batch.weights.grad_fn is None
        assert not rb.tree.scalars.requires_grad
