"""Proportional sampling: independent draws, ``P(i) = p_i / sum(p)`` (Schaul et al. 2016, eq. 1)."""

from __future__ import annotations

from gper.ops.state import MODE_PROPORTIONAL
from gper.replay.samplers.base import SamplingPolicy


class ProportionalSampler(SamplingPolicy):
    """Draws in proportion to the stored priorities; new items enter at the running max priority."""

    mode = "proportional"
    kernel_mode = MODE_PROPORTIONAL
