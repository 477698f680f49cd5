"""Hindsight relabelling's API and guarantees besides the oracle's (test_her_oracle.py): its
settings and their one-line errors, draws that are the plain buffer's (same starts, priorities and
IS weights) with only goals, rewards and flags changed, determinism per seed, the episode index's
bytes, checkpoints (a restored buffer samples what the original would; a corrupt index is refused
with the buffer unchanged), the Triton back end, and on the GPU: relabelling inside the captured
sample, graph replays equal to eager draws, no host syncs."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import gper
from gper.replay.episodes import EpisodeIndex, ring_records
from helpers import TRITON_ON_CPU
from her_oracle import OBS_KEYS, SPEC, GoalStreams, reward_fn, terminated_fn
from trajectory_helpers import assert_unchanged, snapshot, to_torch

E, T, W = 3, 16, 3


def her(**kw) -> gper.HindsightRelabeling:
    return gper.HindsightRelabeling(reward_fn, **({"info_keys": ("action",)} | kw))


def build(h=None, seed: int = 7, device: str = "cpu", backend: str = "torch", spec=SPEC, obs_keys=OBS_KEYS, **kw):
    return gper.TrajectoryReplayBuffer(
        E * T, E, spec, window=W, obs_keys=obs_keys, device=device, backend=backend, seed=seed, her=h, **kw
    )


def feed(rbs, steps: int, seed: int = 1, gen: GoalStreams | None = None, device: str = "cpu") -> GoalStreams:
    gen = gen or GoalStreams(E, seed=seed, goal_values=4, long_length=2 * T)
    for _ in range(steps):
        data = to_torch(gen.step(), device)
        for rb in rbs:
            rb.add(data)
    return gen


def fields(batch) -> dict[str, torch.Tensor]:
    out = {name: batch[name].clone() for name in batch}
    return out | {"indices": batch.indices.clone(), "weights": batch.weights.clone(), "gen": batch.generations.clone()}


def assert_same(a: dict, b: dict, what: str = "") -> None:
    assert a.keys() == b.keys(), (what, sorted(a), sorted(b))
    for k in a:
        x, y = a[k].cpu().contiguous(), b[k].cpu().contiguous()
        same = x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        assert same, f"{what} {k!r} differs"


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "kw, err, match",
    [
        ({"reward_fn": 3}, TypeError, "reward_fn must be callable"),
        ({"terminated_fn": "yes"}, TypeError, "terminated_fn must be callable or None"),
        ({"strategy": "futur"}, ValueError, "strategy must be one of"),
        ({"relabel_ratio": 1.5}, ValueError, r"relabel_ratio must be in \[0, 1\]"),
        ({"relabel_ratio": -0.1}, ValueError, r"relabel_ratio must be in \[0, 1\]"),
        ({"relabel_ratio": "0.8"}, TypeError, "relabel_ratio must be a float"),
        ({"info_keys": "action"}, TypeError, "info_keys must be a tuple"),
        ({"info_keys": ("action", "action")}, ValueError, "duplicates"),
        ({"desired_goal": "achieved_goal"}, ValueError, "both 'achieved_goal'"),
        ({"achieved_goal": ""}, TypeError, "achieved_goal must be a field name"),
    ],
)
def test_bad_settings_raise_one_line_errors(kw, err, match):
    args = {"reward_fn": reward_fn} | kw
    with pytest.raises(err, match=match) as info:
        gper.HindsightRelabeling(**args)
    assert "\n" not in str(info.value)


def test_the_papers_k_and_the_defaults():
    assert gper.HindsightRelabeling.with_k(reward_fn).relabel_ratio == 0.8
    assert gper.HindsightRelabeling.with_k(reward_fn, k=0, strategy="final").relabel_ratio == 0.0
    assert gper.HindsightRelabeling.with_k(reward_fn, k=1).strategy == "future"
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        gper.HindsightRelabeling.with_k(reward_fn, k=-1)
    h = gper.HindsightRelabeling(reward_fn, info_keys=["action"])
    assert (h.strategy, h.relabel_ratio, h.info_keys, h.terminated_fn) == ("future", 0.8, ("action",), None)
    assert gper.HindsightRelabeling is gper.replay.HindsightRelabeling


@pytest.mark.parametrize(
    "spec, obs_keys, h, match",
    [
        ({k: v for k, v in SPEC.items() if k != "desired_goal"}, ("obs", "achieved_goal"), her(), "is not in the spec"),
        (SPEC, ("obs", "achieved_goal"), her(), "'desired_goal' is in the spec but not in obs_keys"),
        (SPEC | {"desired_goal": ((3,), torch.float32)}, OBS_KEYS, her(), "must have one shape and dtype"),
        (SPEC | {"desired_goal": ((2,), torch.float64)}, OBS_KEYS, her(), "must have one shape and dtype"),
        (SPEC, OBS_KEYS, her(info_keys=("action", "done")), r"info_keys \['done'\] are not fields of a step"),
    ],
)
def test_a_buffer_refuses_settings_that_do_not_fit_its_fields(spec, obs_keys, h, match):
    with pytest.raises(ValueError, match=match) as info:
        build(h, spec=spec, obs_keys=obs_keys)
    assert "\n" not in str(info.value)


def test_bad_calls_raise():
    with pytest.raises(TypeError, match="her must be a gper.HindsightRelabeling"):
        build({"strategy": "future"})
    plain, rb = build(), build(her())
    feed([plain, rb], W + 2)
    with pytest.raises(ValueError, match="needs a buffer built with her"):
        plain.sample(4, relabel=True)
    with pytest.raises(TypeError, match="relabel must be a bool"):
        rb.sample(4, relabel=1)
    bad = build(gper.HindsightRelabeling(lambda a, d, i: torch.zeros(len(a), 1)))
    feed([bad], W + 2)
    with pytest.raises(ValueError, match=r"reward_fn must return a \[4\] tensor"):
        bad.sample(4)


class _FailOnce:
    """A reward function that returns one value per draw too few while ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False

    def __call__(self, achieved, desired, info):
        out = reward_fn(achieved, desired, info)
        return out[1:] if self.fail else out


