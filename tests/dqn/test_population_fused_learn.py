"""The population's learn step in one kernel (:mod:`gper.dqn.population_fused_learn`) against the torch
ops it replaces: :func:`~gper.dqn.population_loss.population_loss`, the gradients by autograd,
:func:`~gper.dqn.population_loss.clip_scales` and :class:`~gper.dqn.population_adam.PopulationAdam`
(torch back end) with the soft target update. Under the Triton interpreter on the CPU (IEEE FP32
matmuls); the GPU suite runs it on CUDA."""

from __future__ import annotations

import pytest
import torch

import gper.dqn.population_fused_learn as fused_learn
from gper.dqn.population_adam import PopulationAdam, soft_update_
from gper.dqn.population_fused_learn import fused_learn_supported, population_learn_step
from gper.dqn.population_loss import clip_scales, population_loss
from gper.dqn.population_net import StackedQNetwork, stacked_init
from helpers import TRITON_ON_CPU

needs_interpreter = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")

N, B = 3, 45  # a batch that is not a whole number of the kernel's chunks


def _runs_on(device: torch.device) -> None:
    """Skip on the CPU without the Triton interpreter (on CUDA the kernel runs compiled)."""
    if device.type == "cpu" and not TRITON_ON_CPU:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")


def _batch(n_in: int, n_act: int, seed: int, row_width: int | None = None, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    width = row_width or n_in
    rows = torch.randn(N, B, 2, width, generator=g)  # obs and next_obs side by side, as sampled rows are
    x, nx = rows[:, :, 0, :n_in], rows[:, :, 1, :n_in]
    action = torch.randint(0, n_act, (N, B), generator=g)
    reward = torch.randn(N, B, generator=g)
    done = (torch.rand(N, B, generator=g) < 0.2).float()
    weights = torch.rand(N, B, generator=g) + 0.1
    return tuple(t.to(device) for t in (x, nx, action, reward, done, weights))


def _population(n_in, hidden, n_act, device="cpu"):
    online = stacked_init([5, 6, 7], n_in, n_act, hidden, device=device)
    target = online.detached_copy()
    with torch.no_grad():  # a target apart from the online networks, as after some steps
        for p in target.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return online, target


def _reference(online, target, adam, batch, *, gamma, double_q, max_norm, tau, loss):
    x, nx, action, reward, done, weights = batch
    sums = torch.zeros(N, 3, dtype=torch.float64, device=x.device)
    adam.zero_grad()
    total, _, td = population_loss(
        online, target, x, nx, action, reward, done, weights,
        gamma=gamma, double_q=double_q, sums=sums, batched=True, loss=loss,
    )  # fmt: skip
    total.backward()
    grads = [p.grad for p in online.parameters()]
    scale = clip_scales(grads, max_norm)[0] if max_norm > 0 else None
    adam.step(grad_scale=scale)
    if tau is not None:
        soft_update_(target, online, tau.tolist() if isinstance(tau, torch.Tensor) else tau)
    return td, sums


@pytest.mark.parametrize(
    "n_in, hidden, n_act, double_q, max_norm, tau, gamma, loss",
    [
        (4, (24, 20), 2, True, 10.0, None, 0.99, "huber"),  # cartpole-like: double-Q, clipped, hard target
        (4, (24, 20), 3, False, 0.0, 0.05, 0.9, "huber"),  # max over the target, no clipping, soft target
        (12, (40, 17), 5, True, 0.05, "per agent", "per agent", "huber"),  # clipping that bites; rates per agent
        (16, (128, 128), 16, True, 1.0, 0.5, 0.95, "huber"),  # the widest the kernel holds
        (4, (24, 20), 2, False, 0.0, None, 0.99, "mse"),  # PureJaxRL's step: max-Q target, squared error
        (12, (40, 17), 5, True, 0.05, 0.05, 0.9, "mse"),  # the squared error with clipping that bites
    ],
)
@pytest.mark.parametrize("rows", [32, 64], ids=["32-rows", "64-rows"])
def test_the_kernel_is_the_torch_step(device, n_in, hidden, n_act, double_q, max_norm, tau, gamma, loss, rows):
    _runs_on(device)
    _check_against_torch(device, n_in, hidden, n_act, double_q, max_norm, tau, gamma, loss, rows)


def _check_against_torch(device, n_in, hidden, n_act, double_q, max_norm, tau, gamma, loss="huber", rows=None):
    assert fused_learn_supported(n_in, hidden, n_act)
    online, target = _population(n_in, hidden, n_act, device)
    ref_online, ref_target = online.detached_copy().requires_grad_(True), target.detached_copy()
    lr = [1e-3, 3e-3, 1e-2]
    adam = PopulationAdam(list(online.parameters()), lr=lr, capturable=True, backend="triton")
    ref_adam = PopulationAdam(list(ref_online.parameters()), lr=lr, capturable=True, backend="torch")
    rate = torch.tensor([0.01, 0.2, 0.7], device=device) if tau == "per agent" else tau
    discount = torch.tensor([0.9, 0.95, 0.99], device=device) if gamma == "per agent" else gamma
    sums = torch.zeros(N, 3, dtype=torch.float64, device=device)
    ref_sums = torch.zeros(N, 3, dtype=torch.float64, device=device)
    for step in range(3):
        batch = _batch(n_in, n_act, seed=step, row_width=n_in + 4, device=device)
        td = torch.full((N, B), float("nan"), device=device)
        population_learn_step(
            list(online.parameters()), list(target.parameters()), adam.exp_avgs, adam.exp_avg_sqs, adam.steps,
            adam.device_lr, *batch, sums, td,
            gamma=discount, double_q=double_q, max_grad_norm=max_norm, soft_tau=rate, loss=loss, rows=rows,
        )  # fmt: skip
        ref_td, step_sums = _reference(
            ref_online, ref_target, ref_adam, batch,
            gamma=discount.view(-1, 1) if isinstance(discount, torch.Tensor) else discount,
            double_q=double_q, max_norm=max_norm, tau=rate, loss=loss,
        )  # fmt: skip
        ref_sums += step_sums
        torch.testing.assert_close(td, ref_td, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-4, atol=1e-6)  # sums over 128 units in two orders
        assert adam.steps.tolist() == [step + 1.0] * N
        for name, a, b in (("online", online, ref_online), ("target", target, ref_target)):
            for p, q in zip(a.parameters(), b.parameters(), strict=True):
                # Adam divides by sqrt(v): where a gradient is near 0, its sum in another order moves the
                # parameter by a visible share of lr (seen: 4.6e-5 of a 1e-2 step on an H100, one element
                # in 49,152); 1e-4 is a hundredth of the largest lr's step, a wrong kernel moves many by ~lr
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
        for m, r in zip(adam.exp_avgs + adam.exp_avg_sqs, ref_adam.exp_avgs + ref_adam.exp_avg_sqs, strict=True):
            torch.testing.assert_close(m, r, rtol=1e-4, atol=1e-7)  # near-zero gradients: summation order
        # the next step from the kernel's state on both sides: each step checked alone, no drift carried
        with torch.no_grad():
            for a, b in ((online, ref_online), (target, ref_target)):
                torch._foreach_copy_(list(b.parameters()), list(a.parameters()))
            torch._foreach_copy_(ref_adam.exp_avgs + ref_adam.exp_avg_sqs, adam.exp_avgs + adam.exp_avg_sqs)


def test_a_hard_target_is_only_read(device):
    _runs_on(device)
    online, target = _population(4, (24, 20), 2, device)
    before = [p.clone() for p in target.parameters()]
    adam = PopulationAdam(list(online.parameters()), lr=1e-3, capturable=True, backend="triton")
    sums, td = torch.zeros(N, 3, dtype=torch.float64, device=device), torch.zeros(N, B, device=device)
    population_learn_step(
        list(online.parameters()), list(target.parameters()), adam.exp_avgs, adam.exp_avg_sqs, adam.steps,
        adam.device_lr, *_batch(4, 2, seed=0, device=device), sums, td,
        gamma=0.99, double_q=True, max_grad_norm=10.0, soft_tau=None,
    )  # fmt: skip
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), before, strict=True))
    assert not any(torch.equal(p, q) for p, q in zip(online.parameters(), before, strict=True))


