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
