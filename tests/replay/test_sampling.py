"""Sampling: through the public API (IS weights, seeds, the RNG counter, each sampling mode, on the
CPU and on CUDA through the device fixture), and the policy objects behind it (SamplingPolicy,
RankKeys, ExponentInput)."""

from __future__ import annotations

import math

import pytest
import torch

from gper.ops.state import C_SIZE, MODE_PROPORTIONAL, MODE_STRATIFIED, MODE_UNIFORM, S_BETA, S_MAXP, rng_blocks
from gper.ops.tree import reference
from gper.replay.exponent import ExponentInput
from gper.replay.samplers import SAMPLING, RankKeys, SamplingPolicy
from gper.replay.tree import PriorityTree
from helpers import (
    EPS_DYADIC,
    assert_verbose_allclose,
    assert_verbose_equal,
    check_tree,
    dyadic_td,
    make_buffer,
    transitions,
)
from oracle import OracleBuffer, cumulative, rank_weights


def filled_buffer(backend: str, capacity: int = 200, n: int = 150, device: torch.device | str = "cpu", **kw):
    """A buffer of ``n`` items with priorities ``2^(k/2)``, k in -3..7, and its oracle."""
    alpha = kw.pop("alpha", 0.5)
    rb = make_buffer(capacity, backend, device, alpha=alpha, eps=EPS_DYADIC, arity=4, **kw)
    orc = OracleBuffer(capacity, alpha, EPS_DYADIC)
    rb.add(transitions(n))
    orc.add(n)
    idx = torch.arange(n)
    k = (idx * 7) % 11 - 3
    td = dyadic_td(k)
    rb.update_priorities(idx.to(rb.device), td.to(rb.device))
    orc.update(idx.tolist(), td.tolist())
    return rb, orc


@pytest.mark.parametrize("norm", ["global", "batch"])
@pytest.mark.parametrize("sampling", ["proportional", "stratified"])
def test_is_weights_closed_form(backend, device, sampling, norm):
    rb, orc = filled_buffer(backend, device=device, sampling=sampling, weight_norm=norm)
    for beta in [0.0, 0.4, 1.0]:
        batch = rb.sample(64, beta=beta)
        want = orc.weights(batch.indices.tolist(), beta, norm)
        assert_verbose_allclose(batch.weights, torch.tensor(want), rtol=1e-5, what=f"beta={beta}")
        if norm == "batch":
            assert float(batch.weights.max()) == 1.0
        else:
            assert float(batch.weights.max()) <= 1.0
    # the smallest priority in the buffer has weight exactly 1 under global normalisation
    if norm == "global":
        pmin = min(orc.priorities[:150])
        lowest = torch.tensor([i for i in range(150) if orc.priorities[i] == pmin], device=device)
        batch = rb.sample(2048, beta=0.7)
        hit = torch.isin(batch.indices, lowest)
        assert int(hit.sum()) > 10
        assert_verbose_allclose(batch.weights[hit], torch.ones(int(hit.sum())), rtol=1e-6)


def test_default_beta_and_tensor_beta_agree(backend, device):
    runs = []
    for beta in [None, 0.3, torch.tensor(0.3, device=device), torch.tensor(0.3, dtype=torch.float64, device=device)]:
        rb, orc = filled_buffer(backend, device=device, beta=0.3, seed=5)
        batch = rb.sample(40) if beta is None else rb.sample(40, beta=beta)
        runs.append(batch)
        want = orc.weights(batch.indices.tolist(), 0.3)
        assert_verbose_allclose(batch.weights, torch.tensor(want), rtol=1e-5)
    for other in runs[1:]:
        assert torch.equal(other.indices, runs[0].indices)
        assert torch.equal(other.weights, runs[0].weights)


def test_beta_tensor_is_read_at_each_call(backend, device):
    rb, orc = filled_buffer(backend, device=device)
    beta = torch.tensor(0.0, device=device)
    assert bool((rb.sample(32, beta=beta).weights == 1).all())
    beta.fill_(1.0)
    batch = rb.sample(32, beta=beta)
    assert_verbose_allclose(batch.weights, torch.tensor(orc.weights(batch.indices.tolist(), 1.0)), rtol=1e-5)
    # a float beta after a tensor one is not mistaken for the value cached before
    batch = rb.sample(32, beta=0.0)
    assert bool((batch.weights == 1).all())