def test_a_failed_relabelling_sample_leaves_the_buffer_unchanged():
    """A reward_fn that fails in one call: the buffer's state after it is as before it (the tree's
    random counter included), so the draws that follow are those of a buffer that never made it."""
    fn = _FailOnce()
    failed, clean = build(gper.HindsightRelabeling(fn, info_keys=("action",))), build(her())
    feed([failed, clean], W + 6)
    for rb in (failed, clean):  # a first draw stages the beta input, as any sample does
        rb.sample(8, n_step=2, gamma=0.5)
    before = snapshot(failed)
    fn.fail = True
    with pytest.raises(ValueError, match=r"reward_fn must return a \[16\] tensor"):
        failed.sample(8, n_step=2, gamma=0.5)
    fn.fail = False
    assert_unchanged(failed, before)
    assert_same(fields(failed.sample(8, n_step=2, gamma=0.5)), fields(clean.sample(8, n_step=2, gamma=0.5)))


# ---------------------------------------------------------------- draws


@pytest.mark.parametrize("sampling", ["proportional", "rank"])
def test_relabelling_changes_goals_rewards_and_flags_only(sampling):
    """The same starts, generations and IS weights as the plain buffer (the transition is drawn
    first, the goal given it); relabel=False and strategy "none" draw exactly the plain batch."""
    plain = build(sampling=sampling)
    rbs = {s: build(her(strategy=s, terminated_fn=terminated_fn), sampling=sampling) for s in ("future", "none")}
    g = torch.Generator().manual_seed(0)
    gen = GoalStreams(E, seed=1, goal_values=4, long_length=2 * T)
    for step in range(40):
        feed([plain, *rbs.values()], 1, gen=gen)
        if step <= W:
            continue
        want = fields(plain.sample(32, n_step=2, gamma=0.9))
        td = torch.randn(32, generator=g)
        plain.update_priorities(plain.sample(8), td[:8])
        for name, rb in rbs.items():
            b = rb.sample(32, n_step=2, gamma=0.9, relabel=name == "future")
            got = fields(b)
            assert not got.pop("relabelled").any() or name == "future"
            changed = ("reward", "desired_goal", "next_desired_goal", "terminated", "truncated", "discount")
            changed += ("next_obs", "next_achieved_goal")  # the return may stop sooner for a new goal
            keep = changed if name == "future" else ()
            same = {k: v for k, v in want.items() if k not in keep}
            assert_same({k: v for k, v in got.items() if k not in keep}, same, f"{name} step {step}")
            rb.update_priorities(rb.sample(8), td[:8])
    assert_same({"p": plain.priorities(torch.arange(E * T))}, {"p": rbs["future"].priorities(torch.arange(E * T))})


