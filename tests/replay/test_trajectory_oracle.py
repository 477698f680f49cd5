"""TrajectoryReplayBuffer against the plain-Python oracle of docs/trajectory.md (tests/trajectory_oracle.py).

Random streams (tests/trajectory_streams.py: both Gymnasium autoreset styles, unflagged resets,
episodes of length 1 and longer than the ring, NaN and -0.0 in observations) go into the buffer
and the oracle. After every add the drawable starts, the stored priorities and the counters must
equal the oracle's; every draw of ``sample`` (n_step 1, 2, 3, window; random gamma) and of
``sample_sequences`` (burn-in included, across the ring's wrap) must equal the oracle's item for
its start, field by field, bit for bit (n-step rewards and discounts too); and
priority updates (1-step, R2D2 mix of sequences, raw indices, stale, NaN) must land as the
oracle's. Both back ends, Triton under the interpreter at tiny sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gper
from trajectory_helpers import SPEC, Run, make_buffer, numpy_spec, to_torch
from trajectory_oracle import END, TrajectoryOracle
from trajectory_streams import StreamGenerator


@pytest.mark.parametrize("num_envs, t, window", [(3, 10, 4), (2, 3, 1), (1, 12, 10), (5, 7, 5)])
def test_the_oracles_drawable_rule_is_its_definition(num_envs, t, window):
    """The oracle's incremental rule (as ``add`` maintains it) equals the definition of a drawable
    start after every add, and it reads the generated streams as the generator meant them."""
    gen = StreamGenerator(num_envs, seed=num_envs * 100 + t, long_length=3 * t)
    orc = TrajectoryOracle(num_envs * t, num_envs, numpy_spec(SPEC), window)
    for step in range(300):
        orc.add(gen.step())
        assert orc.drawable() == orc.drawable_by_definition(), f"add {step}"
    assert orc.discontinuities == gen.discontinuities > 0
    ends = sum(r.kind == END for s in orc.streams for r in s.rows)
    open_ends = sum(s.ended for s in orc.streams)  # an episode's end row comes with the next add
    assert ends == gen.episodes_ended - open_ends + gen.discontinuities


class Coverage:
    """What a run's draws went through, so the run is known to have tested it."""

    def __init__(self):
        self.seen = dict.fromkeys(
            ["episode end in n-step", "terminated", "truncated only", "sequence past an end",
             "burn-in cut by episode", "burn-in cut by overwrite", "sequence across the wrap", "stale"],
            0,
        )  # fmt: skip

    def transitions(self, run: Run, idx: list[int], n_step: int) -> None:
        for slot in idx:
            want = run.orc.transition(slot, n_step, 0.5)
            _, k, j = run.orc._start(slot)
            self.seen["episode end in n-step"] += j <= n_step
            self.seen["terminated"] += bool(want["terminated"])
            self.seen["truncated only"] += bool(want["truncated"]) and not bool(want["terminated"])

    def sequences(self, run: Run, idx: list[int], length: int, burn_in: int) -> None:
        t = run.orc.T
        for slot in idx:
            rows, k, j = run.orc._start(slot)
            self.seen["sequence past an end"] += j < length
            self.seen["sequence across the wrap"] += (k - burn_in) // t != (k + length) // t
            for r in range(k - burn_in, k):
                if 0 <= r and r >= len(rows) - t and rows[r].episode != rows[k].episode:
                    self.seen["burn-in cut by episode"] += 1
                elif 0 <= r < len(rows) - t and rows[r].episode == rows[k].episode:
                    self.seen["burn-in cut by overwrite"] += 1


