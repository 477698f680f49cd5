"""EpisodeTracker: episode returns and lengths recorded on the device, drained once an epoch."""

from __future__ import annotations

import random

import pytest
import torch

from gper.envs import make_env
from gper.training.episodes import EpisodeTracker
from gper.training.readback import AsyncReadback

CPU = torch.device("cpu")


def test_episode_tracker_matches_a_plain_python_record():
    rng = random.Random(0)
    n, steps = 5, 300
    tracker = EpisodeTracker(n, CPU, ring=64)
    running, lengths, finished = [0.0] * n, [0] * n, []
    counter = torch.zeros((), dtype=torch.float64)
    drained = []
    for t in range(steps):
        reward = [rng.choice([0.0, 1.0, -0.5, 2.25]) for _ in range(n)]
        done = [rng.random() < 0.1 for _ in range(n)]
        counter += n
        tracker.record(torch.tensor(reward, dtype=torch.float64), torch.tensor(done), counter)
        for i in range(n):
            running[i] += reward[i]
            lengths[i] += 1
            if done[i]:
                finished.append((running[i], lengths[i], (t + 1) * n))
                running[i], lengths[i] = 0.0, 0
        if t % 50 == 49:
            rows, lost = tracker.drain(AsyncReadback(tracker.snapshot()).wait() | _host(tracker))
            assert lost == 0
            drained += rows
    assert drained == finished[: len(drained)] and len(finished) - len(drained) < 50 * n


def _host(tracker: EpisodeTracker) -> dict[str, torch.Tensor]:
    readback = AsyncReadback(tracker.snapshot())
    readback.start()
    return readback.wait()


def test_episode_tracker_reports_lost_episodes():
    tracker = EpisodeTracker(4, CPU, ring=4)
    for _ in range(3):  # 12 episodes end, the ring holds 4
        tracker.record(torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.bool), torch.tensor(1.0))
    rows, lost = tracker.drain(_host(tracker))
    assert lost == 8 and len(rows) == 4


def test_a_restored_tracker_still_drains_the_episodes_it_had_not_reported():
    tracker = EpisodeTracker(2, CPU, ring=8)
    tracker.record(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([True, False]), torch.tensor(2.0))
    tracker.record(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([False, True]), torch.tensor(4.0))
    copy = EpisodeTracker(2, CPU, ring=8)
    copy.load_state_dict({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in tracker.state_dict().items()})
    assert copy.drain(_host(copy)) == tracker.drain(_host(tracker)) == ([(1.0, 1, 2), (4.0, 2, 4)], 0)


def _by_copy(tracker: EpisodeTracker, ended: list[torch.Tensor]) -> dict[int, list[tuple[float, int]]]:
    """The tracker's episodes, drained, as (return, length) lists per copy; ``ended`` holds each
    step's bool [N] of the copies whose episode it recorded (rows are written in copy order)."""
    rows, lost = tracker.drain(_host(tracker))
    assert lost == 0
    copies = [int(e) for flags in ended for e in flags.nonzero().flatten()]
    out: dict[int, list[tuple[float, int]]] = {e: [] for e in range(tracker.num_envs)}
    for e, (ret, length, _) in zip(copies, rows, strict=True):
        out[e].append((ret, length))
    return out


def test_next_step_reset_steps_count_in_no_episode():
    """A next-step environment's steps are a same-step one's with a reset step (reward 0, not done)
    after every end: the tracker records the same episodes, returns and lengths."""
    rng = random.Random(1)
    n, steps = 4, 200
    streams = [[(rng.choice([1.0, -0.5, 2.0]), rng.random() < 0.15) for _ in range(steps)] for _ in range(n)]
    expanded = [[x for r, d in s for x in ([(r, d), (0.0, False)] if d else [(r, d)])] for s in streams]
    episodes = {}
    for mode, data in (("same-step", streams), ("next-step", expanded)):
        tracker = EpisodeTracker(n, CPU, ring=1024, autoreset=mode)
        ended = []
        for t in range(steps):
            done = torch.tensor([s[t][1] for s in data])
            tracker.record(torch.tensor([s[t][0] for s in data], dtype=torch.float64), done, torch.tensor(1.0 * t))
            ended.append(done)
        episodes[mode] = _by_copy(tracker, ended)
    for e in range(n):
        k = len(episodes["next-step"][e])
        assert k >= 5 and episodes["next-step"][e] == episodes["same-step"][e][:k]


