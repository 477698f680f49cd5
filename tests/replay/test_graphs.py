"""The buffer's own CUDA graphs.

The sample-slot reuse rule, checked on the CPU: a slot is free only when nothing outside it
refers to its outputs (Python references, views of them, tensors saved by autograd). On CUDA:
graphed and eager calls give the same results, a caller's own graph of buffer calls draws fresh
samples on every replay, held batches are never overwritten, and the graph cache's replays.
"""

from __future__ import annotations

import pytest
import torch

import gper
from gper.replay.graphs import BufferGraphs, GraphCache, SampleSlot, capture
from helpers import WIDE_SPEC, filled_wide_buffer, tree_error, wide_transitions


def _slot() -> SampleSlot:
    flat = torch.zeros(64)
    tensors = {"rows": flat[:48].view(8, 6), "weights": flat[56:], "obs": flat[:48].view(8, 6)[:, :4]}
    return SampleSlot(None, flat, tensors)


def test_fresh_slot_is_free():
    assert _slot().free()


def test_holding_an_output_makes_the_slot_busy_until_released():
    slot = _slot()
    held = slot.tensors["obs"]
    assert not slot.free()
    del held
    assert slot.free()


def test_a_new_view_of_an_output_makes_the_slot_busy():
    slot = _slot()
    view = slot.tensors["rows"][:, 2]
    assert not slot.free()
    del view
    assert slot.free()


def test_a_batch_like_holder_makes_the_slot_busy():
    slot = _slot()
    holder = dict(slot.tensors)
    assert not slot.free()
    holder.clear()
    assert slot.free()


def test_a_tensor_saved_by_autograd_makes_the_slot_busy():
    slot = _slot()
    w = torch.ones(4, requires_grad=True)
    loss = (slot.tensors["obs"] * w).sum()
    assert not slot.free()
    loss.backward()
    del loss
    assert slot.free()


def test_disabled_graphs_run_the_body_directly():
    graphs = BufferGraphs(enabled=False)
    assert not graphs.active
    args = (torch.arange(3),)
    result, replayed = graphs.call("key", args, lambda x: x * 2, by_address=True)
    assert result.tolist() == [0, 2, 4] and replayed is False


def test_a_cpu_buffer_captures_nothing():
    rb = gper.PrioritizedReplayBuffer(8, WIDE_SPEC, device="cpu")
    rb.add(wide_transitions(8, "cpu"))
    a, b = rb.sample(4), rb.sample(4)
    assert a.indices.data_ptr() != b.indices.data_ptr(), "every eager sample returns new tensors"


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
def test_internal_graphs_match_direct_launches(sampling):
    torch.manual_seed(0)
    data = [wide_transitions(3000, "cuda") for _ in range(3)]
    tds = [torch.randn(512, device="cuda") for _ in range(4)]
    results = []
    for cuda_graphs in (True, False):
        rb = gper.PrioritizedReplayBuffer(
            5000, WIDE_SPEC, device="cuda", sampling=sampling, cuda_graphs=cuda_graphs, rank_refresh_interval=2
        )
        got = []
        for i, td in enumerate(tds):
            rb.add(data[i % 3])
            b = rb.sample(512, beta=0.3 + 0.1 * i)
            rb.update_priorities(b, td)
            got += [b.indices, b.weights, b["obs"], b.generations, rb.priorities(b.indices)]
        got.append(rb.tree.tree.clone())
        results.append(got)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_graph_replays_draw_fresh_samples_and_keep_tree_exact():
    rb = filled_wide_buffer(1 << 20)
    td = torch.rand(4096, device="cuda") * 3
    out = {}

    def step():
        b = rb.sample(4096)
        rb.update_priorities(b, td)
        out["idx"] = b.indices

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with capture(g):  # as users should capture around gper calls (gc paused)
        step()
    seen = []
    for _ in range(5):
        g.replay()
        seen.append(out["idx"].clone())
    torch.cuda.synchronize()
    for a, b in zip(seen[:-1], seen[1:], strict=True):
        assert not torch.equal(a, b), "graph replays returned the same samples"
    assert tree_error(rb.tree) < 1e-5


@pytest.mark.gpu
def test_held_batches_are_never_overwritten_by_later_samples():
    """Sample slots are reused only when nothing refers to their outputs any more."""
    rb = filled_wide_buffer(1 << 16)
    td = torch.rand(512, device="cuda")
    kept_batch = rb.sample(512)
    kept_obs = rb.sample(512)["obs"]
    kept_view = rb.sample(512)["next_obs"][:, :5]
    kept_weights = rb.sample(512).weights
    snapshots = [
        {k: v.clone() for k, v in kept_batch.items()} | {"indices": kept_batch.indices.clone()},
        kept_obs.clone(),
        kept_view.clone(),
        kept_weights.clone(),
    ]
    for _ in range(10):
        b = rb.sample(512, beta=0.9)
        rb.update_priorities(b, td)
    torch.cuda.synchronize()
    for k, v in snapshots[0].items():
        now = kept_batch.indices if k == "indices" else kept_batch[k]
        assert torch.equal(now, v), k
    assert torch.equal(kept_obs, snapshots[1])
    assert torch.equal(kept_view, snapshots[2])
    assert torch.equal(kept_weights, snapshots[3])


@pytest.mark.gpu
def test_graph_cache_replays_with_new_inputs_copied_in():
    """``run`` runs the first call eagerly (then captures it); later calls replay on copies of their inputs."""
    cache = GraphCache(size=2)
    x = torch.arange(4.0, device="cuda")
    first, replayed = cache.run("double", (x,), lambda a: a * 2)
    assert replayed is False and first.tolist() == [0.0, 2.0, 4.0, 6.0]
    second, replayed = cache.run("double", (x + 10,), lambda a: a * 2)
    assert replayed is True and second.tolist() == [20.0, 22.0, 24.0, 26.0]
    # by address: captured the second time the same tensors are seen, then replayed in place
    y = torch.ones(3, device="cuda")
    outs = [cache.run_by_address("inc", (y,), lambda a: a + 1) for _ in range(3)]
    assert [r for _, r in outs] == [False, False, True]
    y.fill_(5.0)
    out, replayed = cache.run_by_address("inc", (y,), lambda a: a + 1)
    assert replayed and out.tolist() == [6.0] * 3, "the graph reads the caller's tensor where it is"