def random_run(
    backend: str,
    num_envs: int,
    t: int,
    window: int,
    adds: int,
    every: int,
    b: int,
    seed: int,
    zeros: bool = False,
    pixels: bool = False,
):
    """A random run checked against the oracle after every add (``zeros``: also the zeros of the
    steps a sequence's mask drops, which :func:`test_masked_out_steps_are_zero` checks on its own)."""
    run = Run(num_envs * t, num_envs, window, backend, seed=seed, pixels=pixels)
    cov = Coverage()
    pending = []  # draws whose update comes after the next add (some entries go stale)
    n_steps = sorted({n for n in (1, 2, 3, window) if n <= window})
    for step in range(adds):
        run.add()
        where = f"add {step}"
        for call in pending:
            call()
        pending = []
        run.check_state(where)
        if step < window or step % every:
            continue
        for n in n_steps:
            gamma = run.random_gamma(n)
            beta = [None, 0.0, 1.0, float(run.rng.uniform())][int(run.rng.integers(0, 4))]
            batch, idx, gens = run.check_sample(b, n, gamma, beta, where)
            cov.transitions(run, idx, n)
            if run.rng.random() < 0.5:
                run.update_batch(batch, idx, gens)
            else:
                pending.append(lambda batch=batch, idx=idx, gens=gens: run.update_batch(batch, idx, gens))
        length = int(run.rng.integers(1, window + 1))
        burn_in = int(run.rng.integers(0, t - length + 1))
        seq, idx, gens, masks = run.check_sequences(b, length, burn_in, what=where, zeros=zeros)
        cov.sequences(run, idx, length, burn_in)
        eta = [None, 0.0, 1.0, 0.5][int(run.rng.integers(0, 4))]
        pending.append(lambda s=seq, i=idx, g=gens, m=masks, e=eta: run.update_sequences(s, i, g, m, e))
        if run.rng.random() < 0.3:
            run.update_raw(b)
        run.check_state(where + " after updates")
    cov.seen["stale"] = run.orc.stale_updates
    return run, cov


#: (num_envs, rows per stream, window, adds, sample every, batch)
RUNS = [
    (3, 10, 4, 90, 1, 24),
    (2, 3, 1, 60, 1, 16),
    (1, 12, 10, 70, 1, 24),
    (5, 7, 5, 60, 2, 24),
    (4, 16, 4, 60, 3, 32),
]
#: the same under the Triton interpreter, which is slow: 64 slots, and the tightest ring (T = window + 2);
#: seed 0 draws every case the coverage asks for in these short runs
TRITON_RUNS = [(4, 16, 4, 30, 5, 16), (2, 3, 1, 16, 3, 8)]


def check_random_run(backend, num_envs, t, window, adds, every, b, seed):
    run, cov = random_run(backend, num_envs, t, window, adds, every, b, seed)
    # with window 1 a sequence is its start alone: it never runs past an end
    missing = [k for k, v in cov.seen.items() if v == 0 and not (window == 1 and k == "sequence past an end")]
    assert not missing, f"the run never exercised {missing}: {cov.seen}"


@pytest.mark.parametrize("num_envs, t, window, adds, every, b", RUNS)
def test_random_streams_match_the_oracle_torch(num_envs, t, window, adds, every, b):
    check_random_run("torch", num_envs, t, window, adds, every, b, seed=num_envs + 7 * t)


@pytest.mark.parametrize("num_envs, t, window, adds, every, b", TRITON_RUNS)
def test_random_streams_match_the_oracle_triton(backend, num_envs, t, window, adds, every, b):
    if backend != "triton":
        pytest.skip("the torch back end runs the longer runs above")
    check_random_run("triton", num_envs, t, window, adds, every, b, seed=0)


def test_two_observation_keys_are_stored_once_and_compared_together():
    """obs_keys=("obs", "pixels"): ``add`` takes next_obs and next_pixels; a draw gives both."""
    random_run("torch", 3, 10, 4, 40, 2, 16, seed=41, pixels=True)


