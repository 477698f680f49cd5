"""The pixel networks of a population (:class:`~gper.dqn.pixel_net.NatureQNetworks`): N agents as
one network of grouped convolutions and batched matmuls must compute, for each agent, what its
own :class:`~gper.dqn.pixel_net.NatureQNetwork` computes: Q-values, gradients and clipping."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gper.dqn.pixel_net import NatureQNetwork, NatureQNetworks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _nets(n: int, dueling: bool, device: str) -> list[NatureQNetwork]:
    nets = []
    for i in range(n):
        torch.manual_seed(10 + i)
        nets.append(NatureQNetwork(4, 6, hidden=32, dueling=dueling).to(device))
    return nets


def _frames(n: int, b: int, device: str) -> torch.Tensor:
    return torch.randint(0, 256, (n, b, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).to(
        device
    )


#: grouped and single convolutions may take different algorithms (summation orders); fp32 throughout
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _full_fp32():
    """No TF32 on GPUs: cuDNN's convolutions take it by default, and its rounding (~1e-3 of a weight
    gradient summed over a batch of frames) would hide a wrong row behind a loose tolerance."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dueling", [False, True])
def test_each_agents_q_values_and_gradients_are_its_own_networks(device, dueling):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    nets = _nets(3, dueling, device)
    together = NatureQNetworks(copy.deepcopy(nets)).to(device)
    frames = _frames(3, 5, device)
    q = together(frames)
    assert q.shape == (3, 5, 6)
    weights = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1)).to(device)
    (q * weights).sum().backward()
    for i, net in enumerate(nets):
        want = net(frames[i])
        torch.testing.assert_close(q[i], want, **TOL)
        (want * weights[i]).sum().backward()
        mine = together.network(i)  # its weights, unchanged by the backward
        for a, b in zip(mine.parameters(), net.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the gradients: agent i's rows of each stacked parameter are its own network's gradient
    for i, net in enumerate(nets):
        convs = [m for m in together.features if isinstance(m, nn.Conv2d)]
        own = [m for m in net.features if isinstance(m, nn.Conv2d)]
        for group, conv in zip(convs, own, strict=True):
            rows = slice(i * conv.out_channels, (i + 1) * conv.out_channels)
            torch.testing.assert_close(group.weight.grad[rows], conv.weight.grad, **TOL)
            torch.testing.assert_close(group.bias.grad[rows], conv.bias.grad, **TOL)
        heads = [(together.head, net.head)] + ([(together.value, net.value)] if dueling else [])
        for mine, own in heads:
            for stacked, layer in ((mine.w1, own[0].weight), (mine.b1, own[0].bias), (mine.w2, own[2].weight)):
                torch.testing.assert_close(stacked.grad[i], layer.grad, **TOL)
            torch.testing.assert_close(mine.b2.grad[i], own[2].bias.grad, **TOL)


def test_each_agents_gradient_is_clipped_on_its_own():
    nets = _nets(3, False, "cpu")
    together = NatureQNetworks(copy.deepcopy(nets))
    frames = _frames(3, 4, "cpu")
    scale = torch.tensor([1e-3, 1.0, 1e3])  # one agent's norm far under the limit, one far over
    (together(frames).sum(dim=(1, 2)) * scale).sum().backward()
    for i, net in enumerate(nets):
        (net(frames[i]).sum() * scale[i]).backward()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    together.clip_grad_norm_(1.0)
    for i, net in enumerate(nets):
        grads = [p.grad for p in net.parameters()]
        stacked = list(together.parameters())
        mine = [p.grad.unflatten(0, (3, -1))[i].reshape(g.shape) for p, g in zip(stacked, grads, strict=True)]
        for a, b in zip(mine, grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    norms = [torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in net.parameters()])) for net in nets]
    assert norms[0] < 0.5 and abs(norms[2] - 1.0) < 1e-4  # the small one untouched, the large one at the limit


def test_frames_of_the_wrong_shape_are_refused():
    together = NatureQNetworks(_nets(2, False, "cpu"))
    with pytest.raises(ValueError, match=r"frames must be \[2, B, 4, H, W\]"):
        together(torch.zeros(3, 1, 4, 84, 84, dtype=torch.uint8))


@pytest.mark.gpu
def test_a_population_learns_under_bf16_autocast():
    """``--precision bf16``: the forward under autocast and its backward (the heads' matmuls in bf16,
    the parameters' gradients in float32)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    together = NatureQNetworks(_nets(2, True, "cuda")).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q = together(_frames(2, 4, "cuda"))
    q.float().square().sum().backward()
    assert q.shape == (2, 4, 6) and all(p.grad.dtype == torch.float32 for p in together.parameters())
    assert all(torch.isfinite(p.grad).all() for p in together.parameters())


def test_reading_an_agents_network_leaves_the_generator_alone():
    together = NatureQNetworks(_nets(2, False, "cpu"))
    state = torch.random.get_rng_state()
    together.network(1)
    assert torch.equal(torch.random.get_rng_state(), state)  # on the CPU it also draws exploration
    with pytest.raises(IndexError, match="agent 2 of a population of 2"):
        together.network(2)