def test_ratio_one_relabels_every_draw_and_none_never():
    rbs = [build(her(relabel_ratio=1.0)), build(her(relabel_ratio=1.0, strategy="none"))]
    feed(rbs, 30)
    assert bool(rbs[0].sample(256).relabelled.all())
    assert not rbs[1].sample(256).relabelled.any()
    assert not rbs[0].sample(256, relabel=False).relabelled.any()


def test_draws_are_the_same_for_the_same_seed_and_differ_between_calls():
    a, b, c = build(her(), seed=3), build(her(), seed=3), build(her(), seed=4)
    feed([a, b, c], 30)
    x, y = fields(a.sample(64, n_step=2, gamma=0.9)), fields(b.sample(64, n_step=2, gamma=0.9))
    assert_same(x, y)
    z = fields(a.sample(64, n_step=2, gamma=0.9))
    assert not torch.equal(x["desired_goal"], z["desired_goal"])  # the counter moved on
    assert not torch.equal(x["indices"], fields(c.sample(64, n_step=2, gamma=0.9))["indices"])
    assert int(a.state_dict()["her_counter"]) == 128  # one Philox block a draw


def test_sequences_keep_their_goals_and_batches_name_relabelled():
    rb, plain = build(her(relabel_ratio=1.0)), build()
    feed([rb, plain], 20)
    seq = rb.sample_sequences(8, length=2, burn_in=1)
    assert "relabelled" not in seq
    assert_same(dict(seq), dict(plain.sample_sequences(8, length=2, burn_in=1)))
    batch = rb.sample(4)
    assert "relabelled" in batch and batch["relabelled"] is batch.relabelled
    assert batch.relabelled.dtype == torch.bool and batch.relabelled.shape == (4,)
    assert "relabelled" not in plain.sample(4) and plain.sample(4).relabelled is None


