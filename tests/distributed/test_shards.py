"""The shard math of gper.distributed.shards in one process: owners follow the cumulative masses
(a shard of mass 0 is never picked), stratified thresholds cover every stratum, keys differ per stream."""

from __future__ import annotations

import torch

from gper.distributed import shards


def test_owners_follow_cumulative_mass_and_skip_empty_shards():
    mass = torch.tensor([2.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    t = torch.tensor([0.0, 1.999, 2.0, 2.999, 3.0, 3.999], dtype=torch.float64)
    assert shards.owners(mass, t).tolist() == [0, 0, 2, 2, 3, 3]
    u = torch.linspace(0, 1 - 2**-32, 10001, dtype=torch.float64)
    counts = torch.bincount(shards.owners(mass, shards.thresholds(mass, u, False)), minlength=4)
    assert counts[1] == 0 and abs(int(counts[0]) - 5000) <= 2 and abs(int(counts[2]) - 2500) <= 2


def test_stratified_thresholds_one_per_stratum_and_local_fractions_in_range():
    mass = torch.tensor([3.0, 1.0], dtype=torch.float64)
    u = torch.full((8,), 0.5, dtype=torch.float64)
    t = shards.thresholds(mass, u, True)
    assert torch.allclose(t, (torch.arange(8) + 0.5).double() / 8 * 4)
    owner = shards.owners(mass, t)
    assert owner.tolist() == [0] * 6 + [1] * 2
    f = shards.local_fractions(mass, t, owner, 1)
    assert torch.allclose(f[6:], torch.tensor([0.25, 0.75], dtype=torch.float64)) and torch.all(f[:6] == 0)
    assert torch.allclose(shards.ratios(mass), torch.tensor([1.5, 0.5], dtype=torch.float64))


def test_shared_uniforms_advance_the_counter_and_keys_differ():
    counter = torch.zeros(1, dtype=torch.int64)
    a = shards.shared_uniforms(5, counter, 4)
    b = shards.shared_uniforms(5, counter, 4)
    assert int(counter) == 8 and not torch.equal(a, b) and bool(((a >= 0) & (a < 1)).all())
    keys = {shards.derive_key(0, s) for s in range(100)} | {shards.derive_key(1, 0)}
    assert len(keys) == 101 and all(0 <= k < 2**63 for k in keys)
