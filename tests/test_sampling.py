"""Sampling through the public API: IS weights, seeds, the RNG counter, and each sampling mode."""

from __future__ import annotations

import math

import pytest
import torch

from gper.ops.state import rng_blocks
from helpers import (
    EPS_DYADIC,
    assert_verbose_allclose,
    dyadic_td,
    make_buffer,
    transitions,
)
from oracle import OracleBuffer, cumulative, rank_weights


def filled_buffer(backend: str, capacity: int = 200, n: int = 150, **kw):
    """A buffer of ``n`` items with priorities ``2^(k/2)``, k in -3..7, and its oracle."""
    alpha = kw.pop("alpha", 0.5)
    rb = make_buffer(capacity, backend, alpha=alpha, eps=EPS_DYADIC, arity=4, **kw)
    orc = OracleBuffer(capacity, alpha, EPS_DYADIC)
    rb.add(transitions(n))
    orc.add(n)
    idx = torch.arange(n)
    k = (idx * 7) % 11 - 3
    td = dyadic_td(k)
    rb.update_priorities(idx, td)
    orc.update(idx.tolist(), td.tolist())
    return rb, orc


@pytest.mark.parametrize("norm", ["global", "batch"])
@pytest.mark.parametrize("sampling", ["proportional", "stratified"])
def test_is_weights_closed_form(backend, sampling, norm):
    rb, orc = filled_buffer(backend, sampling=sampling, weight_norm=norm)
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
        lowest = torch.tensor([i for i in range(150) if orc.priorities[i] == pmin])
        batch = rb.sample(2048, beta=0.7)
        hit = torch.isin(batch.indices, lowest)
        assert int(hit.sum()) > 10
        assert_verbose_allclose(batch.weights[hit], torch.ones(int(hit.sum())), rtol=1e-6)


def test_default_beta_and_tensor_beta_agree(backend):
    runs = []
    for beta in [None, 0.3, torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64)]:
        rb, orc = filled_buffer(backend, beta=0.3, seed=5)
        batch = rb.sample(40) if beta is None else rb.sample(40, beta=beta)
        runs.append(batch)
        want = orc.weights(batch.indices.tolist(), 0.3)
        assert_verbose_allclose(batch.weights, torch.tensor(want), rtol=1e-5)
    for other in runs[1:]:
        assert torch.equal(other.indices, runs[0].indices)
        assert torch.equal(other.weights, runs[0].weights)


def test_beta_tensor_is_read_at_each_call(backend):
    rb, orc = filled_buffer(backend)
    beta = torch.tensor(0.0)
    assert bool((rb.sample(32, beta=beta).weights == 1).all())
    beta.fill_(1.0)
    batch = rb.sample(32, beta=beta)
    assert_verbose_allclose(batch.weights, torch.tensor(orc.weights(batch.indices.tolist(), 1.0)), rtol=1e-5)
    # a float beta after a tensor one is not mistaken for the value cached before
    batch = rb.sample(32, beta=0.0)
    assert bool((batch.weights == 1).all())


def test_uniform_mode_weights_are_one_and_ignore_priorities(backend):
    rb, _ = filled_buffer(backend, sampling="uniform", weight_norm="batch")
    batch = rb.sample(512, beta=1.0)
    assert batch.weights.tolist() == [1.0] * 512
    assert int(batch.indices.max()) < 150
    counts = torch.bincount(batch.indices, minlength=150)
    # priorities span a factor 32; uniform draws do not follow them
    assert int(counts.max()) < 12


def test_same_seed_same_samples_and_different_seed_different(backend):
    def draws(seed):
        rb, _ = filled_buffer(backend, seed=seed)
        return [rb.sample(48).indices for _ in range(3)]

    a, b, c = draws(3), draws(3), draws(4)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not any(torch.equal(x, z) for x, z in zip(a, c, strict=True))
    # the counter advances: consecutive calls draw fresh samples
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])


def test_rng_counter_advances_by_blocks_per_sample(backend):
    rb, _ = filled_buffer(backend)
    depth = rb._tree_layout.depth
    assert rb.stats()["rng_offset"] == 0
    rb.sample(33)
    assert rb.stats()["rng_offset"] == 33 * rng_blocks(depth)
    rb.sample(1)
    assert rb.stats()["rng_offset"] == 34 * rng_blocks(depth)


def test_seed_and_counter_define_the_draws(backend):
    """Two buffers with the same contents draw the same samples once their counters agree."""
    rb1, _ = filled_buffer(backend, seed=9)
    rb2, _ = filled_buffer(backend, seed=9)
    rb1.sample(10)
    rb2.sample(4)
    rb2.sample(6)
    assert torch.equal(rb1.sample(20).indices, rb2.sample(20).indices)


@pytest.mark.parametrize("b", [1, 33, 256])
def test_stratified_sample_s_lies_in_stratum_s(backend, b):
    rb, orc = filled_buffer(backend, sampling="stratified", capacity=1000, n=1000)
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


