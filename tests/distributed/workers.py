"""What each spawned rank runs in tests/distributed/test_sharded.py (importable by the spawned
processes). Every check compares against one buffer over the concatenated shards."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from gper.distributed import ShardedPrioritizedReplayBuffer

SPEC = {"who": ((2,), torch.int64)}
#: filled slots of shard k (capacity 16 each): unequal, one shard empty from W = 3 on
FILL = (16, 5, 0, 11)
PER_RANK = 16
EPS = 2.0**-126  # alpha = 1: priority |td| + eps, so td = 0 gives a priority no draw can reach


def td_of(rank: int, slot: int) -> float:
    return float((rank * 7 + slot * 3) % 5)  # 0 for some slots of every filled shard


def build(world: int, **kw) -> ShardedPrioritizedReplayBuffer:
    """A buffer with FILL items on each rank, ``who = (rank, slot)``, priorities td_of + eps."""
    args = dict(alpha=1.0, beta=0.5, eps=EPS, backend="torch", device="cpu", seed=7) | kw
    rb = ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, **args)
    rank = dist.get_rank()
    n = FILL[rank % len(FILL)]
    if n:
        who = torch.stack([torch.full((n,), rank), torch.arange(n)], 1)
        rb.add({"who": who})
        td = torch.tensor([td_of(rank, j) for j in range(n)])
        rb.shard.update_priorities(torch.arange(n), td)
    return rb


def oracle(world: int) -> torch.Tensor:
    """[W, PER_RANK] float64 priorities of one buffer over the shards (0 where empty)."""
    p = torch.zeros(world, PER_RANK, dtype=torch.float64)
    for k in range(world):
        for j in range(FILL[k % len(FILL)]):
            p[k, j] = torch.tensor(td_of(k, j) + EPS, dtype=torch.float32).double()
    return p


def chi_square_z(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Wilson–Hilferty z of the chi-square of ``counts`` against ``probs`` (cells of expected >= 1e-9 only)."""
    n = counts.sum()
    keep = probs * n > 1e-9
    exp = probs[keep] * n
    chi2 = float(((counts[keep] - exp) ** 2 / exp).sum())
    dof = int(keep.sum()) - 1
    return ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))


def draw_counts(rb, world: int, b: int, steps: int, check_rows=None) -> torch.Tensor:
    """[W, PER_RANK] float64 draw counts of (owner, slot) summed over the group."""
    counts = torch.zeros(world, PER_RANK, dtype=torch.float64)
    for _ in range(steps):
        batch = rb.sample(b)
        assert batch.indices.shape == (b,) and batch["who"].shape == (b, 2)
        # every row is its owner's row: the routing moved the right bytes
        assert torch.equal(batch["who"], torch.stack([batch.owners, batch.indices], 1))
        if check_rows is not None:
            check_rows(batch)
        counts.index_put_((batch.owners, batch.indices), torch.ones(b, dtype=torch.float64), accumulate=True)
    dist.all_reduce(counts)
    return counts


