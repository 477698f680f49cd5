"""N Q-networks of one architecture as one module: each layer's weights ``[N, out, in]`` and biases
``[N, out]``, for a population of agents trained side by side.

Agent ``i`` of a :class:`StackedQNetwork` computes what a :class:`~gper.dqn.network.QNetwork`
holding its parameters computes. How the layers run depends on the device:

- CPU (``batched=False``, the default there): one ``F.linear`` per agent and layer on that agent's
  slice, the very call ``nn.Linear`` makes, so forward and backward are bit for bit the single
  network's (given inputs that start 16-byte aligned, as the single agent's do: see
  :func:`_aligned`). ``torch.baddbmm`` is not: measured with torch 2.13 on the CPU, it differs from
  ``F.linear`` in the last bits for most shapes a DQN uses (for example 3 agents, batch 5, 16 -> 2,
  or batch 5, 256 -> 16), and so do ``bmm`` plus the bias, ``einsum`` and ``vmap(F.linear)``. ATen's
  CPU ``bmm`` picks another kernel than ``addmm`` (a plain loop for small products, oneDNN or a
  batched GEMM for others: our reading of ``LinearAlgebra.cpp``), which sums in another order.
- CUDA (``batched=True``, the default there): one cuBLAS strided-batched GEMM per layer for all
  agents (hidden layers: ``torch.bmm`` and one pass for the bias and the ReLU,
  :func:`~gper.dqn.population_layers.linear_relu`; the output layer ``torch.baddbmm``), so the
  launches do not grow with N. cuBLAS
  may pick other kernels for the batched GEMM than for one agent's, so agreement with a single
  run on the GPU is to rounding, not bit for bit.

:func:`stacked_init` builds agent ``i``'s parameters as a single run seeded ``seeds[i]`` builds
its network (see its docstring for the random draws that come first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gper.dqn.network import QNetwork
from gper.dqn.population_layers import linear_relu


class StackedLinear(nn.Module):
    """One layer of N agents: ``weight [N, out, in]``, ``bias [N, out]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor, batched: bool) -> torch.Tensor:
        """``x [N, B, in]`` -> ``[N, B, out]``: one batched GEMM, or one ``F.linear`` per agent."""
        if batched:
            return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.transpose(1, 2))
        return torch.stack(
            [F.linear(_aligned(x[i]), _aligned(self.weight[i]), _aligned(self.bias[i])) for i in range(x.shape[0])]
        )


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy where it does not start 16-byte aligned.

    The CPU GEMM's result depends on where its input starts: measured with torch 2.13 (MKL), an
    input 4 bytes off gives other last bits than the same values 16, 32, 48 or 64 bytes aligned. A
    single agent's batch starts 16-byte aligned (its rows are padded to 4 floats, see
    :func:`~gper.dqn.network.padded_width`), and so does agent ``i``'s slice of a contiguous
    ``[N, B, obs_dim]`` batch of that width; a slice of any other width is copied (a fresh tensor
    is 64-byte aligned). The copy is differentiable: gradients pass through unchanged."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


