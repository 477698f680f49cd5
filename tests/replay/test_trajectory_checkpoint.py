"""TrajectoryReplayBuffer's state_dict / load_state_dict, save / load and deepcopy: a restored
buffer continues exactly where the original was (the same draws, the same episode reading of the
next steps: its streams' counts, episode starts and pending observations travel too), and a state
from a buffer of another configuration is refused with the buffer unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

import gper
from trajectory_helpers import SPEC, Run, assert_unchanged, snapshot, to_torch

E, T, W = 2, 12, 4


def used(sampling: str = "proportional", seed: int = 17) -> Run:
    """A buffer with history: wrapped, episodes ended, sampled, updated (some updates stale)."""
    run = Run(E * T, E, W, seed=seed, sampling=sampling, rank_refresh_interval=3)
    g = torch.Generator().manual_seed(seed)
    for step in range(30):
        run.add()
        if step >= W:
            batch = run.rb.sample(8, n_step=2, gamma=0.9)
            run.rb.update_priorities(batch, torch.randn(8, generator=g))
            seq = run.rb.sample_sequences(4, 3, burn_in=2)
            run.rb.update_priorities(seq, torch.randn(4, 3, generator=g))
    return run


def future(rb, gen, steps: int = 12) -> tuple[list[dict[str, torch.Tensor]], dict]:
    """What a buffer does next, fed the steps of ``gen``: every draw, its trees, its counts."""
    out = []
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        rb.add(to_torch(gen.step()))
        batch = rb.sample(16, n_step=3, gamma=0.8)
        out.append(dict(batch) | {"indices": batch.indices, "weights": batch.weights, "gen": batch.generations})
        rb.update_priorities(batch, torch.randn(16, generator=g))
        seq = rb.sample_sequences(8, 3, burn_in=2)
        out.append(dict(seq) | {"indices": seq.indices, "weights": seq.weights, "gen": seq.generations})
        rb.update_priorities(seq, torch.randn(8, 3, generator=g))
    out.append({"drawable": rb.drawable(), "priorities": rb.priorities(torch.arange(rb.capacity))})
    return [{k: v.clone() for k, v in d.items()} for d in out], rb.stats()


def assert_same_future(a, b) -> None:
    (da, sa), (db, sb) = a, b
    assert sa == sb, f"stats differ: {sa} vs {sb}"
    for n, (x, y) in enumerate(zip(da, db, strict=True)):
        assert x.keys() == y.keys()
        for k in x:
            same = x[k].shape == y[k].shape and torch.equal(x[k].view(torch.uint8), y[k].view(torch.uint8))
            assert same, f"step {n}: {k!r} differs"


@pytest.mark.parametrize("sampling", ["proportional", "stratified", "rank", "uniform"])
def test_state_dict_round_trip_into_a_fresh_buffer(sampling):
    run = used(sampling)
    state = {
        k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in run.rb.state_dict().items()
    }
    saved = snapshot(run.rb)
    fresh = Run(E * T, E, W, seed=0, sampling=sampling, rank_refresh_interval=3).rb
    fresh.load_state_dict(state)
    assert fresh.seed == 17
    assert_unchanged(fresh, saved)
    gen = copy.deepcopy(run.gen)
    assert_same_future(future(run.rb, run.gen), future(fresh, gen))


def test_round_trip_through_a_file(tmp_path):
    run = used()
    path = tmp_path / "trajectory.safetensors"
    run.rb.save(path)
    fresh = Run(E * T, E, W, seed=0, rank_refresh_interval=3).rb
    fresh.add(to_torch(run.gen.__class__(E, seed=99).step()))  # a history of its own, replaced whole
    fresh.load(path)
    assert fresh.stats() == run.rb.stats()
    gen = copy.deepcopy(run.gen)
    assert_same_future(future(run.rb, run.gen), future(fresh, gen))


def test_deepcopy_continues_identically():
    run = used("rank")
    twin = copy.deepcopy(run.rb)
    gen = copy.deepcopy(run.gen)
    assert_same_future(future(run.rb, run.gen), future(twin, gen))


def test_a_batch_drawn_before_a_load_is_stale_after_it():
    run = used()
    batch = run.rb.sample(8)
    run.rb.load_state_dict(run.rb.state_dict())
    before = run.rb.priorities(torch.arange(E * T)).clone()
    stale = run.rb.stats()["stale_updates"]
    run.rb.update_priorities(batch, torch.full((8,), 100.0))
    assert run.rb.stats()["stale_updates"] == stale + 8
    assert torch.equal(run.rb.priorities(torch.arange(E * T)), before)


PIXELS = {**SPEC, "pixels": ((2,), torch.uint8)}
MISMATCHES = [
    ({"capacity": E * T + E}, "capacity"),
    ({"num_envs": 1}, "num_envs"),
    ({"window": W - 1}, "window"),
    ({"alpha": 0.5}, "alpha"),
    ({"sampling": "stratified"}, "sampling"),
    ({"spec": {**SPEC, "action": ((), torch.int32)}}, "spec"),
    ({"spec": {**SPEC, "obs": ((4,), torch.float32)}}, "spec"),
    ({"spec": PIXELS, "obs_keys": ("obs", "pixels")}, "obs_keys"),
]


@pytest.mark.parametrize("change, key", MISMATCHES, ids=[m[1] + str(i) for i, m in enumerate(MISMATCHES)])
def test_a_state_of_another_config_is_refused(change, key):
    src = used().rb
    kw = {"capacity": E * T, "num_envs": E, "spec": SPEC, "window": W, "device": "cpu", "rank_refresh_interval": 3}
    dst = gper.TrajectoryReplayBuffer(**(kw | change))
    before = snapshot(dst)
    with pytest.raises(ValueError, match=key):
        dst.load_state_dict(src.state_dict())
    assert_unchanged(dst, before)


def test_a_flat_buffers_state_is_refused():
    flat = gper.PrioritizedReplayBuffer(E * T, SPEC, device="cpu")
    dst = used().rb
    before = snapshot(dst)
    with pytest.raises(ValueError):
        dst.load_state_dict(flat.state_dict())
    assert_unchanged(dst, before)


def test_a_state_missing_any_tensor_is_refused():
    """Whichever tensor is missing (the streams' counts, episode starts and pending observations
    among them), the load is refused and the buffer unchanged."""
    full = used().rb.state_dict()
    dst = used(seed=3).rb
    before = snapshot(dst)
    names = [k for k, v in full.items() if isinstance(v, torch.Tensor)]
    assert len(names) >= 5, names
    for name in names:
        state = {k: v for k, v in full.items() if k != name}
        with pytest.raises(ValueError, match=name):
            dst.load_state_dict(state)
        assert_unchanged(dst, before)