def test_uniform_mode_weights_are_one_and_ignore_priorities(backend, device):
    rb, _ = filled_buffer(backend, device=device, sampling="uniform", weight_norm="batch")
    batch = rb.sample(512, beta=1.0)
    assert batch.weights.tolist() == [1.0] * 512
    assert int(batch.indices.max()) < 150
    counts = torch.bincount(batch.indices, minlength=150)
    # priorities span a factor 32; uniform draws do not follow them
    assert int(counts.max()) < 12


def test_same_seed_same_samples_and_different_seed_different(backend, device):
    def draws(seed):
        rb, _ = filled_buffer(backend, device=device, seed=seed)
        return [rb.sample(48).indices for _ in range(3)]

    a, b, c = draws(3), draws(3), draws(4)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not any(torch.equal(x, z) for x, z in zip(a, c, strict=True))
    # the counter advances: consecutive calls draw fresh samples
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])


def test_rng_counter_advances_by_blocks_per_sample(backend, device):
    rb, _ = filled_buffer(backend, device=device)
    depth = rb.tree.layout.depth
    assert rb.stats()["rng_offset"] == 0
    rb.sample(33)
    assert rb.stats()["rng_offset"] == 33 * rng_blocks(depth)
    rb.sample(1)
    assert rb.stats()["rng_offset"] == 34 * rng_blocks(depth)


def test_seed_and_counter_define_the_draws(backend, device):
    """Two buffers with the same contents draw the same samples once their counters agree."""
    rb1, _ = filled_buffer(backend, device=device, seed=9)
    rb2, _ = filled_buffer(backend, device=device, seed=9)
    rb1.sample(10)
    rb2.sample(4)
    rb2.sample(6)
    assert torch.equal(rb1.sample(20).indices, rb2.sample(20).indices)


@pytest.mark.parametrize("b", [1, 33, 256])
def test_stratified_sample_s_lies_in_stratum_s(backend, device, b):
    rb, orc = filled_buffer(backend, device=device, sampling="stratified", capacity=1000, n=1000)
    cum = cumulative(orc.priorities)
    total = cum[-1]
    for _ in range(2):
        idx = rb.sample(b).indices.tolist()
        assert idx == sorted(idx), "strata are visited in order of cumulative mass"
        for s, i in enumerate(idx):
            # the leaf's mass interval [cum[i], cum[i+1]) meets stratum [s/b, (s+1)/b) of the total
            lo, hi = s / b * total, (s + 1) / b * total
            slack = 1e-6 * total
            assert cum[i] < hi + slack and cum[i + 1] > lo - slack, (s, i, cum[i], cum[i + 1], lo, hi)


def test_stratified_counts_are_within_one_per_leaf_of_expectation(device):
    """With B strata, leaf i is drawn floor or ceil of B * P(i) times, give or take the two strata
    at its edges."""
    rb, orc = filled_buffer("torch", device=device, sampling="stratified", capacity=1000, n=1000)
    b = 2048
    probs = orc.probabilities()
    counts = torch.bincount(rb.sample(b).indices, minlength=1000).tolist()
    for i in range(1000):
        assert abs(counts[i] - b * probs[i]) < 2, (i, counts[i], b * probs[i])


def test_proportional_draws_only_filled_slots_and_follow_priorities(backend, device):
    rb, orc = filled_buffer(backend, device=device, capacity=64, n=40)
    idx = rb.sample(2048).indices
    assert int(idx.max()) < 40
    counts = torch.bincount(idx, minlength=64)
    hi = max(range(40), key=lambda i: orc.priorities[i])
    lo = min(range(40), key=lambda i: orc.priorities[i])
    assert int(counts[hi]) > 8 * int(counts[lo])


