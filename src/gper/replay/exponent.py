"""The exponents a sample reads from the device: :class:`ExponentInput`."""

from __future__ import annotations

import torch

from gper.replay.checks import check_beta_tensor, check_unit


class ExponentInput:
    """An exponent in [0, 1] a kernel reads (the IS exponent beta, or the trajectory buffer's
    discount gamma; ``name`` in errors), as a 0-d float32 device tensor.

    A float32 tensor of the caller's is read where it is (no copy kernel) unless the call
    replays the buffer's own graph, whose kernel reads the buffer's scalar; floats are written
    into the scalar only when they change."""

    def __init__(self, scalar: torch.Tensor, name: str = "beta") -> None:
        self.scalar = scalar
        self.name = name
        self._written: float | None = None

    def tensor(self, value: float | torch.Tensor, graphed: bool, checked: bool = False) -> torch.Tensor:
        """The tensor for ``value`` (a float in [0, 1] or a 0-d float device tensor); ``checked``:
        a float already known to be valid (the buffer's default)."""
        if isinstance(value, torch.Tensor):
            check_beta_tensor(value, self.scalar.device, self.name)
            if value.requires_grad:  # nor may a tensor that requires grad pull the buffer into autograd
                value = value.detach()
            if value.dtype == torch.float32 and not graphed:
                return value
            # clamped as the kernels clamp it (NaN reads as 1): the scalar is part of the state
            # a checkpoint holds, which a restore checks
            self.scalar.copy_(value.clamp(0.0, 1.0).nan_to_num(1.0))
            self._written = None
            return self.scalar
        value = value if checked else check_unit(self.name, value)
        if value != self._written:
            self.scalar.fill_(value)
            self._written = value
        return self.scalar

    def forget(self) -> None:
        """The scalar was overwritten (a checkpoint load): write the next float again."""
        self._written = None
