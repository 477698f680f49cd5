"""ShardedPrioritizedReplayBuffer on 2, 3 and 4 gloo processes of this host (CPU, torch back end):
exact mode's distribution and IS weights against one buffer over the shards, priority routing
and stale updates, local mode's unbiased loss, determinism and checkpoints (tests/distributed/workers.py)."""

from __future__ import annotations

import pytest
import torch
from spawn import run_ranks
from workers import everything


@pytest.mark.parametrize("world", [2, 3, 4])
def test_sharded_buffer_on_processes(world, tmp_path):
    run_ranks(everything, world, str(tmp_path), timeout=150)
    # every rank finished; in exact mode each drew its own part of one batch (rows differ between ranks)
    draws = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    ids = [d["exact"][0][0] * 2**40 + d["exact"][0][1] for d in draws]
    assert len({tuple(x.tolist()) for x in ids}) == world


def test_refused_without_a_process_group():
    from gper.distributed import ShardedPrioritizedReplayBuffer

    with pytest.raises(RuntimeError, match="init_process_group"):
        ShardedPrioritizedReplayBuffer(8, {"x": ((1,), torch.float32)}, device="cpu", backend="torch")


def test_two_launches_with_one_seed_draw_the_same_samples(tmp_path):
    """Separate process groups (fresh processes, fresh ports) with the same seed draw the same
    owners, slots and weights on every rank, in both modes."""
    from workers import determinism_and_checkpoint

    runs = [tmp_path / "first", tmp_path / "second"]
    for out in runs:
        out.mkdir()
        run_ranks(determinism_and_checkpoint, 2, str(out), timeout=120)
    for rank in range(2):
        first, second = (torch.load(out / f"rank{rank}.pt") for out in runs)
        for mode in ("exact", "local"):
            for a, b in zip(first[mode], second[mode], strict=True):
                assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True)), (rank, mode)