class StackedQNetwork(nn.Module):
    """N MLPs of one architecture (:class:`~gper.dqn.network.QNetwork`'s), their parameters stacked.

    ``parameters()`` come in QNetwork's order (layer 0 weight, layer 0 bias, layer 1 weight, ...),
    each with the agents along dim 0, so optimizer state lines up with the single network's.

    Args:
        n_agents: N, the number of networks.
        obs_dim: inputs of each network (the padded width, :func:`~gper.dqn.network.padded_width`).
        n_actions: outputs of each network.
        hidden: hidden layer sizes.

    The parameters start as zeros: build a population with :meth:`from_networks` or
    :func:`stacked_init`, which initialise each agent as a single run does.
    """

    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, hidden: Sequence[int]) -> None:
        super().__init__()
        hidden = tuple(int(h) for h in hidden)
        if n_agents < 1 or obs_dim < 1 or n_actions < 1 or not hidden or min(hidden) < 1:
            raise ValueError(
                f"StackedQNetwork needs n_agents, obs_dim, n_actions and every hidden size >= 1 and at least one "
                f"hidden layer, got n_agents={n_agents}, obs_dim={obs_dim}, n_actions={n_actions}, hidden={hidden}"
            )
        self.n_agents, self.obs_dim, self.n_actions, self.hidden = n_agents, obs_dim, n_actions, hidden
        #: the batched hidden layers' bias-and-ReLU pass: "auto" (Triton on CUDA), "triton" or "torch"
        self.kernels = "auto"
        widths = (obs_dim, *hidden, n_actions)
        self.layers = nn.ModuleList(
            StackedLinear(torch.zeros(n_agents, out, inp), torch.zeros(n_agents, out))
            for inp, out in zip(widths[:-1], widths[1:], strict=True)
        )

    # ---- building and taking apart

    @classmethod
    def from_networks(cls, networks: Sequence[QNetwork]) -> StackedQNetwork:
        """The population of ``networks`` (copies of their parameters), agent ``i`` being ``networks[i]``.

        Raises:
            ValueError: no networks, or networks of different architectures or devices.
        """
        if not networks:
            raise ValueError("from_networks needs at least one QNetwork")
        shapes = [_architecture(net) for net in networks]
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"from_networks needs networks of one architecture, got {sorted(set(shapes))}")
        obs_dim, *hidden, n_actions = shapes[0]
        stacked = cls(len(networks), obs_dim, n_actions, hidden)
        devices = {p.device for net in networks for p in net.parameters()}
        if len(devices) != 1:
            raise ValueError(f"from_networks needs networks on one device, got {sorted(map(str, devices))}")
        stacked.to(devices.pop())
        with torch.no_grad():
            for i, net in enumerate(networks):
                stacked.load_agent(i, net)
        return stacked

    def agent(self, i: int) -> QNetwork:
        """Agent ``i`` as a plain :class:`QNetwork` on this module's device (copies of its parameters).

        Draws no random numbers: the network is made on the meta device, then filled."""
        self._check_index(i)
        with torch.device("meta"):  # no initialisation to run, so torch's generator is left alone
            net = QNetwork(self.obs_dim, self.n_actions, self.hidden)
        net = net.to_empty(device=self.layers[0].weight.device)
        with torch.no_grad():
            for layer, linear in zip(self.layers, _linears(net), strict=True):
                linear.weight.copy_(layer.weight[i])
                linear.bias.copy_(layer.bias[i])
        return net

    def load_agent(self, i: int, network: QNetwork) -> None:
        """Copy ``network``'s parameters into agent ``i`` (in place, without autograd)."""
        self._check_index(i)
        if _architecture(network) != (self.obs_dim, *self.hidden, self.n_actions):
            raise ValueError(
                f"load_agent: the network is {_architecture(network)}, this population's agents are "
                f"{(self.obs_dim, *self.hidden, self.n_actions)}"
            )
        with torch.no_grad():
            for layer, linear in zip(self.layers, _linears(network), strict=True):
                layer.weight[i].copy_(linear.weight)
                layer.bias[i].copy_(linear.bias)

    def detached_copy(self) -> StackedQNetwork:
        """A copy without gradients: the population's target networks, as a single agent's
        ``copy.deepcopy(qnet).requires_grad_(False)``."""
        copy = StackedQNetwork(self.n_agents, self.obs_dim, self.n_actions, self.hidden)
        copy.kernels = self.kernels
        copy.to(self.layers[0].weight.device)
        with torch.no_grad():
            torch._foreach_copy_(list(copy.parameters()), list(self.parameters()))
        return copy.requires_grad_(False)

    # ---- computing

    def forward(self, x: torch.Tensor, batched: bool | None = None) -> torch.Tensor:
        """Q-values ``[N, B, n_actions]`` for observations ``x [N, B, obs_dim]`` (agent ``i`` reads ``x[i]``).

        Args:
            x: float observations, one batch per agent.
            batched: one batched GEMM per layer (True) or one GEMM per agent and layer (False,
                bit for bit the single network's on the CPU); None: batched on CUDA only.
        """
        self.check_input(x, "x")
        if batched is None:
            batched = x.is_cuda
        layers = list(self.layers)
        for layer in layers[:-1]:
            if batched:  # one GEMM and one pass for the bias and the ReLU (gper.dqn.population_layers)
                x = linear_relu(x, layer.weight, layer.bias, self.kernels)
            else:
                x = torch.relu_(layer(x, batched))  # in place, as QNetwork's ReLU(inplace=True)
        return layers[-1](x, batched)

    def check_input(self, x: torch.Tensor, name: str) -> None:
        """Raise ValueError unless ``x`` is ``[N, B, obs_dim]`` floats on this module's device."""
        weight = self.layers[0].weight
        if x.dim() != 3 or x.shape[0] != self.n_agents or x.shape[2] != self.obs_dim:
            raise ValueError(
                f"{name} must be [n_agents={self.n_agents}, B, obs_dim={self.obs_dim}], got {tuple(x.shape)}"
            )
        if x.dtype != weight.dtype or x.device != weight.device:
            raise ValueError(f"{name} must be {weight.dtype} on {weight.device}, got {x.dtype} on {x.device}")

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.n_agents:
            raise IndexError(f"agent index {i} is out of range for a population of {self.n_agents}")


