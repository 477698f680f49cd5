"""What each spawned rank runs in tests/distributed/test_sharded_edges.py (importable by the
spawned processes): edge cases of ShardedPrioritizedReplayBuffer found in review."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from gper.distributed import ShardedPrioritizedReplayBuffer

SPEC = {"who": ((2,), torch.int64)}
PER_RANK = 16


def build(world: int, **kw) -> ShardedPrioritizedReplayBuffer:
    """8 items on every rank, ``who = (rank, slot)``."""
    args = dict(alpha=1.0, beta=0.5, eps=1e-6, backend="torch", device="cpu", seed=7) | kw
    rb = ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, **args)
    rank = dist.get_rank()
    rb.add({"who": torch.stack([torch.full((8,), rank), torch.arange(8)], 1)})
    return rb


class HostData(TorchFunctionMode):
    """Records every tensor made from host data (``torch.tensor``/``torch.as_tensor`` of a Python
    value): on a GPU each is a host-to-device copy, which a CUDA graph capture refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, object]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            self.made.append((func.__name__, args[0]))
        return func(*args, **(kwargs or {}))


def no_host_data_in_a_step(rank: int, world: int) -> None:
    for mode in ("exact", "local"):
        for norm in ("global", "batch"):
            rb = build(world, mode=mode, weight_norm=norm)
            rb.sample(4)  # the first draw checks for items (a documented host read)
            with HostData() as seen:
                batch = rb.sample(4)
                rb.update_priorities(batch, torch.ones(4))
            assert seen.made == [], (mode, norm, seen.made)
