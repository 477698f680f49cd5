"""Tests that need a real CUDA GPU (run on the device machine): no host syncs, CUDA-graph
capture with fresh samples per replay, large capacities, exactness at 2^25."""

from __future__ import annotations

import math

import pytest
import torch

import gper
from gper.bench.workload import SPEC, random_transitions
from gper.ops import reference

pytestmark = pytest.mark.gpu


def _batch(n: int) -> dict[str, torch.Tensor]:
    return random_transitions(n, "cuda")


def _filled(capacity: int, sampling: str = "proportional", **kw) -> gper.PrioritizedReplayBuffer:
    rb = gper.PrioritizedReplayBuffer(capacity, SPEC, device="cuda", sampling=sampling, **kw)
    chunk = 1 << 20
    for start in range(0, capacity, chunk):
        rb.add(_batch(min(chunk, capacity - start)))
    return rb


def _tree_error(rb: gper.PrioritizedReplayBuffer) -> float:
    """Largest relative difference between the stored tree and one rebuilt from its leaves."""
    tree, mintree = rb._tree.clone(), rb._mintree.clone()
    reference.rebuild(tree, mintree, rb._tree_layout)
    rel = (tree - rb._tree).abs() / tree.abs().clamp_min(1e-30)
    assert torch.equal(mintree, rb._mintree), "min tree differs from its rebuild"
    return float(rel.max())


@pytest.mark.parametrize("cuda_graphs", [True, False])
@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
def test_hot_path_never_syncs(sampling, cuda_graphs):
    rb = _filled(1 << 16, sampling=sampling, cuda_graphs=cuda_graphs)
    new = _batch(256)
    td = torch.randn(256, device="cuda")
    beta = torch.tensor(0.5, device="cuda")

    def calls():
        b = rb.sample(256, beta=beta)
        rb.update_priorities(b, td)
        rb.update_priorities(b.indices, td)
        rb.add(new)
        rb.sample(256, beta=0.7)

    for _ in range(2):  # compile kernels and capture graphs first: both may synchronise
        calls()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
def test_internal_graphs_match_direct_launches(sampling):
    torch.manual_seed(0)
    data = [_batch(3000) for _ in range(3)]
    tds = [torch.randn(512, device="cuda") for _ in range(4)]
    results = []
    for cuda_graphs in (True, False):
        rb = gper.PrioritizedReplayBuffer(
            5000, SPEC, device="cuda", sampling=sampling, cuda_graphs=cuda_graphs, rank_refresh_interval=2
        )
        got = []
        for i, td in enumerate(tds):
            rb.add(data[i % 3])
            b = rb.sample(512, beta=0.3 + 0.1 * i)
            rb.update_priorities(b, td)
            got += [b.indices, b.weights, b["obs"], b.generations, rb.priorities(b.indices)]
        got.append(rb._tree.clone())
        results.append(got)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_graph_replays_draw_fresh_samples_and_keep_tree_exact():
    rb = _filled(1 << 20)
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
    with torch.cuda.graph(g):
        step()
    seen = []
    for _ in range(5):
        g.replay()
        seen.append(out["idx"].clone())
    torch.cuda.synchronize()
    for a, b in zip(seen[:-1], seen[1:], strict=True):
        assert not torch.equal(a, b), "graph replays returned the same samples"
    assert _tree_error(rb) < 1e-5


def test_same_seed_same_samples_and_backends_agree():
    torch.manual_seed(0)
    data = _batch(5000)
    td = torch.randint(0, 8, (1024,), device="cuda").float()  # alpha=1, eps tiny: near-dyadic sums
    runs = {}
    for backend in ["triton", "torch", "triton"]:
        rb = gper.PrioritizedReplayBuffer(5000, SPEC, device="cuda", backend=backend, seed=7, alpha=1.0)
        rb.add(data)
        first = rb.sample(1024)
        rb.update_priorities(first, td)
        second = rb.sample(1024)
        runs.setdefault(backend, []).append((first.indices, second.indices, second.weights))
    (a1, a2, aw), (b1, b2, bw) = runs["triton"]
    assert torch.equal(a1, b1) and torch.equal(a2, b2) and torch.equal(aw, bw)
    t1, t2, tw = runs["torch"][0]
    assert torch.equal(a1, t1)
    assert (a2 == t2).float().mean() > 0.999
    torch.testing.assert_close(aw[a2 == t2], tw[a2 == t2], rtol=1e-5, atol=0)