def test_a_done_on_a_reset_step_ends_nothing():
    tracker = EpisodeTracker(2, CPU, ring=8, autoreset="next-step")
    one = torch.ones(2, dtype=torch.float64)
    tracker.record(one, torch.tensor([True, False]), torch.tensor(2.0))
    tracker.record(one * 5, torch.tensor([True, True]), torch.tensor(4.0))  # copy 0: a reset step
    tracker.record(one, torch.tensor([True, False]), torch.tensor(6.0))
    assert tracker.drain(_host(tracker)) == ([(1.0, 1, 2), (6.0, 2, 4), (1.0, 1, 6)], 0)
    state = tracker.state_dict()
    assert state["resetting"].tolist() == [True, False]
    tracker.restart()
    assert tracker.resetting.tolist() == [False, False] and tracker.lengths.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("seed", [0, 7])
def test_gymnasium_episodes_are_the_same_in_both_autoreset_modes(seed):
    """CartPole-v1 through Gymnasium (time limit 45, so episodes end both ways) with a policy of the
    observation alone: the tracker records the same episodes, in the same order per copy, whether
    the copies reset in the step that ended them or in a reset step after it; their lengths are a
    lone Gymnasium env's, seeded the same."""
    gym = pytest.importorskip("gymnasium")
    n, steps = 3, 400

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 2] > 0).long()  # push towards the lean: episodes of 30 to 60 steps

    episodes = {}
    for mode in ("same-step", "next-step"):
        env = make_env("gym:CartPole-v1", n, "cpu", seed=seed, autoreset=mode, max_episode_steps=45)
        tracker = EpisodeTracker(n, CPU, autoreset=mode)
        obs, ended = env.reset(seed=seed), []
        for t in range(steps):
            step = env.step(policy(obs))
            done = step.terminated | step.truncated
            tracker.record(step.reward.double(), done, torch.tensor(float(t)))
            ended.append(done)
            obs = step.obs
        episodes[mode] = _by_copy(tracker, ended)
        env.close()
    same, nxt = episodes["same-step"], episodes["next-step"]
    truncations = 0
    for e in range(n):
        k = len(nxt[e])
        assert k >= 5 and nxt[e] == same[e][:k]  # next-step spends a step on each reset
        ref = gym.make("CartPole-v1", max_episode_steps=45)
        obs, _ = ref.reset(seed=seed + e)
        lengths, length = [], 0
        while len(lengths) < len(same[e]):
            obs, _, terminated, truncated, _ = ref.step(int(policy(torch.from_numpy(obs))))
            length += 1
            if terminated or truncated:
                lengths.append(length)
                truncations += truncated
                obs, length = ref.reset()[0], 0
        assert [(float(x), x) for x in lengths] == same[e]  # reward 1 a step
    assert 0 < truncations < sum(len(same[e]) for e in range(n))  # episodes ended both ways


def test_a_population_records_each_episodes_agent():
    """Four environments, two agents of two: environments 0-1 are agent 0's, 2-3 agent 1's."""
    tracker = EpisodeTracker(4, torch.device("cpu"), ring=3, agents=2)
    assert tracker.ring == 6  # per agent
    ones = torch.ones(4, dtype=torch.float64)
    tracker.record(ones, torch.tensor([False, True, True, False]), torch.tensor(1.0))
    tracker.record(2 * ones, torch.tensor([True, False, False, True]), torch.tensor(2.0))
    per_agent, lost = tracker.drain_agents(_host(tracker))
    assert lost == 0 and per_agent == [[(1.0, 1, 1), (3.0, 2, 2)], [(1.0, 1, 1), (3.0, 2, 2)]]
    tracker.record(ones, torch.tensor([False, False, True, False]), torch.tensor(3.0))
    assert tracker.drain(_host(tracker)) == ([(3.0, 2, 3)], 0)  # drain: all agents' together, 3-tuples
    single = EpisodeTracker(2, torch.device("cpu"))
    single.record(torch.ones(2, dtype=torch.float64), torch.tensor([True, False]), torch.tensor(1.0))
    assert single.table.shape[1] == 3 and single.drain_agents(_host(single)) == ([[(1.0, 1, 1)]], 0)
    with pytest.raises(ValueError, match="agents must be an integer >= 1 that divides num_envs 4, got 3"):
        EpisodeTracker(4, torch.device("cpu"), agents=3)


