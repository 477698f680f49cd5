"""A trajectory buffer of several instances (``instances=N``) against N single trajectory buffers.

Instance ``i`` of ``instances=N, seed=s`` must be, bit for bit, a single ``TrajectoryReplayBuffer``
of ``seed=s + i`` (and its own alpha, beta and eps) through add, every sample (transitions of 1
and 3 steps, sequences, hindsight relabelling), updates, state dicts, files and copies, on both
back ends; bad input and bad states are refused with every instance unchanged.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import gper
from gper.replay.trajectory_instances import SequenceInstanceBatch, TrajectoryReplayInstances, TransitionInstanceBatch
from her_oracle import OBS_KEYS as HER_KEYS
from her_oracle import SPEC as HER_SPEC
from her_oracle import GoalStreams, reward_fn

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32)}
N, E, T, W, B = 3, 2, 10, 3, 6
ALPHA, EPS = [0.5, 0.6, 0.7], [1e-6, 1e-3, 1e-2]
MODES = ["proportional", "stratified", "rank", "uniform"]
#: raw updates draw slots that are not drawable starts: dropped and counted, as a single buffer's
pytestmark = pytest.mark.filterwarnings("ignore:gper. .* update entries had indices outside")


def _pair(backend="torch", sampling="proportional", her=None, **extra):
    spec, keys = (HER_SPEC, HER_KEYS) if her is not None else (SPEC, ("obs",))
    settings = dict(window=W, obs_keys=keys, her=her, sampling=sampling, device="cpu", backend=backend, arity=4)
    settings |= extra
    pop = gper.TrajectoryReplayBuffer(
        E * T, E, spec, instances=N, seed=7, alpha=torch.tensor(ALPHA, dtype=torch.float64), eps=EPS, **settings
    )
    singles = [
        gper.TrajectoryReplayBuffer(E * T, E, spec, seed=7 + i, alpha=ALPHA[i], eps=EPS[i], **settings)
        for i in range(N)
    ]
    return pop, singles


class Steps:
    """Random steps of N * E streams (episode ends, truncations, unflagged resets), each
    instance's own; with ``her``, each instance's own goal streams."""

    def __init__(self, seed: int, her: bool = False) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.goals = (
            [GoalStreams(E, seed=seed + i, goal_values=4, long_length=2 * T) for i in range(N)] if her else None
        )
        self.obs = torch.randn(N, E, 3, generator=self.g)

    def __call__(self) -> dict[str, torch.Tensor]:
        if self.goals is not None:
            steps = [s.step() for s in self.goals]
            return {k: torch.from_numpy(np.stack([s[k] for s in steps])) for k in steps[0]}
        g = self.g
        nxt = torch.randn(N, E, 3, generator=g)
        term = torch.rand(N, E, generator=g) < 0.15
        trunc = (torch.rand(N, E, generator=g) < 0.07) & ~term
        step = {"obs": self.obs, "action": torch.randint(0, 4, (N, E), generator=g)}
        step |= {"reward": torch.randn(N, E, generator=g), "next_obs": nxt, "terminated": term, "truncated": trunc}
        jump = torch.rand(N, E, generator=g) < 0.05
        self.obs = torch.where((term | trunc | jump)[..., None], torch.randn(N, E, 3, generator=g), nxt)
        return step


def _same(batch, i: int, single) -> None:
    for name in single:
        assert torch.equal(batch[name][i], single[name]), name
    for name in ("indices", "generations", "weights"):
        assert torch.equal(getattr(batch, name)[i], getattr(single, name)), name


def _run(pop, singles, steps: Steps, count: int, relabel: bool = False) -> None:
    """``count`` adds; once drawable, each step samples transitions (1 step, 3 steps with a float
    or an [N] gamma, the buffer's beta or an [N] one), sequences, and updates all of them, each
    checked against the singles."""
    g = steps.g
    for step in range(count):
        data = steps()
        pop.add(data)
        for i, s in enumerate(singles):
            s.add({k: v[i] for k, v in data.items()})
        if pop._steps <= W:
            continue
        gammas, betas = [0.9, 0.8, 0.7], [0.1, 0.5, 0.9]
        n_step = 3 if step % 2 else 1
        gamma = (torch.tensor(gammas) if step % 4 == 1 else 0.9) if n_step > 1 else None
        beta = torch.tensor(betas) if step % 3 == 0 else None
        batch = pop.sample(B, n_step=n_step, gamma=gamma, beta=beta)
        assert isinstance(batch, TransitionInstanceBatch) and batch[pop.obs_keys[0]].shape[:2] == (N, B)
        td = torch.randn(N, B, generator=g)
        td[0, 0] = float("nan")
        seq = pop.sample_sequences(B, 2, burn_in=1, beta=beta)
        seq_td = torch.randn(N, B, 2, generator=g)
        for i, s in enumerate(singles):  # an [N] tensor's part is a 0-d tensor, read where it is
            own_gamma = gamma[i] if isinstance(gamma, torch.Tensor) else gamma
            own_beta = beta[i] if beta is not None else None
            single = s.sample(B, n_step=n_step, gamma=own_gamma, beta=own_beta)
            _same(batch, i, single)
            single_seq = s.sample_sequences(B, 2, burn_in=1, beta=own_beta)
            _same(seq, i, single_seq)
            s.update_priorities(single, td[i])
            s.update_priorities(single_seq, seq_td[i])
        pop.update_priorities(batch, td)
        pop.update_priorities(seq, seq_td)
        if step % 5 == 0:  # raw indices: non-starts among them are dropped, as a single buffer drops them
            raw = torch.randint(0, E * T, (N, B), generator=g)
            pop.update_priorities(raw, td)
            for i, s in enumerate(singles):
                s.update_priorities(raw[i], td[i])
    _same_state(pop, singles)


def _same_state(pop, singles) -> None:
    state, stats = pop.state_dict(), pop.stats()
    for i, s in enumerate(singles):
        for name, value in s.state_dict().items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(state[name][i], value), name
        for name, value in s.stats().items():
            assert stats[name][i] == value, name


@pytest.mark.parametrize("sampling", MODES)
def test_each_instance_is_its_single_buffer(backend, sampling):
    pop, singles = _pair(backend, sampling)
    _run(pop, singles, Steps(0), 30 if backend == "torch" else 14)  # the torch run wraps every ring
    assert pop.seeds == (7, 8, 9) and pop.alpha == tuple(ALPHA) and pop.eps == tuple(EPS)
    assert torch.equal(pop.streams, torch.stack([s.streams for s in singles]))
    assert torch.equal(pop.drawable(), torch.stack([s.drawable() for s in singles]))
    assert torch.equal(pop.storage["obs"][1], singles[1].storage["obs"])


@pytest.mark.parametrize("weight_norm", ["global", "batch"])
def test_batch_weight_norm_and_relabelled_goals_are_each_instances_own(backend, weight_norm):
    her = gper.HindsightRelabeling(reward_fn, info_keys=("action",), strategy="future")
    pop, singles = _pair(backend, her=her, weight_norm=weight_norm)
    _run(pop, singles, Steps(1, her=True), 12 if backend == "torch" else 8)
    batch = pop.sample(B, n_step=2, gamma=0.5)
    assert batch.relabelled.shape == (N, B)


@pytest.mark.parametrize("sampling", ["proportional", "rank"])
def test_restores_files_and_copies_go_on_as_the_original(backend, sampling, tmp_path):
    pop, singles = _pair(backend, sampling)
    steps = Steps(2)
    _run(pop, singles, steps, 12 if backend == "torch" else 8)
    fresh = lambda: _pair(backend, sampling)[0]  # noqa: E731
    loaded, from_file = fresh(), fresh()
    loaded.load_state_dict(pop.state_dict())
    pop.save(tmp_path / "pop.safetensors")
    from_file.load(tmp_path / "pop.safetensors")
    copies = [loaded, from_file, copy.deepcopy(pop), pickle.loads(pickle.dumps(pop))]
    for other in copies:
        assert isinstance(other, TrajectoryReplayInstances) and other.seeds == pop.seeds
    then = copy.deepcopy(steps), [copy.deepcopy(s) for s in singles]
    _run(pop, singles, steps, 4)
    for other in copies:  # each copy goes the same way as the original, checked against the singles
        again = copy.deepcopy(then)
        _run(other, again[1], again[0], 4)


def test_a_batch_from_before_a_restore_is_stale_for_every_instance():
    pop, _ = _pair()
    steps = Steps(3)
    for _ in range(W + 3):
        pop.add(steps())
    state = copy.deepcopy(pop.state_dict())
    batch, seq = pop.sample(B), pop.sample_sequences(B, 2)
    pop.load_state_dict(state)
    before = pop.priorities(batch.indices).clone()
    pop.update_priorities(batch, torch.full((N, B), 5.0))
    pop.update_priorities(seq, torch.full((N, B, 2), 5.0))
    assert torch.equal(pop.priorities(batch.indices), before)
    assert pop.stats()["stale_updates"] == [2 * B] * N


def _unchanged(pop, call) -> None:
    before = copy.deepcopy(pop.state_dict())
    call()
    after = pop.state_dict()
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[name]), name
        else:
            assert value == after[name], name


def _raises(call, pop, error, match) -> None:
    with pytest.raises(error, match=match):
        call(pop)


def _step(**change) -> dict[str, torch.Tensor]:
    return Steps(9)() | change


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda p: p.add({k: v[0] for k, v in _step().items()}), ValueError, r"\[3, num_envs"),
        (lambda p: p.add(_step(obs=torch.zeros(N, E, 4))), ValueError, "shape"),
        (lambda p: p.add(_step(action=torch.zeros(N, E))), TypeError, "dtype"),
        (lambda p: p.add({"obs": torch.zeros(N, E, 3)}), KeyError, "missing keys"),
        (lambda p: p.update_priorities(torch.zeros(B, dtype=torch.long), torch.zeros(B)), ValueError, r"\[3, B\]"),
        (lambda p: p.update_priorities(torch.zeros(2, B, dtype=torch.long), torch.zeros(2, B)), ValueError, r"\[3, B"),
        (lambda p: p.update_priorities(p.drawn[0], torch.zeros(2, B)), ValueError, "shape"),
        (lambda p: p.update_priorities(p.drawn[1], torch.zeros(N, B)), ValueError, r"\(3, 6, 2\)"),
        (lambda p: p.sample(B, beta=torch.zeros(2)), ValueError, r"0-d or \[3\]"),
        (lambda p: p.sample(B, n_step=2, gamma=torch.ones(4)), ValueError, r"gamma tensor must be 0-d or \[3\]"),
        (lambda p: p.sample(B, beta=torch.tensor([0.1, 2.0, 0.3])), ValueError, r"\[0, 1\]"),
        (lambda p: p.sample(B, n_step=W + 1, gamma=0.9), ValueError, "n_step"),
        (lambda p: p.sample_sequences(B, 2, beta=torch.ones(N, 1)), ValueError, "beta tensor must be"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(call, error, match):
    pop, _ = _pair()
    steps = Steps(4)
    for _ in range(W + 3):
        pop.add(steps())
    pop.drawn = pop.sample(B), pop.sample_sequences(B, 2)  # batches to update, drawn before the check
    _unchanged(pop, lambda: _raises(call, pop, error, match))


def test_a_raw_update_of_a_start_that_is_not_drawable_is_refused_whole_when_strict():
    pop, _ = _pair(strict=True)
    steps = Steps(5)
    for _ in range(W + 3):
        pop.add(steps())
    idx = pop.sample(B).indices.clone()
    idx[2, 0] = int((~pop.drawable()[2]).nonzero()[0, 0])  # the last instance's only
    _unchanged(pop, lambda: _raises(lambda p: p.update_priorities(idx, torch.ones(N, B)), pop, IndexError, "start"))


def test_a_state_of_other_settings_or_a_corrupt_instance_is_refused_whole(tmp_path):
    pop, _ = _pair()
    steps = Steps(6)
    for _ in range(W + 4):
        pop.add(steps())
    other = gper.TrajectoryReplayBuffer(E * T, E, SPEC, window=W, instances=2, device="cpu", arity=4)
    _unchanged(pop, lambda: _raises(lambda p: p.load_state_dict(other.state_dict()), pop, ValueError, "instances"))
    other.save(tmp_path / "other.safetensors")
    _unchanged(pop, lambda: _raises(lambda p: p.load(tmp_path / "other.safetensors"), pop, ValueError, "flags"))
    for corrupt in ("streams", "tree"):
        state = copy.deepcopy(pop.state_dict())
        if corrupt == "streams":
            state["streams"][2, 0, 1] = -1  # an episode start of the last instance only
        else:
            state["tree"][2, -2] = -1.0
        for target in (pop, _pair()[0]):
            load = lambda p, state=state: p.load_state_dict(state)  # noqa: E731
            _unchanged(target, lambda t=target, load=load: _raises(load, t, ValueError, "corrupt"))


@pytest.mark.parametrize(
    "settings, error, match",
    [
        ({"instances": 0}, ValueError, "instances must be None or an int >= 1"),
        ({"instances": 3, "alpha": [0.5, 0.6]}, ValueError, "alpha must be a float or 3 values"),
        ({"instances": 3, "beta": torch.ones(2, 2)}, ValueError, r"beta must be a float or \[3\]"),
        ({"instances": 3, "seed": 2**63 - 2}, ValueError, "seed must be an int in"),
        ({"instances": 3, "backend": object()}, TypeError, "backend must be"),
    ],
)
def test_bad_settings_are_refused(settings, error, match):
    with pytest.raises(error, match=match):
        gper.TrajectoryReplayBuffer(E * T, E, SPEC, window=W, device="cpu", **settings)


def test_settings_per_instance_and_shapes_of_one_instance():
    pop, _ = _pair()
    pop.beta = [0.1, 0.2, 0.3]
    assert [m.beta for m in pop.members] == [0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="alpha"):
        pop.alpha = [0.1, 2.0, 0.3]
    assert pop.alpha == tuple(ALPHA)
    one = gper.TrajectoryReplayBuffer(E * T, E, SPEC, window=W, instances=1, device="cpu")
    step = Steps(7)
    for _ in range(W + 2):
        one.add({k: v[:1] for k, v in step().items()})
    batch, seq = one.sample(5), one.sample_sequences(5, 2, burn_in=1)
    assert batch["obs"].shape == (1, 5, 3) and batch.indices.shape == (1, 5) and batch.batch_size == 5
    assert isinstance(seq, SequenceInstanceBatch) and seq["obs"].shape == (1, 5, 3, 3) and seq.mask.shape == (1, 5, 3)
    assert one.storage["obs"].shape == (1, E, T, 3)
    assert type(gper.TrajectoryReplayBuffer(E * T, E, SPEC, window=W, device="cpu")) is gper.TrajectoryReplayBuffer


def test_a_reward_fn_that_fails_for_one_instance_leaves_every_instance_as_it_was():
    calls = []  # armed: the calls since, of which the second (the second instance's relabelling) fails

    def flaky(achieved, desired, info):
        if armed := calls and calls[0] == "armed":
            calls.append(1)
        if armed and len(calls) == 3:
            raise RuntimeError("reward_fn failed")
        return reward_fn(achieved, desired, info)

    pop, _ = _pair(her=gper.HindsightRelabeling(flaky, info_keys=("action",)))
    steps = Steps(8, her=True)
    for _ in range(W + 4):
        pop.add(steps())
    pop.sample(B, n_step=2, gamma=0.5)  # a first draw stages the beta input, as any sample does
    calls.append("armed")
    _unchanged(pop, lambda: _raises(lambda p: p.sample(B, n_step=2, gamma=0.5), pop, RuntimeError, "failed"))
