"""AsyncReadback: copies of device tensors to (pinned) host memory, read behind one event."""

from __future__ import annotations

import torch

from gper.training.readback import AsyncReadback


def test_readback_copies_values():
    t = torch.arange(6.0)
    readback = AsyncReadback({"t": t})
    readback.start()
    t += 1  # after the copy was taken
    assert readback.wait()["t"].tolist() == [0, 1, 2, 3, 4, 5]
