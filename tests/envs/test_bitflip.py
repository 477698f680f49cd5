"""The bit-flipping task against a plain-Python oracle of its rules, its resets, seeds, checkpoints and inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gper.envs import make_env
from gper.envs.bitflip import MAX_BITS, BitFlip


class Oracle:
    """One bit-flipping episode in plain Python, written from the paper's rules (section 4.1)."""

    def __init__(self, state: list[int], goal: list[int]) -> None:
        self.state, self.goal, self.steps = list(state), list(goal), 0

    def step(self, action: int) -> tuple[list[int], float, bool, bool]:
        self.state[action] = 1 - self.state[action]
        self.steps += 1
        reached = self.state == self.goal
        truncated = self.steps >= len(self.state) and not reached
        return list(self.state) + list(self.goal), 0.0 if reached else -1.0, reached, truncated


def bits(row: torch.Tensor) -> list[int]:
    return [int(b) for b in row.tolist()]


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_matches_the_oracle_over_random_and_directed_actions(n):
    """Every step of 64 copies: observations, rewards, flags, step counts, and same-step resets."""
    num = 64
    env = BitFlip(n, num, seed=n)
    obs = env.observe()
    oracles = [Oracle(bits(o[:n]), bits(o[n:])) for o in obs]
    rng = np.random.default_rng(n)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(6 * n + 20):
        # half the copies flip a wrong bit where there is one (so goals are reached), half act at random
        actions = rng.integers(0, n, num)
        for i, o in enumerate(oracles):
            wrong = [j for j in range(n) if o.state[j] != o.goal[j]]
            if wrong and i % 2 == 0:
                actions[i] = rng.choice(wrong)
        step = env.step(torch.from_numpy(actions))
        for i, o in enumerate(oracles):
            next_obs, reward, terminated, truncated = o.step(int(actions[i]))
            assert bits(step.next_obs[i]) == next_obs, i
            assert step.reward[i].item() == reward
            assert (bool(step.terminated[i]), bool(step.truncated[i])) == (terminated, truncated), i
            if terminated or truncated:
                ends["terminated" if terminated else "truncated"] += 1
                new = bits(step.obs[i])
                assert new[:n] != new[n:]  # a fresh episode, never solved at its start
                oracles[i] = Oracle(new[:n], new[n:])
            else:
                assert torch.equal(step.obs[i], step.next_obs[i])
        assert env.steps.tolist() == [o.steps for o in oracles]
        assert not step.reward.signbit()[step.terminated].any()  # +0.0, not -0.0: a reward's bits are stored
        assert torch.equal(step.obs, env.observe())
    assert ends["terminated"] > num // 2
    assert n == 1 or ends["truncated"] > 0  # one bit: the only action always reaches the goal
    assert step.next_obs.dtype == step.obs.dtype == step.reward.dtype == torch.float32
    assert step.terminated.dtype == step.truncated.dtype == torch.bool


def test_episodes_last_n_steps():
    """State 0…0, goal 1…1, always flipping bit 0: never solved, truncated on exactly step n."""
    n = 6
    env = BitFlip(n, 2, seed=0)
    env.set_state(torch.zeros(2, n), torch.ones(2, n))
    for t in range(1, n + 1):
        step = env.step(torch.zeros(2, dtype=torch.int64))
        assert not step.terminated.any() and step.reward.tolist() == [-1.0, -1.0]
        assert step.truncated.tolist() == [t == n] * 2, t
    assert env.steps.tolist() == [0, 0]
    assert step.next_obs[:, n:].eq(1).all() and not torch.equal(step.obs, step.next_obs)


def test_reaching_the_goal_on_the_last_step_terminates_and_does_not_truncate():
    env = BitFlip(3, 1, seed=0)
    env.set_state(torch.zeros(1, 3), torch.ones(1, 3))
    for a in (0, 1, 2):
        step = env.step(torch.tensor([a]))
    assert (step.reward.item(), bool(step.terminated), bool(step.truncated)) == (0.0, True, False)
    assert step.next_obs.tolist() == [[1.0] * 6]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_goal_never_equals_the_state_at_a_reset(n):
    env = BitFlip(n, 4096, seed=1)
    for seed in range(3):
        env.reset(seed=seed)
        assert (env.state != env.goal).any(1).all()
        # and the resets inside step: one step at n = 1 ends every episode
        if n == 1:
            step = env.step(torch.zeros(4096, dtype=torch.int64))
            assert step.terminated.all() and (env.state != env.goal).all()