def test_stratified_counts_are_within_one_per_leaf_of_expectation():
    """With B strata, leaf i is drawn floor or ceil of B * P(i) times, give or take the two strata
    at its edges."""
    rb, orc = filled_buffer("torch", sampling="stratified", capacity=1000, n=1000)
    b = 2048
    probs = orc.probabilities()
    counts = torch.bincount(rb.sample(b).indices, minlength=1000).tolist()
    for i in range(1000):
        assert abs(counts[i] - b * probs[i]) < 2, (i, counts[i], b * probs[i])


def test_proportional_draws_only_filled_slots_and_follow_priorities(backend):
    rb, orc = filled_buffer(backend, capacity=64, n=40)
    idx = rb.sample(2048).indices
    assert int(idx.max()) < 40
    counts = torch.bincount(idx, minlength=64)
    hi = max(range(40), key=lambda i: orc.priorities[i])
    lo = min(range(40), key=lambda i: orc.priorities[i])
    assert int(counts[hi]) > 8 * int(counts[lo])


def test_rank_mode_priorities_follow_ranks(backend):
    alpha = 0.7
    rb = make_buffer(10, backend, sampling="rank", alpha=alpha, eps=0.5, arity=4, rank_refresh_interval=1000)
    rb.add(transitions(10))
    assert rb.priorities(torch.arange(10)).tolist() == [1.0] * 10, "new items count as rank 1"
    td = torch.tensor([5.0, -1.0, 3.0, 9.0, 0.0, 2.0, 7.0, -4.0, 6.0, 8.0])
    rb.update_priorities(torch.arange(10), td)
    assert rb.priorities(torch.arange(10)).tolist() == [1.0] * 10, "ranks change only at a refresh"
    rb.refresh_ranks()
    want = rank_weights([abs(x) + 0.5 for x in td.tolist()], alpha)
    assert_verbose_allclose(rb.priorities(torch.arange(10)), torch.tensor(want), rtol=1e-6)
    assert_verbose_allclose(rb.priorities(torch.tensor([3])), torch.tensor([1.0]), rtol=0)
    assert_verbose_allclose(rb.priorities(torch.tensor([4])), torch.tensor([10.0**-alpha]), rtol=1e-6)
    # overwrite two slots: they count as rank 1 until the next refresh, the rest keep their ranks
    rb.add(transitions(2, 10))
    got = rb.priorities(torch.arange(10))
    assert got[:2].tolist() == [1.0, 1.0]
    assert_verbose_allclose(got[2:], torch.tensor(want[2:]), rtol=1e-6)
    # and they carry the largest key so far, so they rank first at the next refresh (ties by slot)
    rb.refresh_ranks()
    # a new item's key is the largest key stored, |9| + 0.5 (alpha applies to ranks, not keys)
    keys = [9.5, 9.5] + [abs(x) + 0.5 for x in td.tolist()[2:]]
    assert_verbose_allclose(rb.priorities(torch.arange(10)), torch.tensor(rank_weights(keys, alpha)), rtol=1e-6)


def test_rank_refresh_interval_is_honoured(backend):
    rb = make_buffer(6, backend, sampling="rank", alpha=1.0, eps=0.5, rank_refresh_interval=3)
    rb.add(transitions(6))
    td = torch.tensor([1.0, 5.0, 3.0, 0.0, 4.0, 2.0])
    for call in range(1, 4):
        rb.update_priorities(torch.arange(6), td)
        p = rb.priorities(torch.arange(6)).tolist()
        if call < 3:
            assert p == [1.0] * 6, f"refreshed after {call} updates, interval is 3"
    assert_verbose_allclose(torch.tensor(p), torch.tensor([1 / 5, 1, 1 / 3, 1 / 6, 1 / 2, 1 / 4]), rtol=1e-6)
    # the count restarts after a refresh
    rb.update_priorities(torch.arange(6), -td.flip(0))
    assert_verbose_allclose(rb.priorities(torch.arange(6)), torch.tensor(p), rtol=0)


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


def test_sample_batch_fields_are_the_stored_rows(backend):
    rb, _ = filled_buffer(backend)
    batch = rb.sample(33)
    assert batch.batch_size == 33 and set(batch) == {"obs", "action", "done"}
    for name, stored in rb.storage.items():
        assert torch.equal(batch[name], stored[batch.indices]), name
    assert batch["action"].tolist() == batch.indices.tolist()
    assert batch.generations.tolist() == rb._gen[batch.indices].tolist()
    with pytest.raises(KeyError, match="nope"):
        batch["nope"]
    assert not math.isnan(float(batch.weights.sum()))


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "uniform", "rank"])
@pytest.mark.parametrize("capacity", [1, 2])
def test_tiny_capacities(backend, capacity, sampling):
    rb = make_buffer(capacity, backend, sampling=sampling, alpha=1.0, eps=0.5)
    rb.add(transitions(1))
    assert rb.sample(5).indices.tolist() == [0] * 5
    rb.add(transitions(3, 1))
    batch = rb.sample(64)
    assert set(batch.indices.tolist()) == set(range(capacity))
    rb.update_priorities(batch, torch.ones(64))
    holds = torch.tensor([[3], [2, 3]][capacity - 1])  # item k of 4 sits in slot k % capacity
    assert torch.equal(batch["action"], holds[batch.indices])
