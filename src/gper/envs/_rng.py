"""Where the device environments draw their random numbers from, and who may seed it.

An environment either owns a ``torch.Generator`` on its device (seeded by its ``seed`` and by
``reset(seed)``: reproducible on its own), uses one the caller passes in (the caller seeds it), or
uses torch's default generator of the device (``graph_safe_rng=True``).

The default generator is the one a CUDA graph capture handles without help: the capture records
its Philox offset and every replay advances it, so each replay draws fresh numbers. A private
generator only does so once the capturing code registers it with
``torch.cuda.CUDAGraph.register_generator_state``; a trainer that would rather not do that passes
``graph_safe_rng=True`` and seeds torch globally (``torch.manual_seed``) instead.
"""

from __future__ import annotations

import torch


class EnvRng:
    """The generator of one environment (``None`` = torch's default) and whether ``reset`` may seed it."""

    def __init__(
        self, device: torch.device, seed: int, generator: torch.Generator | None, graph_safe_rng: bool
    ) -> None:
        if generator is not None and graph_safe_rng:
            raise ValueError("pass either generator or graph_safe_rng=True, not both")
        if generator is not None and generator.device.type != device.type:
            raise ValueError(f"generator is on {generator.device}, the environment on {device}")
        self.owned = generator is None and not graph_safe_rng
        if self.owned:
            generator = torch.Generator(device=device)
            generator.manual_seed(int(seed))
        self.generator = generator

    def seed(self, seed: int | None) -> None:
        """Re-seed the generator if the environment owns it (a caller's or torch's default one is theirs to seed)."""
        if seed is not None and self.owned:
            self.generator.manual_seed(int(seed))
