"""The shard math in one process (gper.distributed.shards and the torch kernels of
gper.ops.shard.reference): owners follow the cumulative masses (a shard of mass 0 is never
picked), stratified thresholds cover every stratum, keys differ per stream."""

from __future__ import annotations

import torch

from gper.distributed import shards
from gper.ops.shard import reference as draws


def test_owners_follow_cumulative_mass_and_skip_empty_shards():
    mass = torch.tensor([2.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    t = torch.tensor([0.0, 1.999, 2.0, 2.999, 3.0, 3.999], dtype=torch.float64)
    cum = mass.cumsum(0)
    assert draws.owners(cum, t).tolist() == [0, 0, 2, 2, 3, 3]
    u = torch.linspace(0, 1 - 2**-32, 10001, dtype=torch.float64)
    counts = torch.bincount(draws.owners(cum, draws.thresholds(cum, u, False)), minlength=4)
    assert counts[1] == 0 and abs(int(counts[0]) - 5000) <= 2 and abs(int(counts[2]) - 2500) <= 2


def test_stratified_thresholds_one_per_stratum_and_local_fractions_in_range():
    mass = torch.tensor([3.0, 1.0], dtype=torch.float64)
    u = torch.full((8,), 0.5, dtype=torch.float64)
    cum = mass.cumsum(0)
    t = draws.thresholds(cum, u, True)
    assert torch.allclose(t, (torch.arange(8) + 0.5).double() / 8 * 4)
    owner = draws.owners(cum, t)
    assert owner.tolist() == [0] * 6 + [1] * 2
    f = draws.local_fractions(cum, mass, t, owner, 1)
    assert torch.allclose(f[6:], torch.tensor([0.25, 0.75], dtype=torch.float64)) and torch.all(f[:6] == 0)
    leaves = torch.tensor([0.0, 2.0])
    for rank, want in ((0, 1.5), (1, 0.5)):  # local mode's ratios W m_k / S
        ratio, p, owners = draws.local_priorities(
            cum=cum, mass=mass, leaves=leaves, indices=torch.tensor([1, 0]), rank=rank, uniform=False
        )
        assert float(ratio) == want and p.tolist() == [2.0, 0.0] and owners.tolist() == [rank, rank]


def test_shared_draws_advance_the_counter_and_keys_differ():
    counter, ticket = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    cum = torch.tensor([1.0], dtype=torch.float64)
    kw = dict(cum=cum, mass=cum, counter=counter, ticket=ticket, key=5, n=4, stratified=False, rank=0)
    a, _, _ = draws.shared_draws(**kw)
    b, _, _ = draws.shared_draws(**kw)
    assert int(counter) == 8 and not torch.equal(a, b) and bool(((a >= 0) & (a < 1)).all())
    keys = {shards.derive_key(0, s) for s in range(100)} | {shards.derive_key(1, 0)}
    assert len(keys) == 101 and all(0 <= k < 2**63 for k in keys)
