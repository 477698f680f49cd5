"""Adam with the soft target update in one kernel per tensor (:func:`gper.dqn.fused_adam.adam_step`)
against ``torch.optim.Adam`` followed by ``_foreach_lerp_``, the trainer's unfused update."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gper.dqn.fused_adam import adam_state, adam_step
from helpers import TRITON_ON_CPU

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not TRITON_ON_CPU, reason="TRITON_INTERPRET"))]


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    # tensors of 1, 1023, 1025 and 33 x 31 elements: one program, a partial one, a row-major matrix
    return nn.ParameterList(
        [nn.Parameter(torch.randn(n)) for n in (1, 1023, 1025)] + [nn.Parameter(torch.randn(33, 31))]
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tau", [0.25, None])
def test_adam_step_is_torch_adam_then_lerp(backend, tau):
    net, ref = _net(0), _net(0)
    target, ref_target = copy.deepcopy(net).requires_grad_(False), copy.deepcopy(ref).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=3e-2, betas=(0.8, 0.99), eps=1e-6)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=3e-2, betas=(0.8, 0.99), eps=1e-6)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        grads = [torch.randn(p.shape, generator=g) * 0.1 for p in net.parameters()]
        for p, q, gr in zip(net.parameters(), ref.parameters(), grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        ref_opt.step()
        if tau is not None:
            torch._foreach_lerp_(list(ref_target.parameters()), list(ref.parameters()), tau)
        params, m, v, steps = adam_state(opt)
        adam_step(
            params, [p.grad for p in params], m, v, steps, lr=3e-2, beta1=0.8, beta2=0.99, eps=1e-6,
            targets=list(target.parameters()) if tau is not None else None, tau=tau or 1.0, backend=backend,
        )  # fmt: skip
    # the torch path is torch's own arithmetic on the CPU; Triton computes beta^step as exp2 and fuses
    # multiply-adds, a few float32 ulp of the moves (lr 3e-2 on weights near 1)
    tol = dict(atol=0, rtol=0) if backend == "torch" else dict(atol=1e-6, rtol=1e-5)
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, **tol)
    for a, b in zip(target.parameters(), ref_target.parameters(), strict=True):
        torch.testing.assert_close(a, b, **tol)
    state, ref_state = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert state.keys() == ref_state.keys()
    for k in state:
        assert state[k].keys() == ref_state[k].keys() and torch.equal(state[k]["step"], ref_state[k]["step"])
        torch.testing.assert_close(state[k]["exp_avg_sq"], ref_state[k]["exp_avg_sq"], **tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shared_step_count_advances_once(backend):
    p = [torch.zeros(5), torch.zeros(7)]
    step = torch.zeros(())
    adam_step(
        p, [torch.ones(5), torch.ones(7)], [torch.zeros(5), torch.zeros(7)], [torch.zeros(5), torch.zeros(7)],
        [step, step], lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, backend=backend,
    )  # fmt: skip
    assert step.item() == 1
    # Adam's first step moves each weight by lr (sign of the gradient)
    torch.testing.assert_close(torch.cat(p), torch.full((12,), -0.1), atol=1e-6, rtol=0)


def test_unsupported_settings_are_refused():
    with pytest.raises(ValueError, match="weight_decay"):
        adam_state(torch.optim.Adam(_net(0).parameters(), weight_decay=0.1))
    with pytest.raises(ValueError, match="one length"):
        adam_step([torch.zeros(2)], [], [], [], [], lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    if TRITON_ON_CPU:
        with pytest.raises(ValueError, match="contiguous float32"):
            z = torch.zeros(4, 4).t()
            adam_step([z], [z], [z], [z], [torch.zeros(())], lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, backend="triton")
