"""EpisodeTracker: episode returns and lengths recorded on the device, drained once an epoch."""

from __future__ import annotations

import random

import torch

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
