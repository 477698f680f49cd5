"""A buffer of several instances on the Triton back end, whose sample, update and add run one set
of launches for all instances (:mod:`gper.replay.instance_kernels`), against N single buffers of
seeds ``s + i``: every batch and every state bit for bit. The CPU tests run under the interpreter;
the ``gpu`` ones at N = 64, capacity 2^16, B = 256, graphed and not."""

from __future__ import annotations

import pytest
import torch

import gper
from gper.ops.tree import triton as tt

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "flag": ((), torch.bool)}
MODES = ["proportional", "stratified", "rank", "uniform"]


@pytest.fixture
def launches(monkeypatch):
    """Counts of the batched launchers' calls (each still runs)."""
    counts = {"sample_instances": 0, "update_instances": 0, "add_rows_instances": 0}
    for name in counts:
        fn = getattr(tt, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(tt, name, spy)
    return counts


def _build(n, cap, device, sampling, weight_norm, arity, cuda_graphs=False, seed=11):
    alpha = [0.4 + 0.5 * i / max(n - 1, 1) for i in range(n)]
    eps = [1e-6 * (1 + i) for i in range(n)]
    settings = dict(sampling=sampling, weight_norm=weight_norm, device=device, backend="triton", arity=arity)
    pop = gper.PrioritizedReplayBuffer(
        cap, SPEC, instances=n, seed=seed, alpha=alpha, eps=eps, **settings, cuda_graphs=cuda_graphs
    )
    settings["cuda_graphs"] = False  # the singles are the oracle: never graphed
    singles = [
        gper.PrioritizedReplayBuffer(cap, SPEC, seed=seed + i, alpha=alpha[i], eps=eps[i], **settings) for i in range(n)
    ]
    return pop, singles


def _data(g, n, k, device):
    return {
        "obs": torch.randn(n, k, 3, generator=g).to(device),
        "action": torch.randint(0, 9, (n, k), generator=g).to(device),
        "flag": (torch.rand(n, k, generator=g) > 0.5).to(device),
    }


def _same_state(pop, singles):
    for i, s in enumerate(singles):
        m = pop.members[i]
        for name, t in s.tree.state_dict().items():
            assert torch.equal(t, m.tree.state_dict()[name]), (i, name)
        assert torch.equal(s.rows.rows, m.rows.rows)
    stats = pop.stats()
    for i, s in enumerate(singles):
        for name, value in s.stats().items():
            assert stats[name][i] == value, name


def _steps(pop, singles, g, steps, b, add_n, device, graphed=False):
    """Adds (the ring wraps), samples (default and [N] beta), updates from batches (NaN, Inf, stale
    entries: a slot overwritten since it was drawn) and from raw indices (out of range, duplicates)."""
    n, cap = len(singles), pop.capacity
    for step in range(steps):
        data = _data(g, n, add_n, device)
        pos = pop.add(data)
        for i, s in enumerate(singles):
            assert torch.equal(pos[i], s.add({k: v[i] for k, v in data.items()}))
        betas = torch.linspace(0.0, 1.0, n)
        beta = betas.to(device) if step % 2 else None
        batch = pop.sample(b, beta=beta)
        td = torch.randn(n, b, generator=g).to(device)
        td[:, 0] = float("nan")
        td[:, 1] = float("inf")
        if step % 3 == 2:  # an add of a ring's worth overwrites every drawn slot: all stale
            data = _data(g, n, cap, device)
            pop.add(data)
        singles_batches = []
        for i, s in enumerate(singles):
            # a 0-d tensor each, read in place as the [N] one is; a graphed buffer copies a tensor
            # beta into its own scalar, as a float is written there, so a graphed stack meets floats
            given = (float(beta[i]) if graphed else beta[i]) if step % 2 else None
            single = s.sample(b, beta=given)
            singles_batches.append(single)
            for name in SPEC:
                assert torch.equal(batch[name][i], single[name]), name
            assert torch.equal(batch.indices[i], single.indices)
            assert torch.equal(batch.generations[i], single.generations)
            assert torch.equal(batch.weights[i], single.weights)
            if step % 3 == 2:
                s.add({k: v[i] for k, v in data.items()})
        for i, s in enumerate(singles):
            s.update_priorities(singles_batches[i], td[i])
        pop.update_priorities(batch, td)
        # out-of-range raw indices are refused on the CPU, counted on CUDA
        bound = singles[0].stats()["size"] if device == "cpu" else cap + 5
        raw = torch.randint(0, bound, (n, b), generator=g)
        raw[:, : b // 3] = raw[:, :1]  # duplicates
        raw = raw.to(device)
        for i, s in enumerate(singles):
            s.update_priorities(raw[i], td[i])
        pop.update_priorities(raw, td)
        _same_state(pop, singles)


@pytest.mark.parametrize("arity", [4, 32])
@pytest.mark.parametrize("weight_norm", ["global", "batch"])
@pytest.mark.parametrize("sampling", MODES)
def test_batched_instances_equal_single_buffers(sampling, weight_norm, arity, launches):
    pop, singles = _build(3, 45, "cpu", sampling, weight_norm, arity)
    _steps(pop, singles, torch.Generator().manual_seed(1), 5, 9, 13, "cpu")
    stats = pop.stats()
    assert min(stats["stale_updates"]) > 0 and min(stats["nonfinite_td"]) > 0  # both were met
    assert launches["sample_instances"] == 5 and launches["add_rows_instances"] >= 5
    assert launches["update_instances"] == (0 if sampling == "rank" else 10)  # rank mode loops


def test_one_instance_batched(launches):
    pop, singles = _build(1, 20, "cpu", "proportional", "batch", 4)
    _steps(pop, singles, torch.Generator().manual_seed(2), 3, 6, 7, "cpu")
    assert launches["sample_instances"] == 3


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:.*indices outside")  # the out-of-range raw entries, as intended
@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("weight_norm", ["global", "batch"])
@pytest.mark.parametrize("sampling", MODES)
def test_batched_instances_equal_single_buffers_cuda(sampling, weight_norm, cuda_graphs):
    pop, singles = _build(64, 1 << 16, "cuda", sampling, weight_norm, 32, cuda_graphs=cuda_graphs)
    g = torch.Generator().manual_seed(4)
    first = _data(g, 64, 60_000, "cuda")
    pop.add(first)
    for i, s in enumerate(singles):
        s.add({k: v[i] for k, v in first.items()})
    _steps(pop, singles, g, 12, 256, 3000, "cuda", cuda_graphs)  # 96k adds more: the ring wraps