@pytest.mark.parametrize("mode", ["same-step", "next-step"])
# 1400 environments: one block of eight warps; 4500: two blocks (the count carried between them)
@pytest.mark.parametrize("agents,envs_each", [(1, 7), (3, 5), (2, 700), (3, 1500)])
def test_the_record_kernel_writes_what_the_torch_ops_write(device, mode, agents, envs_each):
    """EpisodeTracker(kernels="triton") against the torch ops over many steps with random rewards
    and ends (the ring wrapping several times): the same sums, rows, count and drains; the ring's
    spare row aside."""
    from gper._triton import HAS_TRITON
    from helpers import TRITON_ON_CPU

    if not (HAS_TRITON if device.type == "cuda" else TRITON_ON_CPU):
        pytest.skip("the record kernel needs Triton (on CPU tensors, TRITON_INTERPRET=1)")
    n = agents * envs_each
    ring = 16 if agents * envs_each < 100 else 2048
    ops = EpisodeTracker(n, device, ring=ring, autoreset=mode, agents=agents)
    fused = EpisodeTracker(n, device, ring=ring, autoreset=mode, agents=agents, kernels="triton")
    gen = torch.Generator(device).manual_seed(0)
    env_step = torch.zeros((), dtype=torch.float64, device=device)
    drained = [[], []]
    for t in range(30):
        reward = torch.randn(n, device=device, generator=gen)  # float32, as an environment's
        if t % 2:
            reward = reward.to(torch.float64)
        done = torch.rand(n, device=device, generator=gen) < 0.3
        env_step += n
        ops.record(reward, done, env_step)
        fused.record(reward, done, env_step)
        for name in ("returns", "lengths", "resetting", "count"):
            assert torch.equal(getattr(ops, name), getattr(fused, name)), (t, name)
        assert torch.equal(ops.table[:-1], fused.table[:-1]), t
        if t % 7 == 6:
            for k, tracker in enumerate((ops, fused)):
                host = {k2: v.cpu() for k2, v in tracker.snapshot().items()}
                drained[k].append(tracker.drain_agents(host))
    assert int(ops.count) > 2 * ops.ring or n < 100  # the ring wrapped
    assert drained[0] == drained[1]


def test_the_record_kernels_setting_is_checked():
    with pytest.raises(ValueError, match="kernels"):
        EpisodeTracker(2, CPU, kernels="cuda")


def test_the_record_kernel_reads_strided_rewards_and_flags():
    """Rewards and flags as columns of wider tensors (strided views): the kernel records what the ops do."""
    from helpers import TRITON_ON_CPU

    if not TRITON_ON_CPU:
        pytest.skip("the record kernel needs the Triton interpreter on the CPU")
    trackers = [EpisodeTracker(8, CPU, ring=16, kernels=k) for k in ("torch", "triton")]
    rewards = torch.arange(16, dtype=torch.float32).view(8, 2)
    done = torch.tensor([[False, True], [True, False]] * 4)
    for t in range(3):
        for tracker in trackers:
            tracker.record(rewards[:, 1], done[:, t % 2], torch.tensor(float(t), dtype=torch.float64))
    assert torch.equal(trackers[0].returns, trackers[1].returns)
    assert torch.equal(trackers[0].table[:-1], trackers[1].table[:-1]) and int(trackers[1].count) > 0
