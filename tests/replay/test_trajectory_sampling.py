"""TrajectoryReplayBuffer's sampling distribution over its drawable starts, and its determinism.

The buffer holds random streams (ring wrapped, episodes ended both ways, unflagged resets) and
priorities spread over five orders of magnitude; many draws are tested with a chi-square against
``p_i / sum p`` over the drawable starts (stratified: also stratum by stratum; uniform: 1/N over
the drawable starts only; rank: ``rank ** -alpha`` over the drawable starts only). Slots that
are not drawable starts must never be drawn. The sampler is a deterministic function of (seed,
counter), so a fixed-seed test gives the same verdict on every run; the thresholds
(:func:`fuzz_model.chi2_threshold`) are at tail probabilities near 1e-10, and each test also
shows that the same draws reject a distribution 10% off on half the starts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fuzz_model import chi2, chi2_groups, chi2_threshold, surely_rejected
from oracle import cumulative, rank_weights
from trajectory_helpers import Run

#: 4 streams of 128 rows, window 8: about 450 drawable starts after 200 adds
NUM_ENVS, ROWS, WINDOW, ADDS = 4, 128, 8, 200
B, CALLS = 2048, 160


def filled(sampling: str, seed: int = 0, spread: bool = True, **kw) -> Run:
    run = Run(NUM_ENVS * ROWS, NUM_ENVS, WINDOW, seed=seed, sampling=sampling, stream_seed=21, **kw)
    for _ in range(ADDS):
        run.add()
    if spread:
        # every drawable start gets its own priority, over five orders of magnitude
        slots = [i for i, d in enumerate(run.orc.drawable()) if d]
        td = (10.0 ** np.random.default_rng(seed).uniform(-3, 2, len(slots))).astype(np.float32)
        run.rb.update_priorities(torch.tensor(slots), torch.from_numpy(td))
        run.orc.update(slots, [run.orc.priority(float(x)) for x in td], None)
    return run


def draw_counts(run: Run, calls: int = CALLS, b: int = B) -> list[int]:
    counts = torch.zeros(run.capacity, dtype=torch.int64)
    for _ in range(calls):
        counts += torch.bincount(run.rb.sample(b).indices, minlength=run.capacity)
    return counts.tolist()


def mass_groups(probs: list[float], groups: int) -> list[list[int]]:
    """Contiguous runs of positions of about equal probability mass (an error on a contiguous half
    of them moves whole groups, so few groups tell it with fewer draws than one group a slot)."""
    out, run, mass = [], [], 0.0
    for i, p in enumerate(probs):
        run.append(i)
        mass += p
        if mass >= (len(out) + 1) / groups:
            out.append(run)
            run = []
    if run:
        out[-1] += run
    return out


def assert_follows(counts: list[int], probs: list[float], drawable: list[bool], what: str) -> None:
    """No draw outside the drawable starts; chi-squares over them (one group per few slots, and 40
    groups of equal mass) within the threshold; probabilities 10% off on half of them surely rejected."""
    outside = [i for i, (c, d) in enumerate(zip(counts, drawable, strict=True)) if c and not d]
    assert not outside, f"{what}: drew slots that are not drawable starts: {outside[:10]}"
    inside = [i for i, d in enumerate(drawable) if d]
    p = [probs[i] for i in inside]
    c = [counts[i] for i in inside]
    n = sum(c)
    assert math.isclose(math.fsum(p), 1.0, rel_tol=1e-9)
    fine = chi2_groups(p, n)
    stat, df = chi2(c, p, fine)
    assert df >= 100, f"{what}: only {df} degrees of freedom"
    assert stat < chi2_threshold(df), f"{what}: chi-square {stat:.1f} over {df} df, threshold {chi2_threshold(df):.1f}"
    coarse = mass_groups(p, 40)
    stat, df = chi2(c, p, coarse)
    assert stat < chi2_threshold(df), f"{what}: 40-group chi-square {stat:.1f} over {df} df"
    wrong = [q * (1.1 if k < len(p) // 2 else 1.0) for k, q in enumerate(p)]
    total = math.fsum(wrong)
    wrong = [q / total for q in wrong]
    assert surely_rejected(p, wrong, coarse, n), f"{what}: too few draws to tell a 10% error"
    stat_wrong, _ = chi2(c, wrong, coarse)
    assert stat_wrong > chi2_threshold(df), f"{what}: the draws do not reject probabilities 10% off"


def test_proportional_follows_the_priorities_of_drawable_starts():
    run = filled("proportional")
    run.check_state("after spreading the priorities")
    assert_follows(draw_counts(run), run.orc.probabilities(), run.orc.drawable(), "proportional")


def test_stratified_draws_one_per_stratum_and_follow_the_priorities():
    run = filled("stratified")
    cum = cumulative(run.orc.priorities)  # in slot order: the tree's leaf order
    total = cum[-1]
    for b in (1, 33, 256):
        idx = run.rb.sample(b).indices.tolist()
        assert idx == sorted(idx), "strata are visited in order of cumulative mass"
        for s, i in enumerate(idx):
            lo, hi = s / b * total, (s + 1) / b * total
            slack = 1e-6 * total
            assert cum[i] < hi + slack and cum[i + 1] > lo - slack, (b, s, i, cum[i], cum[i + 1], lo, hi)
    assert_follows(draw_counts(run), run.orc.probabilities(), run.orc.drawable(), "stratified")


def test_uniform_draws_every_drawable_start_alike_and_nothing_else():
    run = filled("uniform", spread=False)
    drawable = run.orc.drawable()
    n = sum(drawable)
    counts = draw_counts(run)
    assert_follows(counts, [1.0 / n if d else 0.0 for d in drawable], drawable, "uniform")
    batch = run.rb.sample(64)
    assert torch.equal(batch.weights, torch.ones(64)), "uniform draws carry weight 1"


def test_rank_mode_ranks_the_drawable_starts_only():
    alpha = 0.7
    run = filled("rank", alpha=alpha, rank_refresh_interval=1)  # the spreading update refreshes the ranks
    drawable = run.orc.drawable()
    inside = [i for i, d in enumerate(drawable) if d]
    keys = [run.orc.priorities[i] for i in inside]  # distinct, so the ranks are unambiguous
    assert len(set(keys)) == len(keys)
    want = [0.0] * run.capacity
    for i, w in zip(inside, rank_weights(keys, alpha), strict=True):
        want[i] = w
    got = run.rb.priorities(torch.arange(run.capacity)).tolist()
    for i in range(run.capacity):
        assert math.isclose(got[i], want[i], rel_tol=1e-6), (i, drawable[i], got[i], want[i])
    total = math.fsum(want)
    assert_follows(draw_counts(run), [w / total for w in want], drawable, "rank")
    # a start that becomes drawable after the refresh enters at rank 1: weight 1
    before = run.orc.drawable()
    run.add()
    new = [i for i, d in enumerate(run.orc.drawable()) if d and not before[i]]
    assert new and run.rb.priorities(torch.tensor(new)).tolist() == [1.0] * len(new)


def test_batch_weight_norm_divides_by_the_batchs_largest_weight():
    run = filled("proportional", weight_norm="batch")
    batch = run.rb.sample(256, beta=0.7)
    p = [run.orc.priorities[i] for i in batch.indices.tolist()]
    w = [x**-0.7 for x in p]
    top = max(w)
    for n, (got, x) in enumerate(zip(batch.weights.tolist(), w, strict=True)):
        assert math.isclose(got, x / top, rel_tol=3e-5), (n, got, x / top)


@pytest.mark.parametrize("kind", ["sample", "sequences"])
def test_same_seed_same_draws_other_seed_other_draws(kind):
    runs = [filled("proportional", seed=s, spread=False) for s in (5, 5, 6)]
    out = []
    for run in runs:
        if kind == "sample":
            draws = [run.rb.sample(64, n_step=3, gamma=0.9) for _ in range(3)]
        else:
            draws = [run.rb.sample_sequences(16, 5, burn_in=2) for _ in range(3)]
        out.append([(d.indices.clone(), {k: d[k].clone() for k in d}) for d in draws])
    for (ia, fa), (ib, fb) in zip(out[0], out[1], strict=True):
        assert torch.equal(ia, ib)
        for k in fa:
            assert same_bits(fa[k], fb[k]), k
    assert not all(torch.equal(a[0], c[0]) for a, c in zip(out[0], out[2], strict=True)), "seeds 5 and 6 drew the same"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