def test_the_index_costs_about_12_bytes_a_slot():
    plain, rb = build(), build(her())
    extra = rb.nbytes_estimate - plain.nbytes_estimate
    assert extra == EpisodeIndex.estimate_bytes(E, T) + 8 == E * (4 * T + 16 * (T // 2 + 2) + 8) + 8
    assert ring_records(T) == T // 2 + 2
    got = sum(v.numel() * v.element_size() for k, v in rb.state_dict().items() if k.startswith(("episode", "her")))
    assert got == extra
    assert rb.state_dict().keys() - plain.state_dict().keys() == {
        "episode_ids",
        "episode_current",
        "episode_records",
        "her_counter",
    }


# ---------------------------------------------------------------- checkpoints


def _future(rb, gen: GoalStreams, steps: int = 10) -> list[dict]:
    out = []
    for _ in range(steps):
        rb.add(to_torch(gen.step()))
        b = rb.sample(24, n_step=2, gamma=0.8)
        out.append(fields(b))
        rb.update_priorities(b, b["reward"].abs())
    return out


def _used() -> tuple[gper.TrajectoryReplayBuffer, GoalStreams]:
    rb = build(her(terminated_fn=terminated_fn), seed=21)
    gen = feed([rb], 3 * T)
    for _ in range(3):
        rb.update_priorities(b := rb.sample(16, n_step=3, gamma=0.9), b["reward"].abs())
    return rb, gen


@pytest.mark.parametrize("how", ["state_dict", "file", "deepcopy", "pickle"])
def test_a_restored_buffer_samples_what_the_original_would(how, tmp_path):
    rb, gen = _used()
    if how == "state_dict":
        other = build(her(terminated_fn=terminated_fn), seed=0)
        other.load_state_dict(snapshot(rb))
    elif how == "file":
        other = build(her(terminated_fn=terminated_fn), seed=0)
        rb.save(tmp_path / "her.safetensors")
        other.load(tmp_path / "her.safetensors")
    else:
        other = copy.deepcopy(rb) if how == "deepcopy" else pickle.loads(pickle.dumps(rb))
    assert other.her == rb.her and other.seed == 21
    twin = copy.deepcopy(gen)
    for n, (x, y) in enumerate(zip(_future(rb, gen), _future(other, twin), strict=True)):
        assert_same(x, y, f"step {n}")


def _corrupt(state: dict, what: str) -> None:
    ids, records = state["episode_ids"], state["episode_records"]
    streams = state["streams"]
    count = int(streams[0, 0])
    newest = (count - 1) % T  # stream 0's newest row: a step here (see the test)
    if what == "id":
        ids[newest] = (ids[newest] + 1) % ring_records(T)
    elif what == "id range":
        ids[newest] = ring_records(T)
    elif what == "record end":
        records[0, ids[newest]] = torch.tensor([records[0, ids[newest], 0], count - 1])
    elif what == "record first":
        records[0, ids[newest], 0] += 1
    elif what == "current":
        state["episode_current"][0] = (state["episode_current"][0] + 1) % ring_records(T)
    elif what == "counter":
        state["her_counter"][0] = -1


ROWS_DISAGREE = "the episode index disagrees with the rows' episodes"


@pytest.mark.parametrize(
    "what, match",
    [
        ("id", ROWS_DISAGREE),
        ("id range", rf"an episode index id is outside \[0, {T // 2 + 2}\)"),
        ("record end", ROWS_DISAGREE),
        ("record first", ROWS_DISAGREE),
        ("current", "the episode index's episode in progress disagrees with its stream"),
        ("counter", "the relabelling counter is negative"),
    ],
)
def test_a_corrupt_index_is_refused_and_the_buffer_is_unchanged(what, match):
    rb, _ = _used()
    state = snapshot(rb)
    count = int(state["streams"][0, 0])
    assert (state["rows"].view(torch.int32)[(count - 1) % T, rb.layout.flags_col] & 0x10000) == 0, "newest is a step"
    _corrupt(state, what)
    other = build(her(), seed=0)
    feed([other], W + 3, seed=9)
    before = snapshot(other)
    with pytest.raises(ValueError, match=match) as info:
        other.load_state_dict(state)
    assert "\n" not in str(info.value)
    assert_unchanged(other, before)


@pytest.mark.parametrize(
    "streams",
    [{}, {"lengths": (1, 1), "p_zero_step": 0.0}, {"lengths": (1, 1), "p_zero_step": 1.0, "styles": ("next",)}],
    ids=["mixed", "densest", "zero-step ends"],
)
def test_every_state_add_builds_passes_the_restore_checks(streams):
    """No false alarms: the index after every add (wrapped rings, episodes longer than a ring, end
    rows that end no step) is what the checks accept."""
    rb, other = build(her()), build(her())
    gen = GoalStreams(E, seed=4, long_length=3 * T, **streams)
    for _ in range(4 * T):
        rb.add(to_torch(gen.step()))
        other.load_state_dict(snapshot(rb))


def test_states_with_and_without_an_index_do_not_mix():
    rb, plain = build(her()), build()
    feed([rb, plain], W + 2)
    with pytest.raises(ValueError, match=r"configuration differs in \['her'\]"):
        plain.load_state_dict(snapshot(rb))
    with pytest.raises(ValueError, match=r"configuration differs in \['her'\]"):
        rb.load_state_dict(snapshot(plain))
    # the sampling settings are not the state's: a state moves between strategies and ratios
    build(her(strategy="episode", relabel_ratio=0.2)).load_state_dict(snapshot(rb))


# ---------------------------------------------------------------- back ends and graphs


def _draws(backend: str, device: str, graphs: bool = False, steps: int = 24, n_steps=(1, 3)) -> list[dict]:
    rb = build(her(terminated_fn=terminated_fn), device=device, backend=backend, cuda_graphs=graphs, seed=2)
    gen = GoalStreams(E, seed=4, goal_values=4, long_length=2 * T)
    out = []
    for step in range(steps):
        rb.add(to_torch(gen.step(), device))
        if step > W:
            n = n_steps[step % len(n_steps)]
            b = rb.sample(16, n_step=n, gamma=0.9)
            out.append(fields(b))
            rb.update_priorities(b, b["reward"].abs() + 0.1)
    return out


def _same_draws(a: list[dict], b: list[dict]) -> None:
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        # IS weights: the back ends' priorities differ in the last bit
        torch.testing.assert_close(x.pop("weights").cpu(), y.pop("weights").cpu(), rtol=1e-6, atol=0)
        assert_same(x, y, f"draw {n}")


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton and TRITON_INTERPRET=1")
def test_triton_relabels_as_torch_under_the_interpreter():
    _same_draws(_draws("torch", "cpu", steps=16), _draws("triton", "cpu", steps=16))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_graph_replays_equal_eager_draws_on_cuda(backend):
    # 40 adds: every sample shape is replayed from the buffer's captured graph many times
    _same_draws(_draws(backend, "cuda", graphs=True, steps=40), _draws(backend, "cuda", graphs=False, steps=40))


@pytest.mark.gpu
def test_triton_relabels_as_torch_on_cuda():
    _same_draws(_draws("triton", "cuda", steps=40), _draws("torch", "cuda", steps=40))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_relabelling_is_captured_in_a_callers_graph_without_host_syncs(backend):
    from gper.replay.graphs import capture

    rbs = [build(her(terminated_fn=terminated_fn), device="cuda", backend=backend, cuda_graphs=False) for _ in "ab"]
    gen = feed(rbs, 2 * T, device="cuda")
    step = to_torch(gen.step(), "cuda")
    gamma = torch.tensor(0.9, device="cuda")
    out = {}

    def body(rb):
        # a step that continues every stream's episode: the counters of obs and goals move on
        step["obs"].copy_(step["next_obs"])
        step["achieved_goal"].copy_(step["next_achieved_goal"])
        step["desired_goal"].copy_(step["next_desired_goal"])
        step["next_obs"].add_(1000.0)
        step["next_achieved_goal"].add_(1.0)
        rb.add(step)
        b = rb.sample(64, n_step=3, gamma=gamma)
        rb.update_priorities(b, b["reward"].abs())
        out["batch"] = fields(b)

    start = {k: v.clone() for k, v in step.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body(rbs[0])  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        body(rbs[0])
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(12):
            graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    captured = out["batch"]
    for k, v in start.items():
        step[k].copy_(v)
    for _ in range(13):  # the warm-up and the 12 replays, eagerly on the twin
        body(rbs[1])
    assert int(rbs[0].state_dict()["her_counter"]) == int(rbs[1].state_dict()["her_counter"]) == 64 * 13
    assert bool(captured["relabelled"].any())
    _same_draws([captured], [out["batch"]])
