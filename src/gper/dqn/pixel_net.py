"""The Q-network of pixel observations: the Nature DQN's convolutions (Mnih et al. 2015), with an
optional dueling head (Wang et al. 2016).

It takes the replay's and the environment's uint8 frame stacks ``[B, S, 84, 84]`` as they are and
converts them to float (scaled to [0, 1]) in channels-last layout inside its forward, so the
conversion is part of the learn step's CUDA graph and the stored frames stay bytes. The whole
network runs channels-last (cuDNN's fastest layout for these convolutions on tensor cores).
"""

from __future__ import annotations

import torch
from torch import nn

#: the convolutions' output for 84 x 84 frames: 64 channels of 7 x 7
_FLAT = 64 * 7 * 7


class NatureQNetwork(nn.Module):
    """Q-values of ``n_actions`` from ``[B, frames, 84, 84]`` uint8 stacks.

    Args:
        frames: frames a stack holds (input channels).
        n_actions: Q-values out.
        hidden: units of the fully connected layer (the Nature DQN's 512).
        dueling: a value stream and an advantage stream, each with its own ``hidden`` units,
            combined as ``V + A - mean(A)``.
    """

    def __init__(self, frames: int, n_actions: int, hidden: int = 512, dueling: bool = False) -> None:
        super().__init__()
        self.dueling = dueling
        self.features = nn.Sequential(
            nn.Conv2d(frames, 32, 8, stride=4),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(inplace=True),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(_FLAT, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, n_actions))
        if dueling:
            self.value = nn.Sequential(nn.Linear(_FLAT, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, 1))
        self.to(memory_format=torch.channels_last)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames.to(dtype=torch.float32, memory_format=torch.channels_last)
        # scaled in place only in the copy .to made (a float channels-last input is returned as it is)
        x = x.mul_(1.0 / 255.0) if x is not frames else x * (1.0 / 255.0)
        h = self.features(x)
        advantage = self.head(h)
        if not self.dueling:
            return advantage
        return self.value(h) + advantage - advantage.mean(dim=1, keepdim=True)


def _convs(net: NatureQNetwork) -> list[nn.Conv2d]:
    return [m for m in net.features if isinstance(m, nn.Conv2d)]


def _stacked(tensors: list[torch.Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))  # stack copies


class _Head(nn.Module):
    """N agents' ``Linear -> ReLU -> Linear`` as batched matmuls: ``[N, B, in]`` -> ``[N, B, out]``."""

    def __init__(self, heads: list[nn.Sequential]) -> None:
        super().__init__()
        self.w1, self.b1 = _stacked([h[0].weight for h in heads]), _stacked([h[0].bias for h in heads])
        self.w2, self.b2 = _stacked([h[2].weight for h in heads]), _stacked([h[2].bias for h in heads])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # plain torch ops (autocast's bf16 and autograd as they come): at B = 64 these are not the cost
        z = torch.baddbmm(self.b1.unsqueeze(1), x, self.w1.transpose(1, 2)).relu_()
        return torch.baddbmm(self.b2.unsqueeze(1), z, self.w2.transpose(1, 2))

    def unstack(self, i: int, head: nn.Sequential) -> None:
        """Agent ``i``'s weights into ``head`` (a ``Linear -> ReLU -> Linear``)."""
        for layer, w, b in ((head[0], self.w1, self.b1), (head[2], self.w2, self.b2)):
            layer.weight.copy_(w[i])
            layer.bias.copy_(b[i])