def test_reset_distribution():
    """State bits are fair coins; for two bits each neighbour of the state is the goal with
    probability 3/8 and the opposite pattern with 1/4 (the module docstring). 64k draws with a
    fixed seed; the bounds are over 6 standard deviations wide."""
    env = BitFlip(2, 65536, seed=7)
    diff = (env.state ^ env.goal).long()
    pattern = diff[:, 0] + 2 * diff[:, 1]  # 1 and 2: one bit away, 3: both bits differ
    counts = torch.bincount(pattern, minlength=4).tolist()
    assert counts[0] == 0
    for k, p in ((1, 3 / 8), (2, 3 / 8), (3, 1 / 4)):
        sd = (65536 * p * (1 - p)) ** 0.5
        assert abs(counts[k] - 65536 * p) < 6 * sd, (k, counts)
    wide = BitFlip(16, 8192, seed=7)
    for t in (wide.state, wide.goal):
        share = t.double().mean(0)  # each bit: mean 1/2, sd 0.0055
        assert (share - 0.5).abs().max() < 0.035, share


def test_seeding_and_generators():
    a, b = BitFlip(10, 8, seed=5), BitFlip(10, 8, seed=5)
    assert torch.equal(a.observe(), b.observe())
    assert not torch.equal(a.observe(), BitFlip(10, 8, seed=6).observe())
    first = a.reset(seed=11)
    a.reset()
    assert torch.equal(a.reset(seed=11), first)
    g = torch.Generator().manual_seed(2)
    c = BitFlip(10, 8, generator=g)
    assert c.generator is g and torch.equal(c.observe(), BitFlip(10, 8, seed=2).observe())
    torch.manual_seed(9)
    d = BitFlip(10, 8, seed=123, graph_safe_rng=True)
    assert d.generator is None
    start = d.observe()
    torch.manual_seed(9)
    assert torch.equal(d.reset(seed=456), start)  # seeds are torch's business here
    with pytest.raises(ValueError, match="not both"):
        BitFlip(4, 2, generator=g, graph_safe_rng=True)


def _steps(env: BitFlip, rng: np.random.Generator, count: int) -> list[torch.Tensor]:
    out = []
    for _ in range(count):
        out += list(env.step(torch.from_numpy(rng.integers(0, env.n_bits, env.num_envs))))
    return out


def test_state_dict_resumes_the_episodes_in_flight():
    env = BitFlip(4, 16, seed=4)
    rng = np.random.default_rng(0)
    _steps(env, rng, 7)
    saved = env.state_dict()
    assert saved["steps"].any()  # episodes in flight, not all at their start
    want = _steps(env, np.random.default_rng(1), 40)
    # the same object rewound, and a fresh one (a resumed run) of another seed
    for target in (env, BitFlip(4, 16, seed=99)):
        target.load_state_dict(saved)
        got = _steps(target, np.random.default_rng(1), 40)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))


def test_load_state_dict_checks_before_changing_anything():
    env = BitFlip(4, 3, seed=0)
    before = env.state_dict()
    bad = [
        dict(before, state=torch.zeros(3, 5, dtype=torch.bool)),
        dict(before, goal=torch.full((3, 4), 2)),
        dict(before, steps=torch.tensor([0, 4, 1])),
        dict(before, steps=torch.zeros(3)),
    ]
    matches = ["state must be", "goal must be", r"steps must be in \[0, 4\)", "integers"]
    for state, match in zip(bad, matches, strict=True):
        with pytest.raises(ValueError, match=match):
            env.load_state_dict(state)
        for key in ("state", "goal", "steps"):
            assert torch.equal(env.state_dict()[key], before[key])


