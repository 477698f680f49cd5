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
