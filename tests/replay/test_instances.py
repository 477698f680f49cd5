"""A buffer of several instances (``instances=N``) against N single buffers.

Instance ``i`` of ``instances=N, seed=s`` must draw exactly what a single buffer of ``seed=s + i``
(and its own alpha, beta and eps) draws, bit for bit, through add, sample, update, restores and
copies; bad input is refused with every instance unchanged.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import gper
from gper.replay.buffer_instances import InstanceBatch, PrioritizedReplayInstances

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "flag": ((), torch.bool)}
N, CAP, B = 3, 40, 8
ALPHA, EPS = [0.5, 0.6, 0.7], [1e-6, 1e-3, 1e-2]
MODES = ["proportional", "stratified", "rank", "uniform"]


def _pair(device, backend, sampling="proportional", weight_norm="global", cuda_graphs=True, **extra):
    settings = dict(sampling=sampling, weight_norm=weight_norm, device=device, backend=backend, arity=4) | extra
    pop = gper.PrioritizedReplayBuffer(
        CAP, SPEC, instances=N, seed=7, alpha=torch.tensor(ALPHA, dtype=torch.float64), eps=EPS,
        cuda_graphs=cuda_graphs, **settings,
    )  # fmt: skip
    singles = [
        gper.PrioritizedReplayBuffer(CAP, SPEC, seed=7 + i, alpha=ALPHA[i], eps=EPS[i], **settings) for i in range(N)
    ]
    return pop, singles


def _data(g: torch.Generator, n: int, device) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn(N, n, 3, generator=g).to(device),
        "action": torch.randint(0, 9, (N, n), generator=g).to(device),
        "flag": (torch.rand(N, n, generator=g) > 0.5).to(device),
    }


def _same_batch(batch: InstanceBatch, i: int, single) -> None:
    for name in SPEC:
        assert torch.equal(batch[name][i], single[name]), name
    assert torch.equal(batch.indices[i], single.indices)
    assert torch.equal(batch.generations[i], single.generations)
    assert torch.equal(batch.weights[i], single.weights)


def _steps(pop, singles, g, steps: int, device) -> None:
    """Adds, samples (the buffer's beta and an [N] one in turn) and updates, checked step by step."""
    for step in range(steps):
        data = _data(g, 7, device)
        pos = pop.add(data)
        for i, s in enumerate(singles):
            assert torch.equal(pos[i], s.add({k: v[i] for k, v in data.items()}))
        betas = [0.1, 0.5, 0.9]
        beta = torch.tensor(betas, device=device) if step % 2 else None
        batch = pop.sample(B, beta=beta)
        td = torch.randn(N, B, generator=g).to(device)
        td[0, 0] = float("nan")
        for i, s in enumerate(singles):
            single = s.sample(B, beta=betas[i] if step % 2 else None)
            _same_batch(batch, i, single)
            s.update_priorities(single, td[i])
        pop.update_priorities(batch, td)


@pytest.mark.parametrize("weight_norm", ["global", "batch"])
@pytest.mark.parametrize("sampling", MODES)
def test_each_instance_draws_what_its_single_buffer_draws(backend, sampling, weight_norm):
    pop, singles = _pair("cpu", backend, sampling, weight_norm)
    _steps(pop, singles, torch.Generator().manual_seed(0), 12, "cpu")  # 84 adds: the ring wraps
    stats = pop.stats()
    for i, s in enumerate(singles):
        for name, value in s.stats().items():
            assert stats[name][i] == value, name
    assert pop.seeds == (7, 8, 9) and pop.alpha == tuple(ALPHA) and len(pop) == CAP


@pytest.mark.parametrize("sampling", ["proportional", "rank"])
def test_restores_and_copies_draw_on_as_the_original(backend, sampling, tmp_path):
    pop, singles = _pair("cpu", backend, sampling)
    g = torch.Generator().manual_seed(1)
    _steps(pop, singles, g, 4, "cpu")
    fresh = lambda: _pair("cpu", backend, sampling)[0]  # noqa: E731
    loaded, from_file = fresh(), fresh()
    loaded.load_state_dict(pop.state_dict())
    pop.save(tmp_path / "pop.safetensors")
    from_file.load(tmp_path / "pop.safetensors")
    copies = [loaded, from_file, copy.deepcopy(pop), pickle.loads(pickle.dumps(pop))]
    for other in copies:
        assert isinstance(other, PrioritizedReplayInstances) and other.seeds == pop.seeds
    g_state, singles_then = g.get_state(), [copy.deepcopy(s) for s in singles]
    _steps(pop, singles, g, 3, "cpu")  # the original, checked against its singles on the way
    final = pop.sample(B)
    for other in copies:  # each copy goes the same way, checked against the singles as they were
        g.set_state(g_state)
        _steps(other, [copy.deepcopy(s) for s in singles_then], g, 3, "cpu")
        again = other.sample(B)
        for name in ("indices", "weights", "generations", "rows"):
            assert torch.equal(getattr(again, name), getattr(final, name)), name


def test_a_batch_from_before_a_restore_is_stale_for_every_instance(backend):
    pop, _ = _pair("cpu", backend)
    pop.add(_data(torch.Generator().manual_seed(2), 10, "cpu"))
    state = copy.deepcopy(pop.state_dict())
    batch = pop.sample(B)
    pop.load_state_dict(state)
    before = pop.priorities(batch.indices).clone()
    pop.update_priorities(batch, torch.full((N, B), 5.0))
    assert torch.equal(pop.priorities(batch.indices), before)
    assert pop.stats()["stale_updates"] == [B] * N


def _unchanged(pop, call) -> None:
    before = copy.deepcopy(pop.state_dict())
    call()
    after = pop.state_dict()
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[name]), name


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda p: p.add({"obs": torch.zeros(N, 2, 3)}), KeyError, "missing fields"),
        (lambda p: p.add(_data(torch.Generator(), 2, "cpu") | {"obs": torch.zeros(2, 2, 3)}), ValueError, r"\[3, n"),
        (lambda p: p.add(_data(torch.Generator(), 2, "cpu") | {"obs": torch.zeros(N, 2, 4)}), ValueError, "shape"),
        (lambda p: p.update_priorities(torch.zeros(B, dtype=torch.long), torch.zeros(B)), ValueError, r"\[3, B\]"),
        (lambda p: p.update_priorities(torch.zeros(N, B, dtype=torch.long), torch.zeros(N, 2)), ValueError, "shape"),
        (lambda p: p.update_priorities(torch.full((N, B), CAP, dtype=torch.long), torch.zeros(N, B)), IndexError, ""),
        (lambda p: p.sample(B, beta=torch.zeros(2)), ValueError, r"0-d or \[3\]"),
        (lambda p: p.sample(B, beta=torch.tensor([0.1, 2.0, 0.3])), ValueError, r"\[0, 1\]"),
        (lambda p: p.sample(0), ValueError, ">= 1"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(call, error, match):
    pop, _ = _pair("cpu", "torch")
    pop.add(_data(torch.Generator().manual_seed(3), 10, "cpu"))
    _unchanged(pop, lambda: _raises(call, pop, error, match))


def _raises(call, pop, error, match) -> None:
    with pytest.raises(error, match=match):
        call(pop)


@pytest.mark.parametrize(
    "settings, error, match",
    [
        ({"instances": 0}, ValueError, "instances must be None or an int >= 1"),
        ({"instances": 2.0}, TypeError, "instances must be None or an int"),
        ({"instances": 3, "alpha": [0.5, 0.6]}, ValueError, "alpha must be a float or 3 values"),
        ({"instances": 3, "eps": torch.zeros(3)}, ValueError, "eps must be in"),
        ({"instances": 3, "beta": torch.ones(2, 2)}, ValueError, r"beta must be a float or \[3\]"),
        ({"instances": 3, "seed": 2**63 - 2}, ValueError, "seed must be an int in"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_built(settings, error, match):
    with pytest.raises(error, match=match):
        gper.PrioritizedReplayBuffer(CAP, SPEC, device="cpu", **settings)


def test_a_state_of_other_settings_or_a_corrupt_instance_is_refused_whole():
    pop, _ = _pair("cpu", "torch")
    pop.add(_data(torch.Generator().manual_seed(4), 10, "cpu"))
    other = gper.PrioritizedReplayBuffer(CAP, SPEC, instances=2, device="cpu", arity=4)
    with pytest.raises(ValueError, match="configuration differs in .*instances"):
        _unchanged(pop, lambda: pop.load_state_dict(other.state_dict()))
    state = copy.deepcopy(pop.state_dict())
    state["tree"][2, -2] = -1.0  # a leaf of the last instance only
    with pytest.raises(ValueError, match="corrupt"):
        pop.load_state_dict(state)
    fresh = _pair("cpu", "torch")[0]
    _unchanged(fresh, lambda: _raises(lambda p: p.load_state_dict(state), fresh, ValueError, "corrupt"))


def test_settings_per_instance_are_read_and_set_as_tuples():
    pop, _ = _pair("cpu", "torch")
    assert pop.eps == tuple(EPS) and pop.beta == (0.4,) * N
    pop.beta = [0.1, 0.2, 0.3]
    assert [m.beta for m in pop.members] == [0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="alpha"):
        pop.alpha = [0.1, 2.0, 0.3]
    assert pop.alpha == tuple(ALPHA)  # nothing set when one value is bad
    pop.weight_norm = "batch"
    assert all(m.weight_norm == "batch" for m in pop.members)


def test_one_instance_keeps_a_leading_dimension_and_the_single_buffer_keeps_its_shapes():
    pop = gper.PrioritizedReplayBuffer(CAP, SPEC, instances=1, device="cpu")
    pop.add({k: v[:1] for k, v in _data(torch.Generator(), 4, "cpu").items()})
    batch = pop.sample(5)
    assert batch["obs"].shape == (1, 5, 3) and batch.indices.shape == (1, 5) and batch.batch_size == 5
    assert pop.storage["obs"].shape == (1, CAP, 3)
    single = gper.PrioritizedReplayBuffer(CAP, SPEC, device="cpu")
    assert type(single) is gper.PrioritizedReplayBuffer


def test_a_batchs_indices_and_generations_are_read_by_the_update_without_a_copy(backend):
    """Each of indices, generations and weights is one contiguous [N, B] block, and the priority
    update gets the batch's own indices and generations (a strided block would be copied first, a
    kernel a call)."""
    pop = gper.PrioritizedReplayBuffer(CAP, SPEC, instances=N, device="cpu", backend=backend)
    pop.add(_data(torch.Generator(), 4, "cpu"))
    batch = pop.sample(5)
    for t in (batch.indices, batch.generations, batch.weights):
        assert t.shape == (N, 5) and t.is_contiguous()
    given, set_priorities = {}, pop._set_priorities

    def noting(idx, values, gen, params):
        given.update(idx=idx.data_ptr(), gen=gen.data_ptr())
        return set_priorities(idx, values, gen, params)

    pop._set_priorities = noting
    pop.update_priorities(batch, torch.rand(N, 5))
    assert given == {"idx": batch.indices.data_ptr(), "gen": batch.generations.data_ptr()}


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", MODES)
def test_on_cuda_graphed_calls_match_single_buffers(sampling):
    pop, singles = _pair("cuda", "auto", sampling)
    _steps(pop, singles, torch.Generator().manual_seed(5), 20, "cuda")
    assert pop.device.type == "cuda"


@pytest.mark.gpu
def test_inside_a_callers_graph_every_replay_draws_afresh():
    pop, singles = _pair("cuda", "auto")
    g = torch.Generator().manual_seed(6)
    _steps(pop, singles, g, 3, "cuda")
    td = torch.rand(N, B, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    # the side stream starts after the default stream's work above (the last priority updates, td)
    # and the default stream goes on after it: PyTorch's rule for a second stream
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        batch = pop.sample(B)  # warm-up outside the capture (compiles)
        pop.update_priorities(batch, td)
        s_batch = [s.sample(B) for s in singles]
        for s, sb in zip(singles, s_batch, strict=True):
            s.update_priorities(sb, td[singles.index(s)])
        with gper.replay.graphs.capture(graph, stream=stream):
            batch = pop.sample(B)
            pop.update_priorities(batch, td)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(4):
        graph.replay()
        for i, s in enumerate(singles):
            single = s.sample(B)
            s.update_priorities(single, td[i])
            _same_batch(batch, i, single)