class NatureQNetworks(nn.Module):
    """N :class:`NatureQNetwork` s evaluated as one network: ``[N, B, S, 84, 84]`` uint8 stacks (agent
    ``i``'s batch in row ``i``) -> ``[N, B, n_actions]``.

    Why one network: a population of pixel agents would otherwise run N networks one after the
    other, N times the kernels of one in every forward and backward, when each of those kernels is
    far too small to fill the GPU. Here each convolution is one grouped convolution (agent ``i``'s
    filters are group ``i`` and read only its own frames) and the fully connected layers are
    batched matmuls, so N agents take the kernels of one. (Not the time of one: on an H100 three
    agents' learn step took 2.2 ms against one agent's 1.1 ms, and 2.7 ms as three networks one
    after the other; ``benchmarks/results/atari-throughput-*-20261206-031550.md``.) The agents
    share no parameter: agent ``i``'s outputs and gradients are those of its own network
    (:meth:`network`), to rounding.

    Args:
        nets: the agents' networks, whose weights it takes (so each agent starts as its own seed's
            :class:`NatureQNetwork` would).
    """

    def __init__(self, nets: list[NatureQNetwork]) -> None:
        super().__init__()
        n, first = len(nets), nets[0]
        self.agents, self.dueling, self.frames = n, first.dueling, _convs(first)[0].in_channels
        self.n_actions, self.hidden = first.head[2].out_features, first.head[0].out_features
        layers: list[nn.Module] = []
        for j, conv in enumerate(_convs(first)):
            group = nn.Conv2d(conv.in_channels * n, conv.out_channels * n, conv.kernel_size, conv.stride, groups=n)
            with torch.no_grad():  # group i: agent i's filters, in its rows of the weight
                group.weight.copy_(torch.cat([_convs(net)[j].weight for net in nets]))
                group.bias.copy_(torch.cat([_convs(net)[j].bias for net in nets]))
            layers += [group, nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.head = _Head([net.head for net in nets])
        self.value = _Head([net.value for net in nets]) if self.dueling else None
        self.to(memory_format=torch.channels_last)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        n, b, s = frames.shape[:3]
        if n != self.agents or s != self.frames:
            raise ValueError(f"frames must be [{self.agents}, B, {self.frames}, H, W], got {list(frames.shape)}")
        # [B, N * S, H, W] channels-last float: agent i's frames are group i's input channels
        x = torch.empty(
            (b, n * s, *frames.shape[3:]), dtype=torch.float32, device=frames.device, memory_format=torch.channels_last
        )
        x.view(b, n, s, *frames.shape[3:]).copy_(frames.transpose(0, 1))
        h = self.features(x.mul_(1.0 / 255.0))
        # [N, B, 64 * 7 * 7], each agent's features flattened as NatureQNetwork's Flatten does
        h = h.unflatten(1, (n, -1)).transpose(0, 1).contiguous().flatten(2)
        advantage = self.head(h)
        if not self.dueling:
            return advantage
        return self.value(h) + advantage - advantage.mean(dim=2, keepdim=True)

    @torch.no_grad()
    def network(self, i: int) -> NatureQNetwork:
        """Agent ``i``'s network on its own (a copy of its weights: changing it changes nothing here)."""
        if not 0 <= i < self.agents:
            raise IndexError(f"agent {i} of a population of {self.agents}")
        conv0 = self.features[0]
        # the new network's initial weights are overwritten: drawing them must not move the global
        # generator, which on the CPU also draws a run's exploration
        with torch.random.fork_rng(devices=[]):
            net = NatureQNetwork(self.frames, self.n_actions, self.hidden, self.dueling).to(conv0.weight.device)
        for conv, group in zip(_convs(net), [m for m in self.features if isinstance(m, nn.Conv2d)], strict=True):
            rows = conv.out_channels
            conv.weight.copy_(group.weight[i * rows : (i + 1) * rows])
            conv.bias.copy_(group.bias[i * rows : (i + 1) * rows])
        self.head.unstack(i, net.head)
        if self.dueling:
            self.value.unstack(i, net.value)
        return net

    def clip_grad_norm_(self, max_norm: float) -> None:
        """Each agent's gradient clipped to ``max_norm`` on its own, as ``nn.utils.clip_grad_norm_``
        clips one network's (scale ``max_norm / (norm + 1e-6)`` where that is below 1), without a
        host sync. Every parameter's first dimension splits by agent (a grouped convolution keeps
        each group's filters together), so row ``i`` of ``unflatten(0, (N, -1))`` is agent ``i``'s."""
        grads = [p.grad.unflatten(0, (self.agents, -1)) for p in self.parameters() if p.grad is not None]
        each = [torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))) for g in grads]  # [N] each
        norm = torch.linalg.vector_norm(torch.stack(each), dim=0)
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))
