"""Epsilon-greedy actions in one kernel (:mod:`gper.dqn.fused_act`) against the torch ops: the
stacked networks' forward, the argmax, the exploration rate and the coin flips. Under the Triton
interpreter on the CPU (IEEE FP32 matmuls); on CUDA in the GPU suite."""

from __future__ import annotations

import pytest
import torch

from gper.dqn.fused_act import epsilon_greedy, epsilon_greedy_reference, fused_act_supported
from gper.dqn.population_net import stacked_init
from helpers import TRITON_ON_CPU


def _runs_on(device: torch.device) -> None:
    if device.type == "cpu" and not TRITON_ON_CPU:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")


@pytest.mark.parametrize(
    "n_in,hidden,n_act,envs",
    [
        (4, (32, 48), 2, 5),  # cartpole-sized
        (8, (120, 84), 2, 10),  # PureJaxRL's network: widths that are no power of two
        (52, (256, 100), 45, 20),  # a first layer past 128 (blocks of 32 columns), two row blocks
    ],
)
def test_the_kernel_chooses_what_the_torch_ops_choose(device, n_in, hidden, n_act, envs):
    _runs_on(device)
    agents = 3
    net = stacked_init([1, 2, 3], n_in, n_act, hidden, device=device)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(agents, envs, n_in, generator=g).to(device)
    draws = torch.rand(agents, envs, 2, generator=g).to(device)
    f64 = lambda v: torch.tensor(v, dtype=torch.float64, device=device)  # noqa: E731
    # agent 0 mid-decay, agent 1 past it, agent 2 never exploring
    start, span, decay = f64([1.0, 0.6, 0.0]), f64([-0.95, -0.5, 0.0]), f64([40.0, 10.0, 5.0])
    params = [p.detach().contiguous() for p in net.parameters()]
    with torch.no_grad():
        q = net(obs, True)
    explored = 0
    for steps in (0.0, 20.0, 1000.0):
        env_steps = f64(steps)
        got = epsilon_greedy(params, obs, draws, env_steps, start, span, decay)
        want = epsilon_greedy_reference(q, draws, env_steps, start, span, decay)
        assert got.dtype == torch.int64 and got.shape == (agents, envs)
        top2 = q.topk(2, dim=2).values
        clear = (top2[..., 0] - top2[..., 1]) > 1e-4  # no near-tie the matmuls' rounding could flip
        assert clear.float().mean() > 0.9
        assert torch.equal(got[clear], want[clear]), steps
        explored += int((want != q.argmax(dim=2)).sum())
    assert explored > 0  # some random actions differed from the greedy ones


def test_a_random_action_covers_every_action_and_no_other(device):
    """draws[..., 1] picks floor(u * n_actions): every action, never n_actions (u just below 1)."""
    _runs_on(device)
    n_act, envs = 3, 60
    net = stacked_init([0], 4, n_act, (16, 16), device=device)
    params = [p.detach().contiguous() for p in net.parameters()]
    draws = torch.zeros(1, envs, 2, device=device)
    draws[0, :, 1] = torch.linspace(0, 1 - 2**-24, envs)
    one = torch.ones(1, dtype=torch.float64, device=device)
    got = epsilon_greedy(params, torch.zeros(1, envs, 4, device=device), draws, one[0], one, one * 0, one)
    assert sorted(set(got.flatten().tolist())) == [0, 1, 2]


def test_what_the_kernel_serves_and_refuses():
    assert fused_act_supported(4, (256, 256), 2) and fused_act_supported(52, (256, 256), 45)
    assert not fused_act_supported(52, (512, 512), 45)  # the market preset's: the torch ops
    assert not fused_act_supported(4, (64,), 2) and not fused_act_supported(4, (64, 64, 64), 2)
    assert not fused_act_supported(4, (1024, 64), 2) and not fused_act_supported(200, (64, 64), 2)
    if not TRITON_ON_CPU:
        return
    net = stacked_init([0], 4, 2, (16, 16))
    params = [p.detach().contiguous() for p in net.parameters()]
    one = torch.ones(1, dtype=torch.float64)
    obs, draws = torch.zeros(1, 3, 4), torch.zeros(1, 3, 2)
    with pytest.raises(ValueError, match="precision"):
        epsilon_greedy(params, obs, draws, one[0], one, one, one, precision="bf16")
    with pytest.raises(ValueError, match="draws"):
        epsilon_greedy(params, obs, torch.zeros(1, 3, 3), one[0], one, one, one)
    with pytest.raises(ValueError, match="contiguous float32"):
        epsilon_greedy([params[0].double(), *params[1:]], obs, draws, one[0], one, one, one)
