"""Stratified sampling: one draw in each of B equal-mass segments (the PER paper's variant)."""

from __future__ import annotations

from gper.ops.state import MODE_STRATIFIED
from gper.replay.samplers.base import SamplingPolicy


class StratifiedSampler(SamplingPolicy):
    """One draw in each of B equal-mass segments of the priorities."""

    mode = "stratified"
    kernel_mode = MODE_STRATIFIED