@needs_interpreter
def test_what_the_kernel_does_not_hold():
    assert not fused_learn_supported(4, (256, 256), 2)
    assert not fused_learn_supported(4, (64,), 2)
    assert not fused_learn_supported(4, (64, 64, 64), 2)
    assert not fused_learn_supported(200, (64, 64), 2)
    online = StackedQNetwork(N, 4, 2, (256, 64))
    target = online.detached_copy()
    adam = PopulationAdam(list(online.parameters()), lr=1e-3, capturable=True, backend="triton")
    with pytest.raises(ValueError, match="rows must be a power of two"):
        population_learn_step(
            list(online.parameters()), list(target.parameters()), adam.exp_avgs, adam.exp_avg_sqs, adam.steps,
            adam.lr, *_batch(4, 2, seed=0), torch.zeros(N, 3, dtype=torch.float64), torch.zeros(N, B),
            gamma=0.99, double_q=True, max_grad_norm=10.0, soft_tau=None, rows=48,
        )  # fmt: skip
    with pytest.raises(ValueError, match="widths up to"):
        population_learn_step(
            list(online.parameters()), list(target.parameters()), adam.exp_avgs, adam.exp_avg_sqs, adam.steps,
            adam.lr, *_batch(4, 2, seed=0), torch.zeros(N, 3, dtype=torch.float64), torch.zeros(N, B),
            gamma=0.99, double_q=True, max_grad_norm=10.0, soft_tau=None,
        )  # fmt: skip


