"""Hindsight relabelling against the plain-Python oracle (tests/her_oracle.py): every relabelled goal
is the achieved goal of a row of the start's episode at a position its strategy allows, every
other draw keeps its stored goal, every field of every draw (n-step returns, next observations,
flags, discounts) is what ``reward_fn`` / ``terminated_fn`` give for its goal, the relabelled
fraction matches the ratio, and ``future`` and ``episode`` goals are uniform over their rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gper
from helpers import TRITON_ON_CPU
from her_oracle import OBS_KEYS, SPEC, GoalStreams, HerOracle, reward_fn, same_bits, terminated_fn
from trajectory_helpers import assert_field, to_torch

E, T, W = 3, 20, 4


def make(
    strategy: str,
    ratio: float = 0.8,
    tf=None,
    goal_values: int | None = None,
    seed: int = 5,
    backend: str = "torch",
    **streams,
):
    her = gper.HindsightRelabeling(
        reward_fn, strategy=strategy, relabel_ratio=ratio, info_keys=("action",), terminated_fn=tf
    )
    rb = gper.TrajectoryReplayBuffer(
        E * T, E, SPEC, window=W, obs_keys=OBS_KEYS, device="cpu", backend=backend, seed=seed, her=her
    )
    gen = GoalStreams(E, seed=seed, goal_values=goal_values, long_length=3 * T, **streams)
    return rb, gen, HerOracle(E, T, W)


def add(rb, gen, orc) -> None:
    data = gen.step()
    rb.add(to_torch(data))
    orc.add(data)


def check_batch(batch, orc: HerOracle, strategy: str, n: int, gamma: float, tf) -> list[tuple[int, int]]:
    """Compare every draw with the oracle; return (slot, goal row) of the relabelled draws whose goal
    names one row (unique achieved goals)."""
    got = {name: batch[name].numpy() for name in batch}
    found = []
    for s, slot in enumerate(batch.indices.tolist()):
        what = f"{strategy} n={n} item {s} (slot {slot})"
        if not got["relabelled"][s]:
            want = orc.transition(slot, n, gamma)
        else:
            goal = got["desired_goal"][s]
            rows = [q for q in orc.goal_rows(slot, strategy) if same_bits(orc.achieved(slot, q), goal)]
            assert rows, f"{what}: relabelled goal {goal} is no achieved goal of rows {orc.goal_rows(slot, strategy)}"
            if len(rows) == 1:
                found.append((slot, rows[0]))
            want = orc.transition(slot, n, gamma, goal, reward_fn, tf)
        for name, value in want.items():
            assert_field(got[name][s], value, f"{what} {name!r}")
    return found


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("terminal", [False, True], ids=["stored flags", "terminated_fn"])
def test_every_draw_matches_the_oracle(strategy, n, terminal):
    # repeating goals with terminated_fn: relabelled returns stop where the new goal is first reached
    tf = terminated_fn if terminal else None
    rb, gen, orc = make(strategy, tf=tf, goal_values=5 if terminal else None)
    relabelled = draws = 0
    for step in range(110):
        add(rb, gen, orc)
        if step > W and step % 9 == 0:
            batch = rb.sample(96, n_step=n, gamma=0.9)
            check_batch(batch, orc, strategy, n, 0.9, tf)
            relabelled += int(batch.relabelled.sum())
            draws += 96
    assert 0 < relabelled < draws
    # the streams held what the index must get right: end rows that end no step, wrapped episodes
    assert orc.zero_step_end_rows() > 0


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton and TRITON_INTERPRET=1")
def test_the_triton_back_end_matches_the_oracle_under_the_interpreter():
    rb, gen, orc = make("future", tf=terminated_fn, goal_values=5, backend="triton")
    for step in range(40):
        add(rb, gen, orc)
        if step > W and step % 6 == 0:
            check_batch(rb.sample(64, n_step=3, gamma=0.9), orc, "future", 3, 0.9, terminated_fn)
            check_batch(rb.sample(64, n_step=1), orc, "future", 1, 1.0, terminated_fn)


def test_relabel_false_and_ratio_zero_keep_the_stored_goals():
    rb, gen, orc = make("future", ratio=0.0)
    for _ in range(30):
        add(rb, gen, orc)
    for batch in (rb.sample(64, n_step=2, gamma=0.5), rb.sample(64, n_step=2, gamma=0.5, relabel=False)):
        assert not batch.relabelled.any()
        check_batch(batch, orc, "future", 2, 0.5, None)


def _chi_square(u: np.ndarray, bins: int = 10) -> float:
    counts = np.histogram(u, bins=bins, range=(0.0, 1.0))[0]
    want = len(u) / bins
    return float(((counts - want) ** 2 / want).sum())


@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_goals_are_uniform_over_their_rows_and_the_ratio_holds(strategy):
    rb, gen, orc = make(strategy, ratio=0.8, seed=11)
    rng = np.random.default_rng(0)
    u, relabelled, draws = [], 0, 0
    for step in range(90):
        add(rb, gen, orc)
        if step > W and step % 15 == 0:
            batch = rb.sample(1024, n_step=1)
            found = check_batch(batch, orc, strategy, 1, 1.0, None)
            relabelled += int(batch.relabelled.sum())
            draws += 1024
            for slot, q in found:
                allowed = orc.goal_rows(slot, strategy)
                # the offset's rank among the allowed rows, spread uniformly over its cell: uniform
                # on [0, 1) exactly when the offsets are uniform, whatever each range's length
                u.append((allowed.index(q) + rng.random()) / len(allowed))
    # every relabelled draw named one row (unique achieved goals)
    assert len(u) == relabelled
    # the relabelled count is binomial(draws, 0.8): 6 standard deviations cannot flake
    sd = math.sqrt(draws * 0.8 * 0.2)
    assert abs(relabelled - 0.8 * draws) < 6 * sd, (relabelled, draws)
    # chi-square with 9 degrees of freedom: P(> 40) is below 1e-5
    assert _chi_square(np.array(u)) < 40.0


#: streams of one-step episodes: a ring of T rows then holds T // 2 episodes of two rows, and after
#: a next-step reset step one more (in progress, no row yet); or every reset step is followed by an
#: unflagged reset, whose end row ends no step and must take no record of its own
DENSE = {
    "mixed": {},
    "densest": {"lengths": (1, 1), "p_zero_step": 0.0},
    "zero-step ends": {"lengths": (1, 1), "p_zero_step": 1.0, "styles": ("next",)},
}


@pytest.mark.parametrize("streams", list(DENSE))
def test_the_episode_index_matches_the_oracle_after_every_add(streams):
    """The index a state holds: for every stored step, its record is its episode's (first row, or any
    row at or before the oldest stored one where that first row was overwritten; end row or -1)."""
    rb, gen, orc = make("future", seed=3, **DENSE[streams])
    r = T // 2 + 2
    for step in range(150):
        add(rb, gen, orc)
        state = rb.state_dict()
        ids, records = state["episode_ids"].tolist(), state["episode_records"].tolist()
        for e, s in enumerate(orc.streams):
            count = len(s.rows)
            for k in range(max(0, count - T), count):
                if s.rows[k].kind != 0:
                    continue
                slot = e * T + k % T
                first, end = records[e][ids[slot] % r]
                want_first, last, oldest = orc.episode(e, k)
                in_progress = last == count - 1 and s.rows[last].kind == 0
                assert end == (-1 if in_progress else last), f"add {step}: stream {e} row {k}: end {end} != {last}"
                if want_first > oldest:
                    assert first == want_first, f"add {step}: stream {e} row {k}: first {first} != {want_first}"
                else:
                    assert first <= oldest, f"add {step}: stream {e} row {k}: first {first} after the oldest row"
    assert (orc.zero_step_end_rows() > 0) == (streams != "densest")