def test_actions_are_checked():
    env = BitFlip(5, 3, seed=0)
    before = env.state_dict()
    with pytest.raises(ValueError, match="int64"):
        env.step(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[3\]"):
        env.step(torch.zeros(2, dtype=torch.int64))
    for value in (-1, 5):
        with pytest.raises(ValueError, match=rf"in \[0, 5\), got {value} for copy 1"):
            env.step(torch.tensor([0, value, 4]))
    assert all(torch.equal(env.state_dict()[k], before[k]) for k in ("state", "goal", "steps"))


@pytest.mark.parametrize("n_bits", [0, -3, MAX_BITS + 1, 2.0, True, "8"])
def test_bad_n_bits(n_bits):
    with pytest.raises(ValueError, match=rf"n_bits must be an int in \[1, {MAX_BITS}\]"):
        BitFlip(n_bits, 2)


def test_bad_num_envs():
    for num_envs in (0, True, 1.5):
        with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
            BitFlip(4, num_envs)


def test_attributes_and_the_largest_size():
    env = BitFlip(MAX_BITS, 2, seed=0)
    assert env.name == f"bitflip:{MAX_BITS}" and env.graph_safe and env.autoreset == "same-step"
    assert (env.obs_dim, env.n_actions, env.goal_dim, env.max_steps) == (2 * MAX_BITS, MAX_BITS, MAX_BITS, MAX_BITS)
    assert env.reward_threshold is None
    step = env.step(torch.tensor([0, MAX_BITS - 1]))
    assert step.next_obs.shape == step.obs.shape == (2, 2 * MAX_BITS)


def test_make_env():
    env = make_env("bitflip:12", 3, "cpu", seed=2)
    assert isinstance(env, BitFlip) and (env.n_bits, env.num_envs, env.name) == (12, 3, "bitflip:12")
    assert torch.equal(env.observe(), BitFlip(12, 3, seed=2).observe())
    assert make_env("bitflip:5", 1, "cpu", graph_safe_rng=True).generator is None
    with pytest.raises(ValueError, match="same step only"):
        make_env("bitflip:4", 1, "cpu", autoreset="next-step")


@pytest.mark.parametrize("name", ["bitflip:abc", "bitflip:0", "bitflip:", "bitflip:-1", "bitflip:1025", "bitflip: 8"])
def test_make_env_bad_bit_counts(name):
    with pytest.raises(ValueError, match=rf"bitflip:<N> takes a number of bits N from 1 to {MAX_BITS}, got"):
        make_env(name, 1, "cpu")


def test_runs_on_any_device(device):
    env = BitFlip(8, 32, device, seed=0)
    for _ in range(40):
        step = env.step(torch.randint(0, 8, (32,), device=device))
    for t in step:
        assert t.device.type == device.type and t.shape[0] == 32
    assert (env.steps < 8).all() and (env.state != env.goal).any(1).all()


def _captured_step(env: BitFlip, actions: torch.Tensor, graph: torch.cuda.CUDAGraph):
    """``env.step(actions)`` captured in ``graph`` after a warm-up step on a side stream; the Step it writes."""
    from gper.replay.graphs import capture

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        env.step(actions)  # allocate and load kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with capture(graph):
        out = env.step(actions)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("rng", ["default", "owned"])
def test_a_captured_step_replays_as_eager_steps(rng):
    """Each replay, from a state and generator rewound afterwards, equals an eager step of the same
    actions (which runs with host synchronisations forbidden); episodes end and reset in between.
    ``default``: torch's generator (``graph_safe_rng``, as the trainer runs it); ``owned``: the env's
    own, registered with the graph."""
    if rng == "owned" and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        pytest.skip("this torch cannot register a private generator with a CUDA graph")
    n, num = 4, 512
    torch.manual_seed(0)
    env = BitFlip(n, num, "cuda", seed=0, graph_safe_rng=rng == "default")
    actions = torch.zeros(num, dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    if rng == "owned":
        graph.register_generator_state(env.generator)
    out = _captured_step(env, actions, graph)
    draw = torch.Generator(device="cuda").manual_seed(1)
    ends = 0
    for _ in range(40):
        actions.copy_(torch.randint(0, n, (num,), device="cuda", generator=draw))
        saved, saved_rng = env.state_dict(), torch.cuda.get_rng_state()
        graph.replay()
        replayed = [t.clone() for t in out]
        after = {k: v for k, v in env.state_dict().items() if k != "generator"}
        env.load_state_dict(saved)
        torch.cuda.set_rng_state(saved_rng)
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager = env.step(actions)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for name, x, y in zip(eager._fields, replayed, eager, strict=True):
            assert torch.equal(x, y), name
        for key, value in after.items():
            assert torch.equal(env.state_dict()[key], value), key
        ends += int((eager.terminated | eager.truncated).sum())
    assert ends > num  # every copy ended at least once on average: resets were replayed too
    assert (env.state != env.goal).any(1).all()


@pytest.mark.gpu
def test_an_out_of_range_action_on_cuda_flips_nothing():
    env = BitFlip(3, 2, "cuda", seed=0)
    before = env.observe()
    step = env.step(torch.tensor([3, -1], device="cuda"))
    assert torch.equal(step.next_obs, before) and env.steps.tolist() == [1, 1]