def test_the_wide_chunk_serves_grids_that_fill_the_gpu(device):
    """32 rows a program while the grid is small, 64 once the 64-row grid still fills every multiprocessor."""
    rule = fused_learn.block_rows
    if device.type == "cpu":
        assert rule(256, 256, device) == fused_learn.BLOCK_B == 32
        return
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    assert rule(1, 128, device) == 32 and rule(sms, 64, device) == 64 and rule(sms - 1, 64, device) == 32
    assert rule((sms + 1) // 2, 128, device) == 64 and rule(256, 128, device) == 64


def _trained(fused: bool, iterations: int, device: str = "cpu", **changes):
    """A population of three agents after ``iterations`` collect steps (and a learn step each once
    past learning_starts), learning through the kernel or through the torch ops. Actions are always
    random (epsilon 1), so every such population collects the same transitions from its seed."""
    from gper.dqn import Config
    from gper.dqn.config import resolve
    from gper.dqn.population_agent import PopulationAgent
    from gper.dqn.sweep import agent_configs

    config = Config(
        env="cartpole", seed=3, device=device, total_steps=2000, learning_starts=64, batch_size=40,
        buffer_size=500, hidden=(32, 24), num_envs=8, eps_start=1.0, eps_end=1.0, save=False,
        backend="triton", precision="fp32", **changes,
    )  # fmt: skip
    cfg = resolve(config, torch.device(device))
    # built and run one after the other: both draw from torch's default generator
    learner = PopulationAgent(agent_configs(cfg, N), torch.device(device), 1000, exact=False, fused_learn=fused)
    step = 0
    for it in range(iterations):
        learner.collect_step(None)
        if (it + 1) * cfg.num_envs > cfg.learning_starts:
            step += 1
            learner.learn_step(step, None)
    return learner


@needs_interpreter
@pytest.mark.parametrize(
    "changes", [{}, {"tau": 0.1, "max_grad_norm": 0.0}, {"loss": "mse"}], ids=["hard-clipped", "soft", "mse"]
)
def test_a_population_learns_through_the_kernel_as_through_the_torch_ops(changes):
    fused, ref = _trained(True, 8 + 12, **changes), _trained(False, 8 + 12, **changes)
    assert fused.fused_learn and list(fused.learn.phases) == ["per_sample", "upload", "learn", "per_update"]
    assert not ref.fused_learn and "fwd_bwd" in ref.learn.phases
    assert torch.equal(fused.counters, ref.counters) and fused.adam.steps.tolist() == [12.0] * N
    torch.testing.assert_close(fused.sums, ref.sums, rtol=1e-5, atol=1e-6)
    for a, b in zip([*fused.qnet.parameters(), *fused.target.parameters()],
                    [*ref.qnet.parameters(), *ref.target.parameters()], strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the priorities written from the kernel's TD errors: the same trees
    torch.testing.assert_close(fused.rb.state_dict()["tree"], ref.rb.state_dict()["tree"], rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "changes", [{}, {"tau": 0.1, "max_grad_norm": 0.0}, {"loss": "mse"}], ids=["hard-clipped", "soft", "mse"]
)
def test_on_cuda_in_graphs_the_kernel_learns_as_the_torch_ops(changes):
    fused, ref = _trained(True, 8 + 30, "cuda", **changes), _trained(False, 8 + 30, "cuda", **changes)
    assert fused.learn.use_graphs and ref.learn.use_graphs and fused.fused_learn and not ref.fused_learn
    torch.testing.assert_close(fused.sums, ref.sums, rtol=1e-4, atol=1e-5)
    for a, b in zip([*fused.qnet.parameters(), *fused.target.parameters()],
                    [*ref.qnet.parameters(), *ref.target.parameters()], strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