def test_rank_mode_priorities_follow_ranks(backend, device):
    alpha = 0.7
    slots = torch.arange(10, device=device)
    rb = make_buffer(10, backend, device, sampling="rank", alpha=alpha, eps=0.5, arity=4, rank_refresh_interval=1000)
    rb.add(transitions(10))
    assert rb.priorities(slots).tolist() == [1.0] * 10, "new items count as rank 1"
    td = torch.tensor([5.0, -1.0, 3.0, 9.0, 0.0, 2.0, 7.0, -4.0, 6.0, 8.0], device=device)
    rb.update_priorities(slots, td)
    assert rb.priorities(slots).tolist() == [1.0] * 10, "ranks change only at a refresh"
    rb.refresh_ranks()
    want = rank_weights([abs(x) + 0.5 for x in td.tolist()], alpha)
    assert_verbose_allclose(rb.priorities(slots), torch.tensor(want), rtol=1e-6)
    assert_verbose_allclose(rb.priorities(slots[3:4]), torch.tensor([1.0]), rtol=0)
    assert_verbose_allclose(rb.priorities(slots[4:5]), torch.tensor([10.0**-alpha]), rtol=1e-6)
    # overwrite two slots: they count as rank 1 until the next refresh, the rest keep their ranks
    rb.add(transitions(2, 10))
    got = rb.priorities(slots)
    assert got[:2].tolist() == [1.0, 1.0]
    assert_verbose_allclose(got[2:], torch.tensor(want[2:]), rtol=1e-6)
    # and they carry the largest key so far, so they rank first at the next refresh (ties by slot)
    rb.refresh_ranks()
    # a new item's key is the largest key stored, |9| + 0.5 (alpha applies to ranks, not keys)
    keys = [9.5, 9.5] + [abs(x) + 0.5 for x in td.tolist()[2:]]
    assert_verbose_allclose(rb.priorities(slots), torch.tensor(rank_weights(keys, alpha)), rtol=1e-6)


def test_rank_refresh_interval_is_honoured(backend, device):
    slots = torch.arange(6, device=device)
    rb = make_buffer(6, backend, device, sampling="rank", alpha=1.0, eps=0.5, rank_refresh_interval=3)
    rb.add(transitions(6))
    td = torch.tensor([1.0, 5.0, 3.0, 0.0, 4.0, 2.0], device=device)
    for call in range(1, 4):
        rb.update_priorities(slots, td)
        p = rb.priorities(slots).tolist()
        if call < 3:
            assert p == [1.0] * 6, f"refreshed after {call} updates, interval is 3"
    assert_verbose_allclose(torch.tensor(p), torch.tensor([1 / 5, 1, 1 / 3, 1 / 6, 1 / 2, 1 / 4]), rtol=1e-6)
    # the count restarts after a refresh
    rb.update_priorities(slots, -td.flip(0))
    assert_verbose_allclose(rb.priorities(slots), torch.tensor(p), rtol=0)


def test_rank_mode_samples_follow_rank_weights():
    rb = make_buffer(100, sampling="rank", alpha=1.0, eps=1.0, rank_refresh_interval=1, seed=2)
    rb.add(transitions(100))
    rb.update_priorities(torch.arange(100), torch.arange(100.0))
    counts = torch.zeros(100)
    for _ in range(20):
        counts += torch.bincount(rb.sample(2048).indices, minlength=100)
    # slot 99 has the largest key (rank 1), slot 0 the smallest (rank 100): weights 1 and 1/100
    h = sum(1 / r for r in range(1, 101))
    expected = torch.tensor([1 / (100 - i) / h for i in range(100)]) * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 250, chi2  # 99 degrees of freedom: the 1e-12 tail is near 230


def test_refresh_ranks_needs_rank_mode():
    rb = make_buffer(4)
    with pytest.raises(RuntimeError, match="rank"):
        rb.refresh_ranks()


def test_sample_batch_fields_are_the_stored_rows(backend, device):
    rb, _ = filled_buffer(backend, device=device)
    batch = rb.sample(33)
    assert batch.batch_size == 33 and set(batch) == {"obs", "action", "done"}
    for name, stored in rb.storage.items():
        assert torch.equal(batch[name], stored[batch.indices]), name
    assert batch["action"].tolist() == batch.indices.tolist()
    assert batch.generations.tolist() == rb.tree.gen[batch.indices].tolist()
    with pytest.raises(KeyError, match="nope"):
        batch["nope"]
    assert not math.isnan(float(batch.weights.sum()))


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
@pytest.mark.parametrize("capacity", [1, 2])
def test_tiny_capacities(backend, device, capacity, sampling):
    rb = make_buffer(capacity, backend, device, sampling=sampling, alpha=1.0, eps=0.5)
    rb.add(transitions(1))
    assert rb.sample(5).indices.tolist() == [0] * 5
    rb.add(transitions(3, 1))
    batch = rb.sample(64)
    assert set(batch.indices.tolist()) == set(range(capacity))
    rb.update_priorities(batch, torch.ones(64, device=device))
    holds = torch.tensor([[3], [2, 3]][capacity - 1], device=device)  # item k of 4 sits in slot k % capacity
    assert torch.equal(batch["action"], holds[batch.indices])


