"""The population's Adam in one kernel per tensor (:mod:`gper.dqn.population_fused_adam`) against
its torch ops (:class:`~gper.dqn.population_adam.PopulationAdam` with ``backend="torch"``):
per-agent learning rates, the clipping's scale, the soft target update with one rate or one per
agent. Under the Triton interpreter on the CPU; the GPU suite's population tests run it on CUDA."""

from __future__ import annotations

import pytest
import torch

from gper.dqn.population_adam import PopulationAdam
from gper.dqn.population_fused_adam import population_adam_step
from helpers import TRITON_ON_CPU

pytestmark = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")

N = 3
SHAPES = [(N, 7, 5), (N, 7), (N, 2, 7)]  # a layer's weight and bias, the head's weight


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


@pytest.mark.parametrize("tau", [None, 0.01, "per agent"])
@pytest.mark.parametrize("scaled", [False, True])
def test_the_kernel_is_the_torch_ops(tau, scaled):
    fused, ref = _params(0), _params(0)
    tfused, tref = _params(1), _params(1)
    lr = [1e-3, 5e-3, 2e-2]
    a = PopulationAdam(fused, lr=lr, capturable=True, backend="triton")
    b = PopulationAdam(ref, lr=lr, capturable=True, backend="torch")
    assert a.fused and not b.fused
    rate = torch.tensor([0.01, 0.2, 0.7]) if tau == "per agent" else tau
    g = torch.Generator().manual_seed(2)
    for step in range(5):
        for p, q in zip(fused, ref, strict=True):
            p.grad = torch.randn(p.shape, generator=g) * 3
            q.grad = p.grad.clone()
        grad_before = [p.grad.clone() for p in fused]
        scale = torch.rand(N, generator=g) if scaled else None
        a.step(grad_scale=scale, targets=None if tau is None else tfused, tau=1.0 if rate is None else rate)
        b.step(grad_scale=scale, targets=None if tau is None else tref, tau=1.0 if rate is None else rate)
        assert all(torch.equal(p.grad, before) for p, before in zip(fused, grad_before, strict=True))  # read only
        assert torch.equal(a.steps, b.steps) and a.steps.tolist() == [step + 1.0] * N
        for x, y in zip(fused + tfused, ref + tref, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=5e-7)  # two roundings of one formula
        for x, y in zip(a.exp_avgs + a.exp_avg_sqs, b.exp_avgs + b.exp_avg_sqs, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)  # lerp against beta1 m + (1 - beta1) g
    if tau is None:
        assert all(torch.equal(t, u) for t, u in zip(tfused, _params(1), strict=True))  # untouched


def test_each_agent_moves_by_its_own_rate():
    params = [torch.zeros(N, 4)]
    params[0].grad = torch.ones(N, 4)
    adam = PopulationAdam(params, lr=[1e-3, 2e-3, 4e-3], capturable=True, backend="triton")
    adam.step()
    # Adam's first step moves every element by lr (m / sqrt(v) = 1 after the bias corrections)
    torch.testing.assert_close(params[0][:, 0], torch.tensor([-1e-3, -2e-3, -4e-3]), rtol=1e-5, atol=0)


def test_refusals():
    p = torch.zeros(N, 4)
    p.grad = torch.zeros(N, 4)
    with pytest.raises(ValueError, match="needs capturable=True"):
        PopulationAdam([p], lr=1e-3, backend="triton")
    with pytest.raises(ValueError, match="backend must be"):
        PopulationAdam([p], lr=1e-3, capturable=True, backend="cuda")
    steps, lr = torch.zeros(N), torch.full((N,), 1e-3, dtype=torch.float64)
    with pytest.raises(ValueError, match="lists of one length"):
        population_adam_step([p], [], [p], [p], steps, lr, beta1=0.9, beta2=0.999, eps=1e-8)
    with pytest.raises(ValueError, match=r"contiguous float32 \[3, ...\]"):
        population_adam_step([p.t()], [p.t()], [p.t()], [p.t()], steps, lr, beta1=0.9, beta2=0.999, eps=1e-8)
    with pytest.raises(ValueError, match="gradient, moments and target"):
        population_adam_step([p], [torch.zeros(N, 5)], [p], [p], steps, lr, beta1=0.9, beta2=0.999, eps=1e-8)
    assert steps.tolist() == [0.0] * N  # refused before the step counts advanced