def stacked_init(
    seeds: Sequence[int],
    obs_dim: int,
    n_actions: int,
    hidden: Sequence[int],
    *,
    before_network: Callable[[int], object] | None = None,
    device: torch.device | str | None = None,
) -> StackedQNetwork:
    """A population whose agent ``i`` starts from the network a single run seeded ``seeds[i]`` builds.

    A single run (``gper.dqn.build.setup``, then :class:`~gper.dqn.Agent`) draws from torch's CPU
    generator in this order: ``torch.manual_seed(seed)`` (which seeds the CUDA generators too);
    the training environment, built next, draws its first reset from the default generator of its
    device (on the CPU: cartpole ``torch.rand(num_envs, 4, float64)``; market ``torch.randint`` of
    the start bars, its synthetic prices coming from a generator of their own; bitflip two
    ``torch.randint`` calls); the replay buffer draws nothing from it (it has its own generator);
    then the QNetwork is built on the CPU, each ``nn.Linear`` in order drawing its weight
    (``kaiming_uniform_``) and then its bias (``uniform_``), and moved to the run's device. An
    environment on CUDA draws from the CUDA generator, so there the network's draws follow the
    seed directly; on the CPU they follow the environment's.

    For each seed this function calls ``torch.manual_seed(seed)``, then ``before_network(seed)``
    where given (the place for the trainer to build agent ``i``'s environment on the CPU, or to
    replay its draws), then builds the QNetwork as the single run does. It leaves torch's
    generators as the last agent's network left them, as a single run of the last seed would.

    Args:
        seeds: one seed per agent (a single run's ``seed + i`` for agent ``i``).
        obs_dim, n_actions, hidden: the architecture (``obs_dim`` padded, as the agent builds it).
        before_network: called with each seed after seeding and before that agent's network.
        device: where the population lives (default the CPU).
    """
    if not seeds:
        raise ValueError("stacked_init needs at least one seed")
    networks = []
    for seed in seeds:
        torch.manual_seed(seed)
        if before_network is not None:
            before_network(seed)
        networks.append(QNetwork(obs_dim, n_actions, tuple(hidden)))
    stacked = StackedQNetwork.from_networks(networks)
    return stacked.to(device) if device is not None else stacked


def _linears(network: QNetwork) -> list[nn.Linear]:
    return [m for m in network.net if isinstance(m, nn.Linear)]


def _architecture(network: QNetwork) -> tuple[int, ...]:
    """``(in, hidden..., out)`` of ``network``."""
    if not isinstance(network, QNetwork):
        raise ValueError(f"expected a QNetwork, got {type(network).__name__}")
    linears = _linears(network)
    return (linears[0].in_features, *(lin.out_features for lin in linears))