def test_an_observation_key_alone_tells_a_reset(backend):
    """Two observation keys: a step whose obs equals the pending next_obs but whose pixels differ
    from the pending next_pixels is a reset the flags did not report."""
    spec = {"obs": ((1,), torch.float32), "pixels": ((2,), torch.uint8), "reward": ((), torch.float32)}
    rb = gper.TrajectoryReplayBuffer(8, 1, spec, window=2, obs_keys=("obs", "pixels"), device="cpu", backend=backend)
    flags = {"terminated": torch.tensor([False]), "truncated": torch.tensor([False]), "reward": torch.ones(1)}
    px = [torch.tensor([[k, 7]], dtype=torch.uint8) for k in range(4)]
    o = [torch.tensor([[float(k)]]) for k in range(4)]
    rb.add({"obs": o[0], "pixels": px[0], "next_obs": o[1], "next_pixels": px[1]} | flags)
    rb.add({"obs": o[1], "pixels": px[1], "next_obs": o[2], "next_pixels": px[2]} | flags)  # goes on
    assert rb.stats()["discontinuities"] == 0
    rb.add({"obs": o[2], "pixels": px[3], "next_obs": o[3], "next_pixels": px[3]} | flags)  # pixels differ
    assert rb.stats()["discontinuities"] == 1
    # rows: 0, 1 (now truncated), 2 an end row holding (o2, px2), 3 the step from (o2, px3)
    assert rb.drawable().tolist()[:4] == [True, True, False, False]
    batch = rb.sample(16, n_step=2, gamma=1.0)
    for n, slot in enumerate(batch.indices.tolist()):
        assert batch["next_obs"][n].tolist() == [2.0] and batch["next_pixels"][n].tolist() == [2, 7], slot
        assert batch["truncated"][n].item() is True


def test_masked_out_steps_are_zero():
    """Where a sequence's mask is false every field is zero, except the observations that are also
    a masked step's (``obs`` after the last step: its final observation; ``next_obs`` before the
    first: the start's or a burn-in step's), which ``obs`` and ``next_obs`` share as views."""
    random_run("torch", 3, 10, 4, 40, 1, 24, seed=31, zeros=True)


def test_a_hand_made_sequence_is_zero_where_masked(backend):
    """Row 0 terminates (final observation 2), a same-step autoreset follows: row 1 is the end
    row holding 2, row 2 the step from 5. The sequence of row 0 with burn-in 1: mask
    [False, True, False]; obs [0, 1, 2], next_obs [1, 2, 0] (one array: the final observation 2
    shows as the masked step's obs, the start's 1 as the masked burn-in step's next_obs)."""
    rb = gper.TrajectoryReplayBuffer(
        8, 1, {"obs": ((1,), torch.float32), "reward": ((), torch.float32)}, window=2, device="cpu", backend=backend
    )
    for o, nxt, term in [(1.0, 2.0, True), (5.0, 6.0, False), (6.0, 7.0, False)]:
        flags = {"terminated": torch.tensor([term]), "truncated": torch.tensor([False])}
        rb.add({"obs": torch.tensor([[o]]), "reward": torch.ones(1), "next_obs": torch.tensor([[nxt]])} | flags)
    assert rb.drawable().tolist() == [True] + [False] * 7
    s = rb.sample_sequences(2, 2, burn_in=1)
    assert s.indices.tolist() == [0, 0]
    assert s["mask"][0].tolist() == [False, True, False]
    assert s["reward"][0].tolist() == [0.0, 1.0, 0.0] and s["terminated"][0].tolist() == [False, True, False]
    assert s["obs"][0].flatten().tolist() == [0.0, 1.0, 2.0], "obs of a masked-out step"
    assert s["next_obs"][0].flatten().tolist() == [1.0, 2.0, 0.0], "next_obs of a masked-out step"