# ---- the policy objects


@pytest.mark.parametrize("mode", SAMPLING)
def test_sampling_policy_per_mode(device, mode):
    policy = SamplingPolicy.build(mode, "global", 10, device, refresh_interval=4)
    assert (policy.mode, policy.weight_norm) == (mode, "global")
    kernel = {"proportional": MODE_PROPORTIONAL, "stratified": MODE_STRATIFIED, "uniform": MODE_UNIFORM}
    assert policy.kernel_mode == kernel.get(mode, MODE_PROPORTIONAL), "rank mode draws in proportion to rank weights"
    if mode == "rank":
        assert isinstance(policy.rank, RankKeys) and policy.rank.refresh_interval == 4
        assert policy.new_item_value == 1.0, "a new item enters at rank 1"
        assert policy.state_dict() == {"key": policy.rank.keys}
        assert SamplingPolicy.estimate_bytes(mode, 10) == 4 * 11 == policy.rank.keys.numel() * 4
    else:
        assert policy.rank is None and policy.new_item_value is None, "a new item enters at the max priority"
        assert policy.state_dict() == {} and SamplingPolicy.estimate_bytes(mode, 10) == 0
        assert not any(policy.count_update() for _ in range(10)), "only rank mode refreshes"
        policy.updates_since_refresh = 7  # no rank keys: nothing to set
        assert policy.updates_since_refresh == 0


def test_sampling_policy_counts_updates_to_the_refresh(device):
    policy = SamplingPolicy.build("rank", "batch", 10, device, refresh_interval=3)
    assert [policy.count_update() for _ in range(3)] == [False, False, True]
    assert policy.updates_since_refresh == 3
    policy.updates_since_refresh = 1
    assert policy.rank.updates_since_refresh == 1 and policy.count_update() is False and policy.count_update()


@pytest.mark.parametrize("mode", SAMPLING)
@pytest.mark.parametrize("norm", ["global", "batch"])
def test_normalise_divides_by_the_batch_max_in_batch_mode_only(device, mode, norm):
    policy = SamplingPolicy.build(mode, norm, 10, device, refresh_interval=4)
    tree = PriorityTree.from_leaves([4.0, 2.0, 8.0], reference, arity=2, device=device)
    weights = torch.tensor([0.25, 0.5, 0.125], device=device)
    out = {"weights": weights, "indices": torch.tensor([0, 1, 2], device=device)}
    policy.normalise(out, tree, torch.tensor(1.0, device=device))
    assert out["weights"] is weights, "in place"
    want = [0.5, 1.0, 0.25] if norm == "batch" and mode != "uniform" else [0.25, 0.5, 0.125]
    assert weights.tolist() == want


def test_batch_normalisation_survives_global_weights_that_rounded_to_zero(device):
    """Every draw's priority 2^150 times the smallest stored: global weights are 0, the batch's are not."""
    policy = SamplingPolicy.build("proportional", "batch", 4, device, refresh_interval=4)
    tree = PriorityTree.from_leaves([2.0**-126, 2.0**24, 2.0**25, 2.0**26], reference, arity=2, device=device)
    out = {"weights": torch.zeros(3, device=device), "indices": torch.tensor([1, 2, 3], device=device)}
    policy.normalise(out, tree, torch.tensor(1.0, device=device))
    assert out["weights"].tolist() == [1.0, 0.5, 0.25]


