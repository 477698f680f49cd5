"""``fused_step``: the network's fused forward (:class:`gper.dqn.network.LinearReLU`) and the agent's
learn step with the fused pieces, against the step without them."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import gper
from gper.dqn import Agent, Config, FixedBatch, QNetwork, padded_width, replay_spec, resolve, train
from gper.dqn.network import LinearReLU
from gper.training.runlog import read_metrics
from helpers import TRITON_ON_CPU

CPU = torch.device("cpu")
OBS, ACTIONS, BATCH = 4, 3, 32


def test_linear_relu_gradcheck_and_the_fused_forward_is_the_forward():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(LinearReLU.apply, (x, w, b))
    torch.manual_seed(1)
    net = QNetwork(6, 3, (16, 8))
    twin = copy.deepcopy(net)
    obs = torch.randn(20, 6)
    out, fused = net(obs), twin.fused_forward(obs)
    assert torch.equal(out, fused)
    out.square().sum().backward()
    fused.square().sum().backward()
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        assert torch.equal(net(obs), twin.fused_forward(obs))


def _fields(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, padded_width(OBS), generator=g),
        "next_obs": torch.randn(n, padded_width(OBS), generator=g),
        "action": torch.randint(0, ACTIONS, (n,), generator=g),
        "reward": torch.randn(n, generator=g),
        "done": (torch.rand(n, generator=g) < 0.2).float(),
    }


def _learner(fused: bool, backend: str, fixed: bool, **change) -> Agent:
    settings = dict(env="cartpole", device="cpu", total_steps=10_000, num_envs=1, learning_starts=BATCH)
    settings |= dict(batch_size=BATCH, buffer_size=256, hidden=(16, 16), epoch_steps=100, backend=backend)
    cfg = resolve(Config(**settings | change, fused_step=fused), CPU)
    rb = gper.PrioritizedReplayBuffer(256, replay_spec(padded_width(OBS)), device=CPU, seed=0, backend=backend)
    rb.add(_fields(256, seed=1))
    weights = torch.rand(BATCH, generator=torch.Generator().manual_seed(3)) + 0.5
    batch = FixedBatch(_fields(BATCH, 2), weights)
    torch.manual_seed(0)
    source = (lambda: batch) if fixed else None
    return Agent.for_learning(OBS, ACTIONS, cfg, rb, total_train_steps=100, batch_source=source)


BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not TRITON_ON_CPU, reason="TRITON_INTERPRET"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "change", [{}, dict(tau=0.1, max_grad_norm=0.0), dict(double_q=False), dict(loss="mse")], ids=str
)
def test_the_fused_learn_step_is_the_learn_step(backend, change):
    """Drawn from the replay (priorities updated from the TD errors) and from a fixed batch with IS
    weights: parameters, target, optimizer state, priorities and sums after a few steps. The torch
    kernels are the unfused step's arithmetic bit for bit; Triton's differ by float32 rounding."""
    for fixed in (False, True):
        plain, fused = _learner(False, backend, fixed, **change), _learner(True, backend, fixed, **change)
        for _ in range(4):
            plain.learn.run()
            fused.learn.run()
        tol = dict(atol=0, rtol=0) if backend == "torch" else dict(atol=1e-6, rtol=1e-5)
        for net in ("qnet", "target"):
            for p, q in zip(getattr(fused, net).parameters(), getattr(plain, net).parameters(), strict=True):
                torch.testing.assert_close(p, q, **tol)
        slots = torch.arange(256)
        torch.testing.assert_close(fused.rb.priorities(slots), plain.rb.priorities(slots), **tol)
        torch.testing.assert_close(fused.learn_state.td, plain.learn_state.td, **tol)
        # float32 means summed in another order: a few ulp of the loss (the squared error's is ~2)
        torch.testing.assert_close(fused.sums, plain.sums, atol=1e-6, rtol=1e-5)
        a, b = fused.optimizer.state_dict()["state"], plain.optimizer.state_dict()["state"]
        assert a.keys() == b.keys() and all(torch.equal(a[k]["step"], b[k]["step"]) for k in a)
        assert fused.counters[1].item() == plain.counters[1].item() == 4


@pytest.mark.parametrize("n_step", [1, 3], ids=["flat-replay", "trajectory-replay"])
def test_fused_step_trains_cartpole_like_the_plain_step(tmp_path, smoke, one_thread, n_step):
    """The whole loop with ``--fused-step`` (collection, epochs, checkpoints): the same losses and
    returns, with 1-step targets from the flat replay and n-step ones from the trajectory replay."""
    runs = {}
    for fused in (False, True):
        cfg = Config(**smoke, n_step=n_step, fused_step=fused, run_dir=str(tmp_path), run_name=f"fused-{fused}")
        results = train(cfg)
        rows = read_metrics(tmp_path / f"fused-{fused}" / "metrics.jsonl")
        runs[fused] = (results, [r["losses/td_loss"] for r in rows if "losses/td_loss" in r])
    (plain, plain_losses), (fused, fused_losses) = runs[False], runs[True]
    assert fused.train_steps == plain.train_steps == 100 and len(fused_losses) == len(plain_losses) > 0
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(plain_losses), atol=1e-6, rtol=1e-5)
    assert fused.mean_return_last100 == plain.mean_return_last100
    assert json.loads((tmp_path / "fused-True" / "config.json").read_text())["fused_step"] is True
