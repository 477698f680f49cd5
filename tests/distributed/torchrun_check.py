"""Run under torchrun by tests/distributed/test_torchrun.py: two "nodes" on one host. Exact mode
over every process must draw each item with probability p_i / S (chi-square), rows intact."""

from __future__ import annotations

import torch
import torch.distributed as dist
from workers import PER_RANK, build, chi_square_z, draw_counts, oracle

if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    rb = build(world)
    counts = draw_counts(rb, world, 64, 200 // world)
    p = oracle(world).view(-1)
    z = chi_square_z(counts.view(-1), p / p.sum())
    assert abs(z) < 4 and counts.view(-1)[p == 0].sum() == 0, z
    assert counts.shape == (world, PER_RANK)
    print(f"rank {dist.get_rank()} of {world}: chi-square z = {z:+.2f}")
    dist.destroy_process_group()
