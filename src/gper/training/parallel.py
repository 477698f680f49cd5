"""Data-parallel training, for any algorithm on the trainer core: ``torchrun --nproc-per-node N -m
gper train ...`` runs one process per GPU (gloo processes on the CPU), each with its own
environments and its own shard of one :class:`~gper.distributed.ShardedPrioritizedReplayBuffer`,
and the same network on every rank. Which settings an algorithm can train so is its own check
(DQN's: :func:`gper.dqn.parallel.check_settings`).

What this module holds: which mode a run takes (:func:`resolve_mode`), the process group's start
and end (:func:`start`, :class:`Launch`), the gradient average every step (:class:`GradientAverage`),
and the small agreements the loop needs between ranks (one rank's error raised on all of them, a
stop signal seen by every rank at the same epoch). ``docs/distributed.md`` ("Training on several
processes") says what runs where.

Why the gradients are averaged by hand rather than by ``DistributedDataParallel``: DQN's fused step
calls ``QNetwork.fused_forward``, not the module's ``forward``, so DDP's per-iteration preparation
(which its forward does) would never run; and DDP's bucketed all-reduce runs from autograd hooks on
streams of its own, which a CUDA graph capture of the whole step would have to take in. One
all-reduce of one flattened buffer in a phase of its own is a plain NCCL collective on the
step's stream (capturable like the replay's), and the phase line times it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

#: --distributed's choices
MODES = ("auto", "off", "exact", "local")
#: what torchrun sets in each process's environment
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

T = TypeVar("T")


def launched(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process was started by torchrun (its environment holds :data:`TORCHRUN_VARS`)."""
    return all(name in environ for name in TORCHRUN_VARS)


def resolve_mode(requested: str, environ: Mapping[str, str] = os.environ) -> str:
    """The mode a run takes: ``off``, ``exact`` or ``local``; ``auto`` is exact when torchrun started
    more than one process, else off.

    Raises:
        ValueError: an unknown mode; ``off`` with more than one process (each would train alone
            and write the same run folder); ``exact``/``local`` without torchrun's environment.
    """
    if requested not in MODES:
        raise ValueError(f"distributed must be one of {', '.join(MODES)}, got {requested!r}")
    world = int(environ.get("WORLD_SIZE", "1")) if launched(environ) else 1
    if requested == "auto":
        return "exact" if world > 1 else "off"
    if requested == "off" and world > 1:
        raise ValueError(
            f"distributed off with {world} processes: each would train alone and write the same run folder; "
            "use --distributed exact or local, or start one process"
        )
    if requested != "off" and not launched(environ):
        missing = [name for name in TORCHRUN_VARS if name not in environ]
        raise ValueError(
            f"distributed {requested} needs torchrun's environment ({', '.join(missing)} unset): launch with "
            "torchrun --nproc-per-node N -m gper train ... (N = 1 for one process)"
        )
    return requested


class PeerFailed(ValueError):
    """What the other ranks raise when a step failed on some ranks (which raise their own error)."""


@dataclass
class Launch:
    """This process's place in the group: what :func:`start` set up."""

    world_size: int
    rank: int
    local_rank: int
    mode: str
    """the sharded buffer's mode: exact or local"""
    device: torch.device
    """this rank's device: ``cuda:<LOCAL_RANK>`` (NCCL) or the CPU (gloo)"""

    @property
    def main(self) -> bool:
        """Whether this is rank 0, which writes the run folder, prints and evaluates."""
        return self.rank == 0

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a collective: one all-reduce and a host sync)."""
        t = torch.tensor([int(flag)], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def agree(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` on every rank; if it raised on any rank, raise on all of them (its own exception
        where it raised, a one-line :class:`PeerFailed` elsewhere), so no rank is left waiting in a
        collective. A collective."""
        error: BaseException | None = None
        result = None
        try:
            result = fn()
        except Exception as err:
            error = err
        every = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
        every[self.rank] = int(error is not None)
        dist.all_reduce(every)  # which ranks failed
        if error is not None:
            raise error
        bad = [r for r, f in enumerate(every.tolist()) if f]
        if bad:
            raise PeerFailed(f"{what} failed on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}")
        return result  # type: ignore[return-value]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a picklable object; a collective)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_parameters(self, modules: list[torch.nn.Module]) -> None:
        """Rank 0's parameters and buffers of ``modules`` on every rank, in place (one broadcast each)."""
        with torch.no_grad():
            for module in modules:
                for t in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(t.data, src=0)


