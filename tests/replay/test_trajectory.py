"""The trajectory buffer's own checks: its layout, back end against back end (the interpreter on
the CPU, the GPU's Triton against torch on CUDA), its invariants on random streams, and on CUDA
graph capture and no host syncs. The plain-Python oracle tests are in test_trajectory_oracle.py."""

from __future__ import annotations

import pytest
import torch

import gper
from gper.ops.trajectory.reference import expected_drawable
from gper.replay import RowLayout

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32)}
USER_SPEC = {"obs": ((51,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32)}


def _streams(rb: gper.TrajectoryReplayBuffer, steps: int, seed: int = 0, p_end: float = 0.15):
    """Add ``steps`` random steps: stream 0 autoresets next-step, stream 1 same-step, the others
    same-step with occasional unflagged resets; yield after every add."""
    g = torch.Generator().manual_seed(seed)
    e, d = rb.num_envs, rb.spec["obs"][0][0]
    obs = torch.randn(e, d, generator=g)
    for _ in range(steps):
        nxt = torch.randn(e, d, generator=g)
        term = torch.rand(e, generator=g) < p_end
        trunc = (torch.rand(e, generator=g) < p_end / 2) & ~term
        step = {
            "obs": obs,
            "action": torch.randint(0, 4, (e,), generator=g),
            "reward": torch.randn(e, generator=g),
            "next_obs": nxt,
            "terminated": term,
            "truncated": trunc,
        }
        rb.add({k: v.to(rb.device) for k, v in step.items()})
        done = term | trunc
        reset = torch.randn(e, d, generator=g)
        jump = torch.rand(e, generator=g) < 0.05
        obs = torch.where((done | jump)[:, None], reset, nxt)
        obs[0] = nxt[0]  # next-step: the reset step repeats the final observation
        yield step


def _drawable_is_expected(rb: gper.TrajectoryReplayBuffer) -> bool:
    flags = rb.rows.words[:, rb.layout.flags_col]
    want = expected_drawable(flags=flags, streams=rb.streams, rows_per_env=rb.rows_per_env, window=rb.window)
    return bool(torch.equal(want, rb.drawable()))


def test_the_rows_of_the_reference_spec_are_224_bytes():
    rb = gper.TrajectoryReplayBuffer(256 * 4, 256, USER_SPEC, window=2, device="cpu", backend="torch")
    assert rb.layout.row.row_bytes == 224
    flat = RowLayout.build(USER_SPEC | {"next_obs": ((51,), torch.float32), "done": ((), torch.float32)})
    assert flat.row_bytes == 432


@pytest.mark.parametrize("sampling", ["proportional", "rank", "uniform", "stratified"])
def test_the_drawable_starts_follow_the_rule_after_every_add(sampling):
    rb = gper.TrajectoryReplayBuffer(4 * 16, 4, SPEC, window=3, device="cpu", backend="torch", sampling=sampling)
    for i, _ in enumerate(_streams(rb, 60)):
        assert _drawable_is_expected(rb), f"after add {i}"
        if i > rb.window:
            b = rb.sample(16, n_step=2, gamma=0.9)
            assert bool(rb.drawable()[b.indices].all())
            rb.update_priorities(b, torch.randn(16))
    assert rb.stats()["discontinuities"] > 0


def _run(backend: str, device: str, steps: int = 40, arity: int = 4, envs: int = 3, rows: int = 12):
    rb = gper.TrajectoryReplayBuffer(envs * rows, envs, SPEC, window=3, device=device, backend=backend, arity=arity)
    g = torch.Generator().manual_seed(1)
    draws = []
    for i, _ in enumerate(_streams(rb, steps)):
        if i > rb.window:
            b = rb.sample(8, n_step=1 + i % rb.window, gamma=0.9)
            draws.append([t.clone() for t in (b.indices, b.rows, b.next_rows, b.discount, b.weights)])
            rb.update_priorities(b, torch.randn(8, generator=g).to(device))
            s = rb.sample_sequences(4, length=2, burn_in=2)
            draws.append([t.clone() for t in (s.indices, s.rows, s.mask)])
    return rb, draws


def _same(a, b):
    rb_a, draws_a = a
    rb_b, draws_b = b
    for name in ("rows", "gen", "streams", "pending", "tcounters"):
        assert torch.equal(rb_a.state_dict()[name].cpu(), rb_b.state_dict()[name].cpu()), name
    assert torch.equal(rb_a.drawable().cpu(), rb_b.drawable().cpu())
    for x, y in zip(draws_a, draws_b, strict=True):
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            if u.dtype == torch.float32:  # IS weights: the back ends' priorities differ in the last bit
                torch.testing.assert_close(u.cpu(), v.cpu(), rtol=1e-6, atol=0)
            else:
                assert torch.equal(u.cpu(), v.cpu()), i


@pytest.mark.parametrize(
    "envs, rows, arity",
    [(3, 12, 4), (8, 16, 4), (4, 16, 4), (4, 16, 2), (3, 10, 4)],
    ids=["one private level", "two private levels", "all levels private", "four private levels", "not aligned"],
)
def test_triton_agrees_with_torch_under_the_interpreter(envs, rows, arity):
    # the Triton add repairs the levels inside a stream's block itself, the shared ones in its last
    # program, or (blocks not aligned with nodes) in launches of their own
    a = _run("torch", "cpu", envs=envs, rows=rows, arity=arity)
    b = _run("triton", "cpu", envs=envs, rows=rows, arity=arity)
    _same(a, b)
    # the trees too, inner nodes included (the back ends' priorities differ in the last bit, and their
    # sums run in other orders: float32 rounding apart; the last cell is the trash)
    for name in ("tree", "mintree"):
        torch.testing.assert_close(getattr(a[0].tree, name)[:-1], getattr(b[0].tree, name)[:-1], rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_triton_agrees_with_torch_on_cuda():
    _same(_run("torch", "cuda", steps=120, arity=32), _run("triton", "cuda", steps=120, arity=32))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_step_is_captured_in_a_graph_without_host_syncs(backend):
    e, t = 64, 64
    rb = gper.TrajectoryReplayBuffer(e * t, e, USER_SPEC, window=3, device="cuda", backend=backend, cuda_graphs=False)
    step = {
        "obs": torch.randn(e, 51, device="cuda"),
        "action": torch.zeros(e, dtype=torch.int64, device="cuda"),
        "reward": torch.randn(e, device="cuda"),
        "next_obs": torch.randn(e, 51, device="cuda"),
        "terminated": torch.zeros(e, dtype=torch.bool, device="cuda"),
        "truncated": torch.zeros(e, dtype=torch.bool, device="cuda"),
    }
    for _ in range(rb.window + 2):
        step["obs"].copy_(step["next_obs"])
        rb.add(step)
    gamma = torch.tensor(0.99, device="cuda")
    out = {}

    def body():
        step["obs"].copy_(step["next_obs"])
        step["next_obs"].add_(1.0)
        rb.add(step)
        b = rb.sample(256, n_step=3, gamma=gamma)
        rb.update_priorities(b, b["reward"] - 0.5)
        out["reward"] = b["reward"]
        s = rb.sample_sequences(32, length=3, burn_in=1)
        rb.update_priorities(s, torch.ones(32, 3, device="cuda"))
        out["mask"] = s["mask"]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up: compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    from gper.replay.graphs import capture

    with capture(graph):
        body()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    # the adds that ran: the filling ones, the warm-up's and 20 replays (a capture runs nothing)
    assert rb.stats()["steps"] == rb.window + 2 + 1 + 20
    assert _drawable_is_expected(rb)


@pytest.mark.gpu
def test_eager_calls_replay_the_buffers_own_graphs_with_the_same_results():
    results = []
    for graphs in (False, True):
        rb = gper.TrajectoryReplayBuffer(8 * 32, 8, SPEC, window=3, device="cuda", cuda_graphs=graphs)
        drawn = []
        for i, _ in enumerate(_streams(rb, 40)):
            if i > rb.window:
                b = rb.sample(64, n_step=3, gamma=0.95)
                drawn.append((b.indices.clone(), b["reward"].clone(), b["next_obs"].clone()))
                rb.update_priorities(b, b["reward"].abs())
        results.append(drawn)
    for x, y in zip(*results, strict=True):
        for u, v in zip(x, y, strict=True):
            assert torch.equal(u, v)


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", ["proportional", "rank"])
@pytest.mark.parametrize("rows", [40, 1024], ids=["repair in launches", "repair in the add kernel"])
def test_many_streams_keep_the_drawable_rule_under_stress(sampling, rows):
    # 1024 rows a stream: the levels of 32 and 1024 slots lie inside a stream's block (the add
    # kernel repairs them), the top level is shared (its last program recomputes it)
    rb = gper.TrajectoryReplayBuffer(256 * rows, 256, SPEC, window=5, device="cuda", sampling=sampling)
    for i, _ in enumerate(_streams(rb, 300, seed=3, p_end=0.05)):
        if i % 37 == 0:
            assert _drawable_is_expected(rb), f"after add {i}"
        if i > rb.window:
            b = rb.sample(4096, n_step=1 + i % 5, gamma=0.99)
            rb.update_priorities(b, torch.randn(4096, device="cuda"))
    assert _drawable_is_expected(rb)
    st = rb.stats()
    assert st["invalid_indices"] == 0 and st["drawable"] > 0
    # every inner node agrees with its leaves after the repairs of 300 adds and updates
    from gper.replay.checkpoint import check_contents
    from gper.replay.trajectory_checkpoint import written_slots

    check_contents(
        rb.state_dict(), rb.tree.layout, 0, rb.device, carries=rb.drawable(), written=written_slots(rb.streams, rows)
    )


def _step(e: int, obs, nxt, action, term=False, device="cpu"):
    return {
        "obs": obs,
        "action": action,
        "reward": torch.ones(e),
        "next_obs": nxt,
        "terminated": torch.full((e,), term),
        "truncated": torch.zeros(e, dtype=torch.bool),
    }


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_small_observation_sharing_a_word_with_another_field_is_compared_alone(backend):
    # a (3,) uint8 observation and a uint8 action share a word of the row: only the observation's
    # bytes may decide whether a step continues its episode
    spec = {"obs": ((3,), torch.uint8), "action": ((), torch.uint8), "reward": ((), torch.float32)}
    rb = gper.TrajectoryReplayBuffer(2 * 16, 2, spec, window=2, device="cpu", backend=backend)
    obs = torch.zeros(2, 3, dtype=torch.uint8)
    for i in range(10):
        nxt = obs + 1
        rb.add(_step(2, obs, nxt, torch.full((2,), 7 + i, dtype=torch.uint8)))
        obs = nxt
    st = rb.stats()
    assert st["discontinuities"] == 0 and st["size"] == 20
    assert rb.storage["obs"][0, :10, 0].tolist() == list(range(10))


@pytest.mark.parametrize("shape", [(4, 3), (70_000,)], ids=["a last dimension of 3 bytes", "2^16 words and more"])
def test_the_triton_add_stores_fields_of_any_shape_as_the_torch_one(shape):
    dtype = torch.uint8 if len(shape) == 2 else torch.float32
    spec = {"obs": (shape, dtype), "reward": ((), torch.float32)}
    out = []
    for backend in ("torch", "triton"):
        rb = gper.TrajectoryReplayBuffer(4, 1, spec, window=1, device="cpu", backend=backend)
        g = torch.Generator().manual_seed(0)
        obs = torch.randint(0, 200, (1, *shape), generator=g).to(dtype)
        for _ in range(3):
            nxt = torch.randint(0, 200, (1, *shape), generator=g).to(dtype)
            flags = {"terminated": torch.zeros(1, dtype=torch.bool), "truncated": torch.zeros(1, dtype=torch.bool)}
            rb.add({"obs": obs, "reward": torch.ones(1), "next_obs": nxt} | flags)
            obs = nxt
        out.append(rb.rows.rows.clone())
        assert rb.stats()["discontinuities"] == 0
    assert torch.equal(out[0], out[1])


@pytest.mark.parametrize("autoreset, rows, drawable", [("same-step", 19, 9), ("next-step", 10, 5), ("auto", 10, 5)])
def test_autoreset_says_how_a_step_after_an_episode_end_is_read(autoreset, rows, drawable):
    # every step terminates and every observation is the same. "same-step": each step after an
    # end is a new episode's first (an end row holding the final observation, then the step: 19
    # rows, every step but the newest drawable); "next-step", and "auto" since the observations
    # are equal bit for bit: each is a reset step (an end row: 10 rows, the 5 other steps drawable)
    spec = {"obs": ((1,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32)}
    rb = gper.TrajectoryReplayBuffer(64, 1, spec, window=1, autoreset=autoreset, device="cpu", backend="torch")
    o = torch.zeros(1, 1)
    for i in range(10):
        rb.add(_step(1, o, o, torch.tensor([i]), term=True))
    st = rb.stats()
    assert (st["size"], st["drawable"], st["discontinuities"]) == (rows, drawable, 0)


def test_len_never_goes_down():
    rb = gper.TrajectoryReplayBuffer(2 * 32, 2, SPEC, window=2, device="cpu", backend="torch")
    seen = []
    for _ in _streams(rb, 20, p_end=0.5):
        seen.append(len(rb))
        rb.stats()
        seen.append(len(rb))
    assert seen == sorted(seen)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda st: st["tcounters"].__setitem__(0, -1), "is negative"),
        (lambda st: st["host"].__setitem__("steps", 10**6), "host counts more steps"),
        (lambda st: st["streams"][:, 0].add_(100), "rows are not between"),
    ],
    ids=["a negative count", "host steps", "stream rows"],
)
def test_a_state_whose_counts_disagree_is_refused(corrupt, message):
    rb = gper.TrajectoryReplayBuffer(2 * 16, 2, SPEC, window=2, device="cpu", backend="torch")
    for _ in _streams(rb, 12):
        pass
    st = {
        k: (v.clone() if isinstance(v, torch.Tensor) else dict(v) if isinstance(v, dict) else v)
        for k, v in rb.state_dict().items()
    }
    corrupt(st)
    fresh = gper.TrajectoryReplayBuffer(2 * 16, 2, SPEC, window=2, device="cpu", backend="torch")
    before = {k: v.clone() for k, v in fresh.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=message):
        fresh.load_state_dict(st)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in before.items())
