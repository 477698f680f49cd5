"""The collectives a sharded buffer calls, with equal sizes on every rank only (gloo refuses
uneven ones) and static shapes (so a step can be captured in a CUDA graph with NCCL).

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to ``all_gather_single`` /
``reduce_scatter_single`` (the old names warn); earlier versions have only the old names.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# looked up without failing: a torch built without distributed support lacks both names, and
# gper.dqn imports this module (the Group then refuses with its message)
_all_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)


class Group:
    """The process group a buffer is sharded over, with its world size and this process's rank in it.

    Args:
        group: a ``torch.distributed`` process group, or None for the default (world) group.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedPrioritizedReplayBuffer needs an initialised process group: call "
                "torch.distributed.init_process_group(...) first (torchrun sets up its environment)"
            )
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.backend = str(dist.get_backend(group))

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[world_size, *x.shape]``: every rank's ``x`` in rank order (``x`` of the same shape everywhere)."""
        # flat buffers: gloo wants the output's size to be the world size times the input's
        out = torch.empty(self.world_size * x.numel(), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous().view(-1), group=self.group)
        return out.view(self.world_size, *x.shape)

    def reduce_scatter_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Chunk ``rank`` of the sum over ranks of ``x`` ``[world_size, *rest]``: ``[*rest]``."""
        out = torch.empty(x[0].numel(), dtype=x.dtype, device=x.device)
        _reduce_scatter_single(out, x.contiguous().view(-1), op=dist.ReduceOp.SUM, group=self.group)
        return out.view(x.shape[1:])

    def all_reduce_min(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` replaced in place by its minimum over ranks."""
        dist.all_reduce(x, op=dist.ReduceOp.MIN, group=self.group)
        return x

    def all_reduce_max(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` replaced in place by its maximum over ranks."""
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.group)
        return x
