"""Copy device tensors to pinned host memory without blocking, and read them once they land.

:meth:`AsyncReadback.start` enqueues the copies and an event behind the work that produced the
values; :meth:`AsyncReadback.wait` waits for that event only. The trainer calls both once an
epoch, which is the epoch's only synchronisation with the GPU.
"""

from __future__ import annotations

import torch


class AsyncReadback:
    """Pinned host mirrors of a fixed set of device tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = dict(tensors)
        self.cuda = any(t.is_cuda for t in self.tensors.values())
        self.host = {
            name: torch.empty(t.shape, dtype=t.dtype, pin_memory=self.cuda and torch.cuda.is_available())
            for name, t in self.tensors.items()
        }
        self._event = torch.cuda.Event() if self.cuda else None

    def start(self) -> None:
        """Enqueue the copies on the current stream; returns at once."""
        for name, t in self.tensors.items():
            self.host[name].copy_(t, non_blocking=True)
        if self._event is not None:
            self._event.record()

    def wait(self) -> dict[str, torch.Tensor]:
        """Block until the copies of the last :meth:`start` are on the host; return them."""
        if self._event is not None:
            self._event.synchronize()
        return self.host
