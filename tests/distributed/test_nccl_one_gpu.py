"""The sharded buffer over NCCL at world size 1, on one GPU: the collectives inside a CUDA graph,
no host sync per step, and the same draws from a graph as from eager calls (``gpu`` tests: the
CPU suite checks the math on gloo with 2, 3 and 4 processes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from spawn import free_port

pytestmark = pytest.mark.gpu

SPEC = {"who": ((1,), torch.int64), "obs": ((51,), torch.float32)}
CAPACITY, FILLED, B = 4096, 3000, 512


@pytest.fixture(scope="module")
def nccl_group():
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("needs CUDA and NCCL")
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
        device_id=torch.device("cuda", 0),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def build(mode: str, sampling: str = "proportional", weight_norm: str = "global"):
    from gper.distributed import ShardedPrioritizedReplayBuffer

    rb = ShardedPrioritizedReplayBuffer(
        CAPACITY, SPEC, mode=mode, sampling=sampling, weight_norm=weight_norm, device="cuda", seed=3
    )
    g = torch.Generator(device="cuda").manual_seed(5)
    who = torch.arange(FILLED, device="cuda")[:, None]
    rb.add({"who": who, "obs": torch.randn(FILLED, 51, device="cuda", generator=g) + who})
    rb.shard.update_priorities(torch.arange(FILLED, device="cuda"), torch.rand(FILLED, device="cuda", generator=g))
    return rb


def td_of(indices: torch.Tensor) -> torch.Tensor:
    return (indices % 7).float() * 0.3 + 0.05


def make_step(rb, record: list | None = None, static: dict | None = None):
    def step():
        batch = rb.sample(B)
        if static is not None:  # a graph's outputs: copied into tensors that outlive the capture
            for name in ("indices", "weights"):
                static[name].copy_(getattr(batch, name))
            static["who"].copy_(batch["who"][:, 0])
        if record is not None:
            record.append((batch.indices.clone(), batch.weights.clone(), batch["who"][:, 0].clone()))
        rb.update_priorities(batch, td_of(batch.indices))

    return step


@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("sampling", ["proportional", "stratified"])
def test_graph_replays_draw_what_eager_calls_draw(nccl_group, mode, sampling):
    """Two buffers built alike: one stepped eagerly, one from a captured graph (all-gather,
    reduce-scatter and all-reduce inside it) draw the same slots and weights step for step, and
    end with the same priorities."""
    from gper.bench import capture_graph

    eager_rb, graph_rb = build(mode, sampling), build(mode, sampling)
    warmup, steps = 3, 6
    eager: list = []
    step = make_step(eager_rb, eager)
    for _ in range(warmup + steps):
        step()
    static = {
        "indices": torch.empty(B, dtype=torch.int64, device="cuda"),
        "weights": torch.empty(B, device="cuda"),
        "who": torch.empty(B, dtype=torch.int64, device="cuda"),
    }
    graph = capture_graph(make_step(graph_rb, static=static), warmup=warmup)
    try:
        for i in range(steps):
            graph.replay()
            indices, weights, who = eager[warmup + i]
            assert torch.equal(static["indices"], indices), (mode, i)
            assert torch.equal(static["weights"], weights), (mode, i)
            # each row is its slot's row, moved through the collectives bit for bit
            assert torch.equal(static["who"], static["indices"])
        torch.cuda.synchronize()
        assert torch.equal(graph_rb.shard.tree.leaves(), eager_rb.shard.tree.leaves())
    finally:
        graph.reset()


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_weights_are_one_buffer_closed_form(nccl_group, mode):
    """At world size 1 either mode is one buffer: weights (p_i / p_min) ** -beta over the stored items."""
    rb = build(mode)
    leaves = rb.shard.tree.leaves()[:FILLED].double()
    batch = rb.sample(B, beta=0.7)
    p = rb.shard.tree.leaves()[batch.indices].double()
    expected = (p / leaves.min()) ** -0.7
    torch.testing.assert_close(batch.weights.double(), expected, rtol=2e-6, atol=0)
    assert torch.equal(batch["who"][:, 0], batch.indices)
    assert bool((batch.indices < FILLED).all())


@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("weight_norm", ["global", "batch"])
def test_eager_steps_never_sync(nccl_group, mode, weight_norm):
    rb = build(mode, weight_norm=weight_norm)
    step = make_step(rb)
    step()  # the first sample reads the shards' sizes once (the buffer is then known non-empty)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            step()
            rb.add(
                {"who": torch.zeros(8, 1, dtype=torch.int64, device="cuda"), "obs": torch.zeros(8, 51, device="cuda")}
            )
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