def test_a_hand_made_episode_end_next_step_autoreset(backend):
    """One stream, window 2: o0 -> o1 -> o2 (terminated), the reset step (obs o2), then o3 ...

    Rows: 0 step o0 (r=1), 1 step o1 (r=2, terminated), 2 end row o2, 3 step o3 (r=4), 4 step o4
    (r=5), 5 step o5: rows 0 and 1 drawable through the end row, row 3 through row 5.
    """
    rb = make_buffer(8, 1, 2, backend, seed=1, alpha=1.0, eps=1.0)
    o = [np.full((1, 3), v, np.float32) for v in (10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0)]
    steps = [  # obs, next_obs, reward, terminated
        (o[0], o[1], 1.0, False),
        (o[1], o[2], 2.0, True),
        (o[2], o[3], 99.0, False),  # the reset step: reward and action ignored
        (o[3], o[4], 4.0, False),
        (o[4], o[5], 5.0, False),
        (o[5], o[6], 6.0, False),
    ]
    for n, (obs, nxt, r, term) in enumerate(steps):
        flags = {"terminated": np.array([term]), "truncated": np.array([False])}
        rb.add(
            to_torch(
                {"obs": obs, "next_obs": nxt, "action": np.array([n]), "reward": np.array([r], np.float32)} | flags
            )
        )
    assert rb.drawable().tolist() == [True, True, False, True, False, False, False, False]
    batch = rb.sample(64, n_step=2, gamma=0.5)
    want = {  # slot: reward, next_obs, terminated, discount
        0: (1.0 + 0.5 * 2.0, 12.0, True, 0.0),
        1: (2.0, 12.0, True, 0.0),
        3: (4.0 + 0.5 * 5.0, 15.0, False, 0.25),
    }
    assert set(batch.indices.tolist()) == set(want)
    for n, slot in enumerate(batch.indices.tolist()):
        r, nxt, term, disc = want[slot]
        assert batch["reward"][n].item() == r and batch["next_obs"][n].tolist() == [nxt] * 3, slot
        assert batch["terminated"][n].item() is term and batch["truncated"][n].item() is False, slot
        assert batch["discount"][n].item() == disc and batch["action"][n].item() == {0: 0, 1: 1, 3: 3}[slot]
    seq = rb.sample_sequences(64, 2, burn_in=1)
    for n, slot in enumerate(seq.indices.tolist()):
        mask = {0: [False, True, True], 1: [True, True, False], 3: [False, True, True]}[slot]
        assert seq["mask"][n].tolist() == mask, slot
    assert rb.stats()["discontinuities"] == 0


def test_an_unflagged_reset_marks_the_step_before_truncated(backend):
    """obs that differs from the last next_obs without an episode end: an end row holding that
    next_obs, the step before reads truncated, and stats() counts one discontinuity."""
    rb = make_buffer(8, 1, 2, backend, seed=1)
    o = [np.full((1, 3), v, np.float32) for v in (1.0, 2.0, 3.0, 7.0, 8.0, 9.0)]
    flags = {"terminated": np.array([False]), "truncated": np.array([False])}
    for obs, nxt in [(o[0], o[1]), (o[1], o[2]), (o[3], o[4]), (o[4], o[5])]:  # o[2] never comes back
        rb.add(
            to_torch({"obs": obs, "next_obs": nxt, "action": np.array([0]), "reward": np.ones(1, np.float32)} | flags)
        )
    assert rb.stats()["discontinuities"] == 1
    # rows: 0 step o0, 1 step o1 (now truncated), 2 end row o2, 3 step o3, 4 step o4
    assert rb.drawable().tolist()[:5] == [True, True, False, False, False]
    batch = rb.sample(32, n_step=2, gamma=1.0)
    for n, slot in enumerate(batch.indices.tolist()):
        assert batch["next_obs"][n].tolist() == [3.0] * 3, "the pending observation is the final one"
        assert batch["truncated"][n].item() is True and batch["terminated"][n].item() is False
        assert batch["discount"][n].item() == 1.0
        assert batch["reward"][n].item() == {0: 2.0, 1: 1.0}[slot]


def test_stale_sequence_and_batch_updates_are_ignored_and_counted():
    """Draws whose slot was written since (the ring went round) change nothing, not even a
    slot that is not drawable yet; they are counted as stale."""
    run = Run(12, 2, 2, seed=5)  # 6 rows per stream
    for _ in range(6):
        run.add()
    batch, idx, gens = run.check_sample(8, 1, None)
    seq, sidx, sgens, masks = run.check_sequences(8, 2, 1, zeros=False)
    for _ in range(7):  # every slot written again at least once
        run.add()
    before = run.rb.priorities(torch.arange(12)).clone()
    drawable = run.rb.drawable().clone()
    run.update_batch(batch, idx, gens)
    run.update_sequences(seq, sidx, sgens, masks)
    assert run.orc.stale_updates == 16
    assert torch.equal(run.rb.priorities(torch.arange(12)), before)
    assert torch.equal(run.rb.drawable(), drawable)
    run.check_state("after stale updates")