@pytest.mark.parametrize("log2_capacity", [25, 26])
def test_every_leaf_reachable_at_2_25(log2_capacity):
    """The float32-threshold design leaves odd leaves of the upper half unreachable at 2^25."""
    n = 1 << log2_capacity
    rb = gper.PrioritizedReplayBuffer(n, {"x": ((), torch.uint8)}, device="cuda", seed=1)
    for _ in range(n >> 22):
        rb.add({"x": torch.zeros(1 << 22, dtype=torch.uint8, device="cuda")})
    hits = torch.zeros(n, dtype=torch.int32, device="cuda")
    draws = 2 * n
    for _ in range(draws // 16384):
        hits.index_add_(0, rb.sample(16384).indices, torch.ones(16384, dtype=torch.int32, device="cuda"))
    coverage = float((hits > 0).float().mean())
    assert abs(coverage - (1 - math.exp(-2))) < 1e-3, coverage
    upper_odd = hits[n // 2 + 1 :: 2]
    assert float((upper_odd > 0).float().mean()) > 0.86


def test_update_vs_rebuild_at_2_25_with_duplicates():
    rb = _filled(1 << 25)
    for _ in range(20):
        idx = torch.randint(0, 1 << 25, (16384,), device="cuda")
        idx[:2048] = idx[2048:4096]  # duplicates
        rb.update_priorities(idx, torch.randn(16384, device="cuda").abs() * 10)
    assert _tree_error(rb) < 1e-5
    b = rb.sample(16384)
    assert bool((rb.priorities(b.indices) > 0).all())


def test_tiny_leaf_probability_on_gpu():
    """A leaf 1e6 times smaller than its 31 siblings keeps its probability (3.2e-8 here).

    A float32 threshold quantises each node's mass to 2^-24 (6e-8) of its total, so it would
    give this leaf probability 0 or about twice too much; 1e10 draws tell those apart.
    """
    rb = gper.PrioritizedReplayBuffer(32, {"x": ((), torch.int32)}, device="cuda", alpha=1.0, eps=1e-12)
    rb.add({"x": torch.arange(32, dtype=torch.int32, device="cuda")})
    td = torch.ones(32, device="cuda")
    td[17] = 1e-6
    rb.update_priorities(torch.arange(32, device="cuda"), td)
    p = rb.priorities(torch.arange(32, device="cuda")).double()
    prob = float(p[17] / p.sum())
    hits = torch.zeros((), dtype=torch.int64, device="cuda")
    calls, b = 10_000, 1 << 20
    for _ in range(calls):
        hits += (rb.sample(b).indices == 17).sum()
    expected = prob * calls * b
    assert abs(int(hits) - expected) < 5 * math.sqrt(expected), (int(hits), expected)


def test_cpu_fallback_on_out_of_memory(monkeypatch):
    real = gper.PrioritizedReplayBuffer._allocate

    def fail_on_cuda(self, device):
        if device.type == "cuda":
            raise torch.OutOfMemoryError("simulated")
        return real(self, device)

    monkeypatch.setattr(gper.PrioritizedReplayBuffer, "_allocate", fail_on_cuda)
    with pytest.warns(gper.GperWarning, match="falling back to the CPU"):
        rb = gper.PrioritizedReplayBuffer(100, SPEC, device="cuda")
    assert rb.device.type == "cpu" and rb.backend == "torch"
    with pytest.raises(torch.OutOfMemoryError):
        gper.PrioritizedReplayBuffer(100, SPEC, device="cuda", cpu_fallback=False)


def test_invalid_indices_dropped_on_device_and_reported():
    rb = _filled(1000)
    before = rb.priorities(torch.arange(1000, device="cuda")).clone()
    rb.update_priorities(torch.tensor([5, 2000, -1], device="cuda"), torch.tensor([3.0, 1.0, 1.0], device="cuda"))
    with pytest.warns(gper.GperWarning, match="2 update entries"):
        st = rb.stats()
    assert st["invalid_indices"] == 2
    after = rb.priorities(torch.arange(1000, device="cuda"))
    changed = (after != before).nonzero().flatten().tolist()
    assert changed == [5]
    strict = _filled(1000, strict=True)
    with pytest.raises(IndexError):
        strict.update_priorities(torch.tensor([2000], device="cuda"), torch.ones(1, device="cuda"))


def test_held_batches_are_never_overwritten_by_later_samples():
    """Sample slots are reused only when nothing refers to their outputs any more."""
    rb = _filled(1 << 16)
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


@pytest.mark.parametrize(("capacity", "arity"), [(4096, 4), (1 << 16, 32), (1000, 8)])
def test_contended_updates_last_occurrence_wins_and_tree_stays_exact(capacity, arity):
    """Races show only on a real GPU: 16384 updates on a few thousand slots share leaves and
    parents at every level, many programs at once. The last occurrence must win and every node
    must stay the sum (and min) of its children."""
    rb = gper.PrioritizedReplayBuffer(capacity, {"x": ((), torch.int32)}, device="cuda", alpha=1.0, arity=arity)
    rb.add({"x": torch.arange(capacity, dtype=torch.int32, device="cuda")})
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(30):
        idx = torch.randint(0, capacity, (16384,), device="cuda", generator=gen)
        td = torch.arange(1, 16385, dtype=torch.float32, device="cuda")  # distinct: a wrong winner shows
        rb.update_priorities(idx, td)
        last = torch.full((capacity,), -1, dtype=torch.int64, device="cuda")
        last.scatter_reduce_(0, idx, torch.arange(16384, device="cuda"), reduce="amax")
        touched = (last >= 0).nonzero().flatten()
        expected = td[last[touched]] + rb.eps
        # exp2(log2(x)) on the GPU is within ~1e-6 of x; neighbouring td values differ by >= 6e-5
        torch.testing.assert_close(rb.priorities(touched), expected, rtol=1e-5, atol=0)
        assert _tree_error(rb) < 1e-5
    assert int((rb._owner != -1).sum()) == 0, "claims left behind"
    assert int(rb._counters[7]) == 0 and int(rb._counters[6]) == 0, "election tickets left behind"
