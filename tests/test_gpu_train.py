"""The trainer on a real GPU: no host synchronisation inside an epoch, graphs that capture and
replay, and a short training that writes its run folder. Marked ``gpu``: run on the device machine."""

from __future__ import annotations

import pytest
import torch

from gper.dqn import Config, setup, train

pytestmark = pytest.mark.gpu

SMALL = dict(device="cuda", total_steps=20_000, learning_starts=512, batch_size=256, buffer_size=4096, progress=False)


@pytest.mark.parametrize("env", ["cartpole", "market"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_training_steps_never_sync(env, graphs):
    from gper.training.timing import PhaseTimer

    cfg, agent, _ = setup(Config(env=env, cuda_graphs=graphs, num_envs=8, hidden=(64, 64), **SMALL))
    for _ in range(80):  # fill past learning_starts; warm up and capture both steps
        agent.collect.run()
    for _ in range(5):
        agent.learn.run()
    assert agent.collect.captured == graphs and agent.learn.captured == graphs
    timer = PhaseTimer(agent.device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(20):
            agent.collect.run(timer if i % 5 == 0 else None)
            agent.learn.run(timer if i % 5 == 0 else None)
            agent.sync_target()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.isfinite(agent.sums).all() and agent.counters[1].item() == 25
    assert set(timer.summary()) == {"collect", "per_sample", "upload", "fwd_bwd", "adam", "per_update"}


def test_graph_replays_train_the_network():
    cfg, agent, _ = setup(Config(env="market", num_envs=16, hidden=(64, 64), **SMALL))
    for _ in range(64):
        agent.collect.run()
    before = [p.detach().clone() for p in agent.qnet.parameters()]
    target_before = [p.detach().clone() for p in agent.target.parameters()]
    for _ in range(10):
        agent.learn.run()
    torch.cuda.synchronize()
    assert agent.learn.captured
    assert all(not torch.equal(a, p) for a, p in zip(before, agent.qnet.parameters(), strict=True))
    # soft target updates run inside the graph
    assert all(not torch.equal(a, p) for a, p in zip(target_before, agent.target.parameters(), strict=True))
    assert agent.counters[1].item() == 10 and torch.isfinite(agent.sums).all()


def test_one_graph_step_matches_eager_steps():
    """The one-graph learn step (priority update on a side stream alongside Adam, batch fields read
    in place from the sampled rows) computes what the eager phases compute, step for step."""
    cfg, eager, _ = setup(Config(env="market", num_envs=16, hidden=(64, 64), cuda_graphs=False, **SMALL))
    for _ in range(64):
        eager.collect.run()
    _, graphed, _ = setup(Config(env="market", num_envs=16, hidden=(64, 64), cuda_graphs=True, **SMALL))
    graphed.load_state_dict(eager.state_dict())
    for _ in range(12):  # 3 eager warm-up steps, then the capture and its replays
        eager.learn.run()
        graphed.learn.run()
    torch.cuda.synchronize()
    assert graphed.learn.captured and not eager.learn.captured
    slots = torch.arange(len(eager.rb), device="cuda")  # the filled ones (the rest read as NaN)
    torch.testing.assert_close(graphed.rb.priorities(slots), eager.rb.priorities(slots))
    for a, b in zip(graphed.qnet.parameters(), eager.qnet.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(graphed.beta_t, eager.beta_t)
    torch.testing.assert_close(graphed.counters, eager.counters)
    assert graphed.rb.stats()["max_priority"] == pytest.approx(eager.rb.stats()["max_priority"])


def test_short_gpu_training(tmp_path):
    lines = []
    results = train(Config(env="cartpole", run_dir=str(tmp_path), **SMALL), log=lines.append)
    assert results.device.startswith("cuda") and results.env_steps == 20_000
    assert any(line.startswith("GPU phase timing (") for line in lines)
    assert any(" busy " in line for line in lines)
    assert (tmp_path / results.run_dir.split("/")[-1] / "plot.png").exists()
