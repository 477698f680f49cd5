"""Uniform sampling: every filled slot equally likely, IS weights 1."""

from __future__ import annotations

from gper.ops.state import MODE_PROPORTIONAL, MODE_UNIFORM
from gper.replay.samplers.base import SamplingPolicy


class UniformSampler(SamplingPolicy):
    """Every filled slot equally likely; weights are all 1.

    A trajectory buffer draws its drawable starts proportionally instead, their tree values all
    1: a start enters at 1 and its updates use alpha 0 (every priority ``(|td| + eps) ** 0 = 1``).
    """

    mode = "uniform"
    kernel_mode = MODE_UNIFORM
    unit_weights = True

    @property
    def start_mode(self) -> int:
        return MODE_PROPORTIONAL

    @property
    def start_value(self) -> float | None:
        return 1.0

    def start_alpha(self, alpha: float) -> float:
        return 0.0