def test_raw_updates_of_slots_that_are_not_drawable_are_dropped():
    """A raw index whose slot is not a drawable start (the newest rows, end rows) is dropped and
    counted; the slot stays out of the tree, and enters it later at the max priority."""
    run = Run(24, 2, 4, seed=9)
    for _ in range(8):
        run.add()
    off = [i for i, d in enumerate(run.orc.drawable()) if not d]
    assert off
    td = torch.full((len(off),), 1e4)
    run.rb.update_priorities(torch.tensor(off), td)
    run.orc.update(off, [run.orc.priority(1e4)] * len(off), None)
    assert run.orc.invalid_indices == len(off) and run.orc.max_priority == 1.0
    run.check_state("after the dropped updates")
    for step in range(12):
        run.add()
        run.check_state(f"add {step} after the dropped updates")


def test_a_nan_td_sets_the_max_priority_as_it_was():
    run = Run(24, 2, 4, seed=11)
    for _ in range(8):
        run.add()
    batch, idx, gens = run.check_sample(6, 1, None)
    td = torch.tensor([3.0, float("nan"), 50.0, float("inf"), -2.0, float("-inf")])
    old_max = run.orc.max_priority
    run.rb.update_priorities(batch, td)
    run.orc.update(idx, [run.orc.priority(x) if math.isfinite(x) else None for x in td.tolist()], gens)
    last = {i: n for n, i in enumerate(idx)}  # duplicates: the last entry wins
    for i, n in last.items():
        want = old_max if not math.isfinite(td[n]) else run.orc.priority(float(td[n]))
        assert math.isclose(run.rb.priorities(torch.tensor([i])).item(), want, rel_tol=1e-5), (i, n)
    run.check_state("after a NaN update")


def test_r2d2_mix_over_the_masked_steps_only():
    """``update_priorities(s, td [B, L])`` sets ``(eta max|td| + (1 - eta) mean|td| + eps) ** alpha``
    over each sequence's masked steps after the burn-in; NaN and huge values outside the mask do
    not count, a NaN inside it gives the max priority."""
    alpha, eps = 0.7, 1e-2
    run = Run(40, 2, 6, seed=13, alpha=alpha, eps=eps)
    for _ in range(40):
        run.add()
    seq, idx, gens, masks = run.check_sequences(32, 6, 2, zeros=False)
    assert any(not all(m) for m in masks), "no sequence reached an episode's end: pick another seed"
    g = torch.Generator().manual_seed(0)
    td = torch.randn(32, 6, generator=g) * 3
    mask = seq["mask"][:, 2:]
    assert mask.tolist() == masks
    td = torch.where(mask, td, torch.tensor(float("nan")))
    td[~mask & (torch.arange(6) % 2 == 0)] = 1e30
    td[0, 0] = float("nan")  # the start's own step: always masked
    old_max = run.orc.max_priority
    run.rb.update_priorities(seq, td, eta=0.8)
    got = run.rb.priorities(seq.indices)
    last = {i: n for n, i in enumerate(idx)}
    for i, n in last.items():
        a = td[n][mask[n]].abs()
        if n == 0 or not bool(torch.isfinite(a).all()):
            want = old_max
        else:
            mix = 0.8 * a.double().max().item() + 0.2 * a.double().mean().item()
            want = (mix + eps) ** alpha
        assert math.isclose(got[idx.index(i)].item(), want, rel_tol=1e-5), (n, i, got[idx.index(i)].item(), want)


def test_the_longest_n_step_matches_the_oracle():
    """n_step up to 64 (window 64) on episodes longer and shorter than it: every field of every draw."""
    random_run("torch", 2, 80, 64, 150, 10, 32, seed=64)
