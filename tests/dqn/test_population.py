"""A population of N agents (:mod:`gper.dqn.population`) against N single agents computed apart:
forward, loss, gradients, clipping, Adam and target updates bit for bit on the CPU (``torch.equal``)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gper.dqn.fused_adam import adam_state, adam_step
from gper.dqn.fused_loss import td_loss
from gper.dqn.network import QNetwork
from gper.dqn.population import (
    PopulationAdam,
    StackedQNetwork,
    clip_grad_norms_,
    hard_update_,
    population_loss,
    population_td_loss,
    soft_update_,
    stacked_init,
)

#: (obs_dim, hidden, n_actions, batch): odd sizes, so each agent's slice of a stacked tensor starts
#: off the vector width; and a wider one whose GEMMs take MKL's blocked kernels
SHAPES = [(5, (7, 9), 3, 13), (52, (64,), 45, 37)]


def _singles(n: int, obs_dim: int, hidden, n_actions: int, seed: int = 10) -> list[QNetwork]:
    nets = []
    for i in range(n):
        torch.manual_seed(seed + i)
        nets.append(QNetwork(obs_dim, n_actions, hidden))
    return nets


def _batch(n: int, b: int, obs_dim: int, n_actions: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(n, b, obs_dim, generator=g),
        "next_x": torch.randn(n, b, obs_dim, generator=g),
        "action": torch.randint(0, n_actions, (n, b), generator=g),
        "reward": torch.randn(n, b, generator=g) * 3,
        "done": (torch.rand(n, b, generator=g) < 0.3).float(),
        "weights": torch.rand(n, b, generator=g) + 0.5,
    }


def _single_loss(qnet, target, batch, i, gamma=0.99, double_q=True, loss="huber"):
    """Agent._fwd_bwd's loss for agent i's batch (flat replay), in its own words; the observations
    fresh tensors, as a single agent's batch (aligned)."""
    x, next_x, action = batch["x"][i].clone(), batch["next_x"][i].clone(), batch["action"][i]
    q = qnet(x).float().gather(1, action.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_target = target(next_x).float()
        if double_q:
            next_q = next_target.gather(1, qnet(next_x).argmax(dim=1, keepdim=True)).squeeze(1)
        else:
            next_q = next_target.max(dim=1).values
        y = batch["reward"][i] + gamma * (1.0 - batch["done"][i]) * next_q
    each = F.huber_loss(q, y, reduction="none", delta=1.0) if loss == "huber" else (q - y) ** 2
    return (each * batch["weights"][i]).mean(), (q - y).detach()


def _assert_agents_equal(stacked: StackedQNetwork, nets: list[QNetwork], grads: bool = False) -> None:
    for i, net in enumerate(nets):
        for k, (p, q) in enumerate(zip(stacked.parameters(), net.parameters(), strict=True)):
            assert torch.equal(p[i], q), f"agent {i}, parameter {k}: {(p[i] - q).abs().max().item()}"
            if grads:
                assert torch.equal(p.grad[i], q.grad), f"agent {i}, gradient {k}"


# ---- the network


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward_are_the_single_networks(n, shape):
    obs_dim, hidden, n_actions, b = shape
    nets = _singles(n, obs_dim, hidden, n_actions)
    stacked = StackedQNetwork.from_networks(nets)
    x = torch.randn(n, b, obs_dim)
    out = stacked(x)
    grad = torch.randn(n, b, n_actions)
    out.backward(grad)
    for i, net in enumerate(nets):
        # a fresh tensor, as a single agent's batch: with obs_dim 5 agent 1's slice is misaligned
        ref = net(x[i].clone())
        assert torch.equal(out[i], ref), f"agent {i} forward"
        assert torch.equal(out[i], net.fused_forward(x[i].clone())), f"agent {i} against fused_forward"
        ref.backward(grad[i])
    _assert_agents_equal(stacked, nets, grads=True)


def test_batched_forward_agrees_to_rounding():
    nets = _singles(3, 52, (64,), 45)
    stacked = StackedQNetwork.from_networks(nets)
    x = torch.randn(3, 37, 52)
    torch.testing.assert_close(stacked(x, batched=True), stacked(x, batched=False), rtol=1e-5, atol=1e-5)


def test_agent_round_trip_draws_nothing():
    nets = _singles(3, 5, (7, 9), 3)
    stacked = StackedQNetwork.from_networks(nets)
    state = torch.random.get_rng_state()
    agents = [stacked.agent(i) for i in range(3)]
    assert torch.equal(state, torch.random.get_rng_state()), "agent() drew from torch's generator"
    for net, agent in zip(nets, agents, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(net.parameters(), agent.parameters(), strict=True))
    agents[1].net[0].weight.data.add_(1.0)  # a copy: the population keeps its own
    assert torch.equal(stacked.layers[0].weight[1], nets[1].net[0].weight)
    stacked.load_agent(2, nets[0])
    assert torch.equal(stacked.layers[-1].bias[2], nets[0].net[-1].bias)


def test_stacked_init_is_each_seed_network():
    calls = []
    stacked = stacked_init([4, 5, 6], 5, 3, (7, 9), before_network=lambda s: calls.append(torch.rand(3)))
    assert len(calls) == 3
    for i, seed in enumerate([4, 5, 6]):
        torch.manual_seed(seed)
        torch.rand(3)  # the draws before_network made
        ref = QNetwork(5, 3, (7, 9))
        assert all(torch.equal(p[i], q) for p, q in zip(stacked.parameters(), ref.parameters(), strict=True))


def test_stacked_init_matches_a_single_runs_setup():
    # a single run's network, from gper.dqn.build.setup itself, and the population's agent with
    # the environment's draws replayed by building the same environment
    from gper.dqn import Config
    from gper.dqn.build import setup
    from gper.dqn.config import resolve
    from gper.dqn.network import padded_width
    from gper.training.environment import build_env

    settings = dict(env="cartpole", device="cpu", total_steps=600, learning_starts=200, batch_size=32)
    settings |= dict(buffer_size=1000, epoch_steps=200, hidden=(16,), progress=False)
    singles = [setup(Config(seed=seed, **settings), log=lambda line: None)[1].qnet for seed in (3, 4)]
    cfgs = {seed: resolve(Config(seed=seed, **settings), torch.device("cpu")) for seed in (3, 4)}
    width = padded_width(4)
    stacked = stacked_init(
        [3, 4], width, 2, (16,), before_network=lambda seed: build_env(cfgs[seed], torch.device("cpu")).close()
    )
    _assert_agents_equal(stacked, singles)
    plain = stacked_init([3, 4], width, 2, (16,))  # without the environment's draws: another network
    assert not torch.equal(plain.layers[0].weight[0], singles[0].net[0].weight)


def test_network_refusals():
    nets = _singles(2, 5, (7,), 3)
    stacked = StackedQNetwork.from_networks(nets)
    with pytest.raises(ValueError, match=r"x must be \[n_agents=2, B, obs_dim=5\], got \(3, 4, 5\)"):
        stacked(torch.zeros(3, 4, 5))
    with pytest.raises(ValueError, match=r"obs_dim=5"):
        stacked(torch.zeros(2, 4, 6))
    with pytest.raises(ValueError, match="float32"):
        stacked(torch.zeros(2, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="one architecture"):
        StackedQNetwork.from_networks([QNetwork(5, 3, (7,)), QNetwork(5, 3, (8,))])
    with pytest.raises(ValueError, match="at least one"):
        StackedQNetwork.from_networks([])
    with pytest.raises(ValueError, match="the network is"):
        stacked.load_agent(0, QNetwork(5, 3, (8,)))
    with pytest.raises(IndexError, match="out of range for a population of 2"):
        stacked.agent(2)
    with pytest.raises(ValueError, match="hidden"):
        StackedQNetwork(2, 5, 3, ())


# ---- the loss


@pytest.mark.parametrize("loss", ["huber", "mse"])
@pytest.mark.parametrize("double_q", [True, False])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("shape", SHAPES)
def test_loss_td_and_gradients_are_the_single_agents(n, shape, double_q, loss):
    obs_dim, hidden, n_actions, b = shape
    nets = _singles(n, obs_dim, hidden, n_actions)
    targets = _singles(n, obs_dim, hidden, n_actions, seed=50)
    stacked, stacked_target = StackedQNetwork.from_networks(nets), StackedQNetwork.from_networks(targets)
    batch = _batch(n, b, obs_dim, n_actions)
    sums = torch.zeros(n, 3, dtype=torch.float64)
    total, losses, td = population_loss(
        stacked, stacked_target, batch["x"], batch["next_x"], batch["action"], batch["reward"], batch["done"],
        batch["weights"], gamma=0.99, double_q=double_q, sums=sums, loss=loss,
    )  # fmt: skip
    total.backward()
    for i in range(n):
        single, ref_td = _single_loss(nets[i], targets[i], batch, i, double_q=double_q, loss=loss)
        single.backward()
        assert torch.equal(losses[i], single.detach()), f"agent {i} loss"
        assert torch.equal(td[i], ref_td), f"agent {i} TD errors"
        ref_sums = torch.zeros(3, dtype=torch.float64)
        x, next_x = batch["x"][i].clone(), batch["next_x"][i].clone()
        td_loss(
            nets[i](x), nets[i](next_x) if double_q else None, targets[i](next_x),
            batch["action"][i], batch["reward"][i], batch["done"][i], batch["weights"][i],
            gamma=0.99, sums=ref_sums, backend="torch", loss=loss,
        )  # fmt: skip
        assert torch.equal(sums[i], ref_sums), f"agent {i} sums"
    _assert_agents_equal(stacked, nets, grads=True)


def test_trajectory_discount_is_the_fused_losss():
    n, b, a = 3, 13, 4
    g = torch.Generator().manual_seed(3)
    q = torch.randn(n, b, a, generator=g, requires_grad=True)
    qn, qt = torch.randn(n, b, a, generator=g), torch.randn(n, b, a, generator=g)
    action, reward = torch.randint(0, a, (n, b), generator=g), torch.randn(n, b, generator=g)
    discount, weights = torch.rand(n, b, generator=g), torch.rand(n, b, generator=g)
    total, losses, td = population_td_loss(q, qn, qt, action, reward, discount, weights)
    total.backward()
    for i in range(n):
        qi = q.detach()[i].clone().requires_grad_(True)
        loss, ref_td = td_loss(qi, qn[i], qt[i], action[i], reward[i], discount[i], weights[i], backend="torch")
        loss.backward()
        assert torch.equal(losses[i], loss.detach()) and torch.equal(td[i], ref_td), f"agent {i}"
        assert torch.equal(q.grad[i], qi.grad), f"agent {i} gradient"


def test_loss_refusals():
    q = torch.zeros(2, 4, 3)
    ok = dict(action=torch.zeros(2, 4, dtype=torch.int64), reward=torch.zeros(2, 4), discount=torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"action must be \[N=2, B=4\] torch.int64, got \(2, 4\) torch.int32"):
        population_td_loss(q, None, q, **(ok | {"action": torch.zeros(2, 4, dtype=torch.int32)}), weights=ok["reward"])
    with pytest.raises(ValueError, match=r"weights must be \[N=2, B=4\]"):
        population_td_loss(q, None, q, **ok, weights=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="q and q_next_target"):
        population_td_loss(q, None, torch.zeros(3, 4, 3), **ok, weights=ok["reward"])
    with pytest.raises(ValueError, match="q_next_online"):
        population_td_loss(q, torch.zeros(2, 4, 2), q, **ok, weights=ok["reward"])
    with pytest.raises(ValueError, match=r"sums must be \[N=2, 3\] float64"):
        population_td_loss(q, None, q, **ok, weights=ok["reward"], sums=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="loss must be one of"):
        population_td_loss(q, None, q, **ok, weights=ok["reward"], loss="l1")


# ---- clipping, Adam, target updates


@pytest.mark.parametrize("n", [1, 3])
def test_clipping_is_clip_grad_norm(n):
    nets = _singles(n, 52, (64,), 45)
    stacked = StackedQNetwork.from_networks(nets)
    g = torch.Generator().manual_seed(2)
    for p in stacked.parameters():
        p.grad = torch.randn(p.shape, generator=g) * torch.linspace(0.1, 3.0, n).view(n, *[1] * (p.dim() - 1))
    for i, net in enumerate(nets):
        for p, q in zip(stacked.parameters(), net.parameters(), strict=True):
            q.grad = p.grad[i].clone()
    norms = clip_grad_norms_([p.grad for p in stacked.parameters()], 10.0)
    for i, net in enumerate(nets):
        assert torch.equal(norms[i], nn.utils.clip_grad_norm_(net.parameters(), 10.0, foreach=True))
    _assert_agents_equal(stacked, nets, grads=True)


def _random_grads(stacked, nets, g):
    for p in stacked.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 0.1
    for i, net in enumerate(nets):
        for p, q in zip(stacked.parameters(), net.parameters(), strict=True):
            q.grad = p.grad[i].clone()


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("shape", SHAPES)
def test_adam_is_n_torch_adams(n, shape):
    obs_dim, hidden, n_actions, _ = shape
    nets = _singles(n, obs_dim, hidden, n_actions)
    stacked = StackedQNetwork.from_networks(nets)
    lrs = [1e-3 * (i + 1) for i in range(n)]  # a sweep: one learning rate per agent
    adam = PopulationAdam(list(stacked.parameters()), lr=torch.tensor(lrs, dtype=torch.float64))
    refs = [torch.optim.Adam(net.parameters(), lr=lr) for net, lr in zip(nets, lrs, strict=True)]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        _random_grads(stacked, nets, g)
        adam.step()
        for opt in refs:
            opt.step()
        _assert_agents_equal(stacked, nets)
    for i, (net, opt) in enumerate(zip(nets, refs, strict=True)):
        for mine, p in zip(adam.agent_state(i), net.parameters(), strict=True):
            ref = opt.state[p]
            assert all(torch.equal(mine[k], ref[k]) for k in ("step", "exp_avg", "exp_avg_sq")), f"agent {i}"


@pytest.mark.parametrize("reference", ["torch", "fused"])
def test_adam_late_steps_follow_the_chosen_reference(reference):
    # at steps 1270 and 2582 (beta2 0.999) bc2 ** 0.5 and math.sqrt(bc2) differ in the last bit of
    # the double: each reference must still be followed bit for bit there
    nets = _singles(3, 5, (7, 9), 3)
    stacked = StackedQNetwork.from_networks(nets)
    adam = PopulationAdam(list(stacked.parameters()), lr=5e-4, reference=reference)
    refs = [torch.optim.Adam(net.parameters(), lr=5e-4) for net in nets]
    g = torch.Generator().manual_seed(4)
    _random_grads(stacked, nets, g)
    adam.step()
    states = []
    for opt in refs:
        opt.step()
        states.append(adam_state(opt))
    for start in (1268, 2580):
        adam.steps.fill_(start)
        for _, _, _, steps in states:
            for s in steps:
                s.fill_(start)
        for _ in range(3):
            _random_grads(stacked, nets, g)
            adam.step()
            for opt, (params, m, v, steps) in zip(refs, states, strict=True):
                if reference == "torch":
                    opt.step()
                else:
                    adam_step(params, [p.grad for p in params], m, v, steps, lr=5e-4, beta1=0.9, beta2=0.999,
                              eps=1e-8, backend="torch")  # fmt: skip
            _assert_agents_equal(stacked, nets)


def test_capturable_adam_agrees_to_rounding():
    nets = _singles(3, 5, (7, 9), 3)
    exact, device_steps = StackedQNetwork.from_networks(nets), StackedQNetwork.from_networks(nets)
    a = PopulationAdam(list(exact.parameters()), lr=[1e-3, 2e-3, 3e-3])
    b = PopulationAdam(list(device_steps.parameters()), lr=[1e-3, 2e-3, 3e-3], capturable=True)
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        for p, q in zip(exact.parameters(), device_steps.parameters(), strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(exact.parameters(), device_steps.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("n", [1, 3])
def test_target_updates_are_the_single_agents(n):
    nets = _singles(n, 5, (7, 9), 3)
    targets = [t.requires_grad_(False) for t in _singles(n, 5, (7, 9), 3, seed=70)]  # as the agent's target
    stacked = StackedQNetwork.from_networks(nets)
    stacked_target = StackedQNetwork.from_networks(targets).requires_grad_(False)
    soft_update_(stacked_target, stacked, 0.005)
    for net, target in zip(nets, targets, strict=True):
        torch._foreach_lerp_(list(target.parameters()), list(net.parameters()), 0.005)
    _assert_agents_equal(stacked_target, targets)
    taus = [0.005 * (i + 1) for i in range(n)]
    soft_update_(stacked_target, stacked, taus)
    for net, target, tau in zip(nets, targets, taus, strict=True):
        for t, p in zip(target.parameters(), net.parameters(), strict=True):
            t.lerp_(p, tau)
    _assert_agents_equal(stacked_target, targets)
    hard_update_(stacked_target, stacked)
    _assert_agents_equal(stacked_target, nets)
    copy_ = stacked.detached_copy()
    assert not any(p.requires_grad for p in copy_.parameters())
    _assert_agents_equal(copy_, nets)


def test_optimizer_and_target_refusals():
    stacked = StackedQNetwork.from_networks(_singles(2, 5, (7,), 3))
    with pytest.raises(ValueError, match=r"lr must be one number > 0 or 2 of them"):
        PopulationAdam(list(stacked.parameters()), lr=[1e-3, 1e-3, 1e-3])
    with pytest.raises(ValueError, match="float64"):
        PopulationAdam(list(stacked.parameters()), lr=torch.tensor([1e-3, 2e-3]))
    with pytest.raises(ValueError, match="agents along dim 0"):
        PopulationAdam([torch.zeros(2, 3), torch.zeros(3, 3)], lr=1e-3)
    with pytest.raises(ValueError, match="no gradient"):
        PopulationAdam(list(stacked.parameters()), lr=1e-3).step()
    with pytest.raises(ValueError, match="reference must be"):
        PopulationAdam(list(stacked.parameters()), lr=1e-3, reference="numpy")
    other = StackedQNetwork.from_networks(_singles(3, 5, (7,), 3))
    with pytest.raises(ValueError, match="target and online populations differ"):
        hard_update_(other, stacked)
    with pytest.raises(ValueError, match="tau must be"):
        soft_update_(stacked.detached_copy(), stacked, [0.1, 0.2, 0.3])


# ---- all of it: training steps


@pytest.mark.parametrize("n", [1, 3])
def test_training_steps_are_the_single_agents(n):
    """Loss, backward, clipping, Adam and target updates over several steps, as N single agents
    (the unfused learn step: Agent._fwd_bwd and Agent._adam, then the hard update every 3 steps)."""
    obs_dim, hidden, n_actions, b = 5, (7, 9), 3, 13
    nets = _singles(n, obs_dim, hidden, n_actions)
    targets = [copy.deepcopy(net).requires_grad_(False) for net in nets]
    opts = [torch.optim.Adam(net.parameters(), lr=5e-4) for net in nets]
    stacked = StackedQNetwork.from_networks(nets)
    stacked_target = stacked.detached_copy()
    adam = PopulationAdam(list(stacked.parameters()), lr=5e-4)
    for step in range(1, 8):
        batch = _batch(n, b, obs_dim, n_actions, seed=step)
        adam.zero_grad()
        total, losses, td = population_loss(
            stacked, stacked_target, batch["x"], batch["next_x"], batch["action"], batch["reward"],
            batch["done"], batch["weights"], gamma=0.99,
        )  # fmt: skip
        total.backward()
        clip_grad_norms_([p.grad for p in stacked.parameters()], 0.5)  # small: it clips
        adam.step()
        if step % 3 == 0:
            hard_update_(stacked_target, stacked)
        for i in range(n):
            opts[i].zero_grad(set_to_none=True)
            loss, _ = _single_loss(nets[i], targets[i], batch, i)
            loss.backward()
            nn.utils.clip_grad_norm_(nets[i].parameters(), 0.5, foreach=True)
            opts[i].step()
            if step % 3 == 0:
                torch._foreach_copy_(list(targets[i].parameters()), list(nets[i].parameters()))
            assert torch.equal(losses[i], loss.detach()), f"step {step}, agent {i}"
        _assert_agents_equal(stacked, nets)
        _assert_agents_equal(stacked_target, targets)
    assert math.isfinite(float(total.detach()))