def start(mode: str, device: str, environ: Mapping[str, str] = os.environ) -> Launch | None:
    """Join the process group torchrun describes (``mode`` from :func:`resolve_mode`); None when ``off``.

    The device: ``cuda:<LOCAL_RANK>`` for ``auto`` (with a GPU) or ``cuda``, set as the current one,
    with NCCL; the CPU for ``cpu`` (or ``auto`` without a GPU), with gloo.

    Raises:
        ValueError: ``cuda:N`` (each process takes the GPU of its LOCAL_RANK), or ``cuda`` without
            enough GPUs for LOCAL_RANK.
    """
    if mode == "off":
        return None
    rank, world, local = (int(environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device.startswith("cuda:"):
        raise ValueError(
            f"device {device} under torchrun: each process takes the GPU of its LOCAL_RANK; use cuda or auto"
        )
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local} but this host has {torch.cuda.device_count()} CUDA devices")
        where = torch.device("cuda", local)
        torch.cuda.set_device(where)
        dist.init_process_group("nccl", device_id=where)
    elif device in ("cpu", "auto"):
        where = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        raise ValueError(f"device must be auto, cuda or cpu under torchrun, got {device!r}")
    return Launch(world_size=world, rank=rank, local_rank=local, mode=mode, device=where)


def stop(launch: Launch | None, finished: bool = False) -> None:
    """Leave the process group (after a run, or an error).

    After a finished run every rank first waits for the others (rank 0 still writes the summary
    and the plot when the others are done): a rank that tore down its gloo connections while a
    peer still held them was seen to abort at exit ("terminate called without an active
    exception"). After an error there is no wait, which could hang on a rank that is gone."""
    if launch is not None and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


class GradientAverage:
    """The learn step's ``grad_sync`` phase: every rank's gradients replaced by their mean over the
    group, through one all-reduce of one flattened buffer (see the module docstring for why not DDP).

    Args:
        world_size: the group's size (the sum is divided by it).
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def __call__(self, grads: list[torch.Tensor | None]) -> None:
        """Average ``grads`` (the online network's ``.grad`` tensors, in parameter order) in place."""
        present = [g for g in grads if g is not None]
        if not present:
            return
        flat = torch.cat([g.reshape(-1) for g in present])
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        views = [v.view_as(g) for v, g in zip(flat.split([g.numel() for g in present]), present, strict=True)]
        torch._foreach_copy_(present, views)


class QuietRunLog:
    """What ranks other than 0 hold in place of a :class:`~gper.training.runlog.RunLog`: rank 0's run
    folder (checkpoints go there), and a record that writes nothing."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.metrics_path = self.folder / "metrics.jsonl"

    def log(self, global_step: int, **values: float) -> None:
        pass

    def log_episodes(self, records: Iterable[tuple[int, str, float, str, int]]) -> None:
        pass

    def flush(self) -> None:
        pass

    def write_json(self, name: str, data: Mapping[str, Any]) -> None:
        pass

    def metrics_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass


class GroupStop:
    """The stop signals of a data-parallel run, seen by every rank at the same point: ``requested``
    changes only at :meth:`agree` (an epoch's end, one all-reduce), so a signal that reached some
    ranks only (or reached them at different steps) stops every rank after the same epoch."""

    def __init__(self, signals: Any, launch: Launch) -> None:
        self.signals, self.launch = signals, launch
        self.requested = False

    def agree(self) -> bool:
        self.requested = self.launch.any(self.signals.requested)
        return self.requested

    @property
    def name(self) -> str:
        return self.signals.name or "SIGTERM"

    def exception(self) -> BaseException:
        return self.signals.exception() if self.signals.requested else SystemExit(143)