def test_rank_keys_on_add_update_and_refresh(ops, device):
    alpha = 0.5
    tree = PriorityTree.from_leaves([1.0] * 6, ops, arity=2, size=4, device=device)
    keys = RankKeys(6, device, refresh_interval=2)
    assert keys.keys.shape == (7,) and keys.keys.dtype == torch.float32 and not bool(keys.keys.any())
    tree.scalars[S_MAXP] = 3.0
    keys.on_add(tree, torch.tensor([0, 1, 2, 3], device=device))
    assert keys.keys.tolist() == [3.0] * 4 + [0.0] * 3, "new items take the running max priority as key"
    idx = torch.tensor([1, 3, 1, 9], device=device)
    td = torch.tensor([4.0, -0.5, 1.5, 8.0], device=device)
    leaves_before = tree.leaves().clone()
    keys.update(tree, idx, td, None, eps=0.5)
    assert keys.keys[:4].tolist() == [3.0, 2.0, 3.0, 1.0], "|td| + eps, the last duplicate wins"
    assert torch.equal(tree.leaves(), leaves_before), "an update writes keys only, not the tree"
    assert int(tree.counters[C_SIZE]) == 4 and tree.read_counts()["invalid_indices"] == 1, "slot 9 is past the size"
    assert [keys.count_update(), keys.count_update()] == [False, True]
    keys.refresh(tree, 4, alpha)
    assert keys.updates_since_refresh == 0
    # keys 3, 2, 3, 1: ranks 1 and 2 for the tied slots 0 and 2 (ties by slot), 3 for slot 1, 4 for slot 3
    want = rank_weights([3.0, 2.0, 3.0, 1.0], alpha) + [1.0, 1.0]
    assert want[:4] == [1.0, 3**-alpha, 2**-alpha, 4**-alpha]
    assert_verbose_allclose(tree.leaves(), torch.tensor(want), rtol=1e-6, what="rank weights")
    check_tree(tree, tree.leaves().tolist(), "after a refresh")


def test_rank_keys_refresh_of_an_empty_buffer_touches_nothing(device):
    from gper.ops.tree import reference

    tree = PriorityTree(4, reference, device, arity=2)
    keys = RankKeys(4, device, refresh_interval=1)
    keys.updates_since_refresh = 5
    before = tree.tree.clone()
    keys.refresh(tree, 0, 0.7)
    assert keys.updates_since_refresh == 0 and torch.equal(tree.tree, before)


def test_beta_input_floats_write_the_scalar_only_when_they_change(device):
    scalars = torch.zeros(2, device=device)
    beta = ExponentInput(scalars[S_BETA])
    out = beta.tensor(0.4, graphed=False)
    assert out is beta.scalar and out.data_ptr() == scalars[S_BETA].data_ptr()
    assert_verbose_equal(out, torch.tensor(0.4), what="a float")
    assert float(beta.tensor(0.7, graphed=True)) == pytest.approx(0.7)
    scalars[S_BETA] = 0.9  # written behind its back (a checkpoint load does this)
    assert float(beta.tensor(0.7, graphed=False)) == pytest.approx(0.9), "the same float is not written twice"
    beta.forget()
    assert float(beta.tensor(0.7, graphed=False)) == pytest.approx(0.7), "after forget() it is written again"
    assert float(beta.tensor(1, graphed=False)) == 1.0, "an int in [0, 1] is a beta"
    for bad, exc in [(1.5, ValueError), (-0.1, ValueError), ("0.5", TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="beta"):
            beta.tensor(bad, graphed=False)


def test_beta_input_tensors_are_read_where_they_are_unless_graphed(device):
    scalars = torch.zeros(2, device=device)
    beta = ExponentInput(scalars[S_BETA])
    mine = torch.tensor(0.25, device=device)
    assert beta.tensor(mine, graphed=False) is mine, "a float32 tensor is read in place: no copy"
    assert float(scalars[S_BETA]) == 0.0
    # a captured graph reads the buffer's scalar, and a float64 tensor is not what the kernel reads
    assert beta.tensor(mine, graphed=True) is beta.scalar and float(scalars[S_BETA]) == 0.25
    wide = torch.tensor(0.5, dtype=torch.float64, device=device)
    assert beta.tensor(wide, graphed=False) is beta.scalar and float(scalars[S_BETA]) == 0.5
    # a float after a tensor is written even if it equals the last float written
    beta.tensor(0.6, graphed=False)
    beta.tensor(mine, graphed=True)
    assert float(beta.tensor(0.6, graphed=False)) == pytest.approx(0.6)
    for bad in [torch.tensor([0.5], device=device), torch.tensor(1, device=device), torch.tensor(0.5, device="meta")]:
        with pytest.raises(ValueError, match="beta tensor must be a 0-d float tensor"):
            beta.tensor(bad, graphed=False)
