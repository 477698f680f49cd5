"""The group's part of a sharded buffer's checkpoint: the checks it passes before any rank loads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gper.distributed.collectives import Group


def state_problem(state: Mapping[str, Any], world_size: int, rank: int, mode: str, seed: int) -> str | None:
    """What is wrong with ``state`` as the group's part of this rank's sharded state, or None."""
    meta = state.get("distributed") if isinstance(state, Mapping) else None
    if not isinstance(meta, Mapping) or "shard" not in state or "shared_rng" not in state:
        return "not the state_dict() of a ShardedPrioritizedReplayBuffer"
    if meta.get("world_size") != world_size:
        return (
            f"the state was saved at world size {meta.get('world_size')}, this group has {world_size}: "
            "a sharded buffer restores only at the same world size (re-sharding is not supported)"
        )
    if meta.get("rank") != rank:
        return f"the state is rank {meta.get('rank')}'s shard, this is rank {rank}: load each rank's own"
    if meta.get("mode") != mode or meta.get("seed") != seed:
        saved = f"mode={meta.get('mode')!r}, seed={meta.get('seed')!r}"
        return f"the state has {saved}; this buffer mode={mode!r}, seed={seed}"
    rng = state["shared_rng"]
    if not isinstance(rng, torch.Tensor) or rng.shape != (1,) or rng.dtype != torch.int64:
        return "shared_rng must be a [1] int64 tensor"
    return None


def load_agreed(
    group: Group,
    device: torch.device,
    state: Mapping[str, Any],
    own_counter: torch.Tensor,
    problem: str | None,
    what: str,
    load: Callable[[Callable[[], None]], object],
) -> None:
    """Load this rank's shard with ``load(agree)``, which checks it and calls ``agree()`` before
    changing anything: the ranks agree there (one all-gather), so a state that this rank's own
    checks refuse, or any rank's (``problem``: what :func:`state_problem` found), is loaded on no
    rank (and no rank waits in the collective). ``own_counter``: this rank's shared draws' counter."""
    if problem is not None:
        _agree(group, device, problem, own_counter, what)  # raises on every rank
    agreed = False

    def agree() -> None:
        nonlocal agreed
        agreed = True
        _agree(group, device, None, state["shared_rng"], what)

    try:
        load(agree)
    except Exception as err:
        if not agreed:  # the shard's checks refused it here: the other ranks wait to agree
            try:
                _agree(group, device, str(err), own_counter, what)
            except ValueError:
                pass
        raise


def _agree(group: Group, device: torch.device, problem: str | None, counter: torch.Tensor, what: str) -> None:
    """Raise on every rank alike when any rank's state has a ``problem`` or the shared counters differ."""
    flags = torch.cat([torch.tensor([problem is not None], device=device).long(), counter.to(device)])
    every = group.all_gather(flags).cpu()
    if problem is not None:
        raise ValueError(f"{what}: {problem}")
    if bool(every[:, 0].any()):
        bad = [i for i, f in enumerate(every[:, 0].tolist()) if f]
        raise ValueError(f"{what}: the states of ranks {bad} were refused there; nothing was loaded")
    if bool((every[:, 1] != every[0, 1]).any()):
        raise ValueError(f"{what}: the ranks' states come from different steps (shared counters differ)")