def exact_distribution(rank: int, world: int) -> None:
    """Exact mode: per-item chi-square against p_i / S, tiny-priority items and the empty shard
    never drawn, IS weights of one buffer (global and batch normalisation), stratified too."""
    p = oracle(world)
    probs = p / p.sum()
    filled = p > 0
    pmin = p[filled].min()
    for sampling in ("proportional", "stratified"):
        rb = build(world, sampling=sampling)

        def weights_ok(batch, p=p):
            want = (p[batch.owners, batch.indices] / pmin) ** -0.5
            assert torch.allclose(batch.weights.double(), want, rtol=1e-5, atol=0), (batch.weights, want)

        counts = draw_counts(rb, world, 64, 300 // world, weights_ok)
        assert counts[probs * counts.sum() < 1e-9].sum() == 0, "a zero-priority item or an empty slot was drawn"
        z = chi_square_z(counts.view(-1), probs.view(-1))
        # independent draws: |z| small; stratified: sub-multinomial, z far below 0 is right
        assert (abs(z) < 4) if sampling == "proportional" else (z < 4), (sampling, z)
    rb = build(world, weight_norm="batch")
    for _ in range(3):
        batch = rb.sample(32)
        everyone = [None] * world
        dist.all_gather_object(everyone, (batch.owners, batch.indices))
        owners = torch.cat([o for o, _ in everyone])
        slots = torch.cat([i for _, i in everyone])
        bmin = p[owners, slots].min()
        want = (p[batch.owners, batch.indices] / bmin) ** -0.5
        assert torch.allclose(batch.weights.double(), want, rtol=1e-5, atol=0)
    rb = build(world, sampling="uniform")
    counts = draw_counts(rb, world, 64, 300 // world)
    assert torch.all(counts[~filled] == 0) and torch.all(rb.sample(8).weights == 1)
    z = chi_square_z(counts[filled], torch.full((int(filled.sum()),), 1.0 / float(filled.sum())))
    assert abs(z) < 4, ("uniform", z)


def routing(rank: int, world: int) -> None:
    """Priorities go to the shard that owns each slot, last occurrence (rank, position) wins,
    stale entries are ignored; the max priority is shared by every shard after a draw."""
    rb = build(world)
    batch = rb.sample(8)
    td = (batch.owners * 100 + batch.indices + 1 + rank * 1000).float()
    everyone = [None] * world
    dist.all_gather_object(everyone, (batch.owners, batch.indices, td))
    # overwrite on shard 0 (full, cursor at 0) the slots up to the first one shard 0 drew
    drawn0 = [int(i) for o, idx, _ in everyone for i in idx[o == 0]]
    cut = drawn0[0] if drawn0 else -1
    if rank == 0 and cut >= 0:
        rb.add({"who": torch.full((cut + 1, 2), -1)})
    before = rb.shard.tree.leaves().clone()
    rb.update_priorities(batch, td)
    want, stale = {}, 0
    for owners, idx, t in everyone:
        for o, i, v in zip(owners.tolist(), idx.tolist(), t.tolist(), strict=True):
            if o == 0 and i <= cut:
                stale += 1
            else:
                want[(o, i)] = v + EPS
    leaves = rb.shard.tree.leaves()
    for slot in range(PER_RANK):
        expect = want.get((rank, slot))
        got = float(leaves[slot])
        assert got == (float(torch.tensor(expect)) if expect is not None else float(before[slot])), (rank, slot)
    st = rb.stats()
    assert st["stale_updates"] == stale and st["invalid_indices"] == 0, (st, stale)
    rb.sample(4)  # the gathered max reaches every shard
    top = torch.tensor([float(rb.shard.tree.max_priority())])
    every = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(every, top)
    assert all(float(x) == max(float(v) for v in want.values()) for x in every), every
    assert st["size"] == sum(FILL[k % 4] for k in range(world)) and st["shard_sizes"][rank] == FILL[rank % 4]


def determinism_and_checkpoint(rank: int, world: int, out: str) -> None:
    """The same seed gives the same samples; a state_dict restore continues exactly; another
    world size is refused on every rank; an empty buffer raises on every rank alike."""
    try:
        ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, backend="torch", device="cpu").sample(4)
        raise AssertionError("an empty sharded buffer sampled")
    except RuntimeError as err:
        assert "every shard is empty" in str(err)
    results = {}
    for mode in ("exact", "local"):
        a, b = build(world, mode=mode), build(world, mode=mode)
        draws = [(x.owners, x.indices, x.weights) for x in (a.sample(16) for _ in range(3))]
        again = [(x.owners, x.indices, x.weights) for x in (b.sample(16) for _ in range(3))]
        assert all(torch.equal(u, v) for d, e in zip(draws, again, strict=True) for u, v in zip(d, e, strict=True))
        other = build(world, mode=mode, seed=8).sample(16)
        if mode == "exact" or len(a) > 0:  # (an empty shard draws its slot 0, with weight 0, in local mode)
            assert not torch.equal(other.indices, draws[0][1]) or not torch.equal(other.owners, draws[0][0])
        results[mode] = draws
        # checkpoint: save, draw and update, restore (into the same and into a fresh buffer), draw again
        state = {k: v for k, v in a.state_dict().items()}
        state = {
            "shard": {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state["shard"].items()},
            "distributed": dict(state["distributed"]),
            "shared_rng": state["shared_rng"].clone(),
        }
        first = [a.sample(16) for _ in range(2)]
        a.update_priorities(first[0], torch.rand(16))
        a.load_state_dict(state)
        fresh = ShardedPrioritizedReplayBuffer(
            PER_RANK * world, SPEC, alpha=1.0, beta=0.5, eps=EPS, backend="torch", device="cpu", seed=7, mode=mode
        )
        fresh.load_state_dict(state)
        for rb in (a, fresh):
            for want in first:
                got = rb.sample(16)
                assert torch.equal(got.indices, want.indices) and torch.equal(got.weights, want.weights)
                assert torch.equal(got["who"], want["who"])
        wrong = dict(state, distributed=dict(state["distributed"], world_size=world + 1))
        try:
            a.load_state_dict(wrong)
            raise AssertionError("a state of another world size was loaded")
        except ValueError as err:
            assert "world size" in str(err)
        # a state that is wrong on one rank only is refused on every rank
        odd = wrong if rank == world - 1 else state
        try:
            a.load_state_dict(odd)
            raise AssertionError("a state refused on one rank was loaded on the others")
        except ValueError:
            pass
    torch.save(results, f"{out}/rank{rank}.pt")


def local_unbiased(rank: int, world: int) -> None:
    """Local mode: the ratio-weighted mean of f over many draws is one buffer's E_P[w f] within
    5 standard errors; without the ratio it is not (the shards are unequal)."""
    rb = build(world, mode="local")
    p = oracle(world)
    probs = p / p.sum()
    filled = p > 0
    w_true = torch.where(filled, (p / p[filled].min()) ** -0.5, 0.0)
    # f weighs shard 0 most, whose share T_0 / S is not 1 / W: weighting the shards equally (no ratio) moves the mean
    f = torch.where(torch.arange(world)[:, None] == 0, 10.0, 1.0) * (torch.arange(PER_RANK) % 3 + 1).double()
    target = float((probs * w_true * f).sum())
    sums = torch.zeros(4, dtype=torch.float64)  # sum wf, sum (wf)^2, sum unscaled wf, n
    ratio = world * p[rank].sum() / p.sum()
    for _ in range(400 // world):
        batch = rb.sample(64)
        wf = batch.weights.double() * f[batch.owners, batch.indices]
        sums += torch.stack([wf.sum(), (wf**2).sum(), (wf / ratio).nan_to_num(0.0).sum(), torch.tensor(64.0)])
    dist.all_reduce(sums)
    mean, n = float(sums[0] / sums[3]), float(sums[3])
    se = math.sqrt(max(float(sums[1] / n) - mean**2, 0.0) / n)
    assert abs(mean - target) < 5 * se, (mean, target, se)
    assert abs(float(sums[2] / n) - target) > 5 * se, ("no ratio, no bias?", float(sums[2] / n), mean, target, se)
    st = rb.stats()
    r = world * p.sum(1) / p.sum()
    assert math.isclose(st["max_ratio_deviation"], float((r - 1).abs().max()), rel_tol=1e-6)


def bad_arguments(rank: int, world: int) -> None:
    for kw, what in ((dict(sampling="rank"), "rank"), (dict(mode="global"), "mode")):
        try:
            ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, backend="torch", device="cpu", **kw)
            raise AssertionError(f"{kw} accepted")
        except ValueError as err:
            assert what in str(err)
    try:
        ShardedPrioritizedReplayBuffer(PER_RANK * world + 1, SPEC, backend="torch", device="cpu")
        raise AssertionError("a capacity that is not a multiple of the world size was accepted")
    except ValueError as err:
        assert "multiple of the world size" in str(err)
    try:  # settings that differ between ranks are refused on every rank, before any draw
        ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, backend="torch", device="cpu", seed=rank)
        raise AssertionError("ranks with different seeds built a buffer")
    except ValueError as err:
        assert "different settings" in str(err)


def everything(rank: int, world: int, out: str) -> None:
    bad_arguments(rank, world)
    exact_distribution(rank, world)
    routing(rank, world)
    local_unbiased(rank, world)
    determinism_and_checkpoint(rank, world, out)
