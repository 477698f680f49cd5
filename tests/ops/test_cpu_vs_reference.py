"""The CPU back end (:mod:`gper.ops.tree.cpu`, NumPy views) against the torch reference, bit for bit,
with its loops compiled (numba) and as NumPy calls.

The CPU module claims the reference's operations on the same values, so everything is compared
exactly: every sample's indices, generations, rows and the bits of its IS weights, every tensor of
the state (both trees with their trash cell, generations, counters, scalars, rank keys, claims)
and the counts. The runs mix adds that wrap around, duplicate, stale, negative and too-large
indices, NaN and infinite TD errors of several dtypes, every sampling mode and weight norm,
arities 2 to 32, and capacities from 1 to past a power of the arity; and trees with zeros,
infinities, NaN, the largest and smallest priorities planted in them.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

import gper
from gper.ops import philox
from gper.ops.state import MODE_PROPORTIONAL, MODE_STRATIFIED, MODE_UNIFORM, P_MAX, P_MIN, rng_blocks
from gper.ops.tree import cpu, cpu_numpy, reference
from gper.replay.tree import PriorityTree
from helpers import sample_fresh

try:
    import numba  # noqa: F401

    HAS_NUMBA = True
except ImportError:
    HAS_NUMBA = False

needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="needs numba (the cpu extra)")
#: the CPU back end's ways to run its loops: NumPy calls; compiled, with the children's sums in
#: torch's order (where this machine's torch was found to sum that way) or by torch itself
LOOPS = ["numpy", pytest.param("numba", marks=needs_numba), pytest.param("numba-torch-sums", marks=needs_numba)]


@pytest.fixture(params=LOOPS)
def loops(request, monkeypatch):
    cpu.set_loops(request.param.partition("-")[0])
    assert (cpu.compiled() is not None) == request.param.startswith("numba")
    if request.param == "numba-torch-sums":
        monkeypatch.setattr(cpu, "torch_sum_lanes", lambda jit, k: 0)
    yield request.param
    cpu.set_loops("auto")


SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "flag": ((), torch.uint8)}
MODES = ("proportional", "stratified", "uniform", "rank")
#: (capacity, arity): one slot, a level of one node, non-powers of K, one past a power of K, deep trees
SHAPES = [(1, 2), (2, 32), (7, 4), (33, 32), (100, 2), (333, 16), (1000, 32), (1025, 4), (4097, 8)]


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: NaN payloads and signed zeros compare as they are stored."""
    return x.contiguous().view(torch.uint8) if x.dtype.is_floating_point else x


def _td(b: int, g: torch.Generator) -> torch.Tensor:
    td = torch.randn(b, generator=g) * 10.0 ** torch.randint(-4, 5, (b,), generator=g)
    odd = torch.rand(b, generator=g)
    td[odd < 0.04] = float("nan")
    td[(odd >= 0.04) & (odd < 0.07)] = float("inf")
    td[(odd >= 0.07) & (odd < 0.09)] = -float("inf")
    td[(odd >= 0.09) & (odd < 0.11)] = 0.0
    td[(odd >= 0.11) & (odd < 0.12)] = 1e30  # past P_MAX
    return td


def _script(kernels, capacity: int, arity: int, sampling: str, weight_norm: str, seed: int) -> tuple[list, dict]:
    """A buffer on ``kernels`` through adds, samples and updates of every kind; what it returned and its state."""
    rb = gper.PrioritizedReplayBuffer(
        capacity,
        SPEC,
        alpha=0.6,
        eps=1e-4,
        sampling=sampling,
        weight_norm=weight_norm,
        device="cpu",
        backend=kernels,
        seed=seed,
        arity=arity,
        rank_refresh_interval=3,
    )
    g = torch.Generator().manual_seed(seed)
    seen = []
    for step in range(8):
        n = int(torch.randint(1, 2 * capacity + 2, (1,), generator=g))  # sometimes more than the capacity
        rb.add(
            {
                "obs": torch.randn(n, 3, generator=g),
                "action": torch.randint(0, 9, (n,), generator=g),
                "flag": torch.randint(0, 255, (n,), generator=g, dtype=torch.uint8),
            }
        )
        b = int(torch.randint(1, 300, (1,), generator=g))
        beta = [0.0, 0.4, 1.0, float(torch.rand(1, generator=g))][step % 4]
        batch = rb.sample(b, beta=beta if step % 2 else torch.tensor(beta))
        seen.append([batch.indices, batch.generations, batch.rows, batch.weights])
        if step % 3 == 1:  # overwrite some of the sampled slots: their entries are stale
            rb.add({name: value[: max(1, n // 2)] for name, value in rb.sample(n).items()})
        td = _td(b, g)
        rb.update_priorities(batch, td if step % 2 else td.double())
        raw = torch.randint(0, len(rb), (b,), generator=g)
        raw[: b // 3] = raw[0]  # duplicates: the last occurrence wins
        rb.update_priorities(raw, _td(b, g).to(torch.float16 if step == 5 else torch.float32))
    state = {k: v.clone() for k, v in rb.state_dict().items() if isinstance(v, torch.Tensor)}
    return seen, state | {"claims": rb.tree.claims.clone(), "stats": rb.stats()}


def _assert_same(got, want, what: str) -> None:
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, what
        assert torch.equal(_bits(got), _bits(want)), f"{what}: first difference at {_first_difference(got, want)}"
    else:
        assert got == want or (isinstance(want, float) and math.isnan(want) and math.isnan(got)), f"{what}"


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> tuple:
    i = int((_bits(got).reshape(got.shape[0], -1) != _bits(want).reshape(want.shape[0], -1)).any(1).nonzero()[0])
    return i, got[i].tolist(), want[i].tolist()


#: (sampling, weight_norm): uniform weights are 1 under either norm
POLICIES = [(mode, norm) for mode in MODES for norm in ("global", "batch") if (mode, norm) != ("uniform", "batch")]


@pytest.mark.parametrize("sampling, weight_norm", POLICIES)
@pytest.mark.parametrize("capacity, arity", SHAPES)
def test_a_buffer_on_the_cpu_kernels_does_what_it_does_on_the_reference(capacity, arity, sampling, weight_norm, loops):
    seed = capacity * 31 + arity
    want_seen, want_state = _script(reference, capacity, arity, sampling, weight_norm, seed)
    got_seen, got_state = _script(cpu, capacity, arity, sampling, weight_norm, seed)
    for step, (got, want) in enumerate(zip(got_seen, want_seen, strict=True)):
        for name, a, b in zip(("indices", "generations", "rows", "weights"), got, want, strict=True):
            _assert_same(a, b, f"sample {step}: {name}")
    assert got_state.keys() == want_state.keys()
    for name in want_state:
        if name == "stats":
            assert got_state[name].keys() == want_state[name].keys()
            for key in want_state[name]:
                _assert_same(got_state[name][key], want_state[name][key], f"stats()[{key!r}]")
        else:
            _assert_same(got_state[name], want_state[name], f"state {name}")


def test_the_torch_back_end_on_the_cpu_is_the_numpy_module():
    rb = gper.PrioritizedReplayBuffer(8, SPEC, device="cpu", backend="torch")
    assert rb.backend == "torch" and rb.tree.kernels is cpu


#: leaves of hand-made trees: zeros (never drawn), the extremes, and values a tree should never
#: hold (infinity, NaN), which both modules must treat alike
PLANTED = {
    "zeros": [0.0, 1.0, 0.0, 0.0, 3.0, 0.0, 0.5],
    "extremes": [P_MAX, P_MIN, 1.0, P_MAX, P_MIN, 2.0**-60, 7.0],
    "all-zero": [0.0] * 9,
    "inf": [1.0, math.inf, 2.0, 3.0, 1.0, 1.0],
    "nan": [1.0, 2.0, math.nan, 3.0, 1.0, 0.0],
    "neg": [1.0, -2.0, 5.0, 3.0, 1.0],
}


@pytest.mark.parametrize("arity", [2, 4, 32])
@pytest.mark.parametrize("mode", [MODE_PROPORTIONAL, MODE_STRATIFIED, MODE_UNIFORM])
@pytest.mark.parametrize("leaves", PLANTED.values(), ids=PLANTED.keys())
def test_draws_from_planted_trees_are_the_references(leaves, mode, arity, loops):
    g = torch.Generator().manual_seed(arity)
    values = torch.tensor(leaves * 40, dtype=torch.float32)  # several levels at arity 2 and 4
    values = values[torch.randperm(values.numel(), generator=g)]
    for size in (values.numel(), values.numel() // 3, 1):
        for beta in (0.0, 0.5, 1.0, math.nan):
            draws = []
            for kernels in (reference, cpu):
                tree = PriorityTree.from_leaves(values, kernels, arity=arity, size=size)
                tree.counters[0] = 2**40 - 3  # the RNG counter, past 32 bits
                with np.errstate(all="raise"):  # the CPU module silences its own floating-point warnings
                    draws.append(sample_fresh(tree, 37, mode, seed=11, beta=beta) + (tree.counters.clone(),))
            for name, a, b in zip(("indices", "weights", "rows", "generations", "counters"), *draws, strict=True):
                _assert_same(a, b, f"size {size}, beta {beta}: {name}")


@pytest.mark.parametrize("arity", [2, 8, 32])
@pytest.mark.parametrize("stale_check", [False, True])
def test_updates_and_recompute_on_planted_trees_are_the_references(arity, stale_check, loops):
    g = torch.Generator().manual_seed(arity + stale_check)
    values = torch.tensor(sum(PLANTED.values(), []) * 3, dtype=torch.float32)
    size = values.numel() - 5
    trees = [PriorityTree.from_leaves(values, kernels, arity=arity, size=size) for kernels in (reference, cpu)]
    for tree in trees:
        tree.gen.copy_(torch.arange(values.numel(), dtype=torch.int32) % 3)
    for step in range(6):
        b = [1, 5, 64, 200, 3, 128][step]
        idx = torch.randint(-3, values.numel() + 3, (b,), generator=g)
        idx[b // 2 :] = idx[: b - b // 2].clone()  # duplicates
        td = _td(b, g).to([torch.float32, torch.float64, torch.bfloat16][step % 3])
        expected = torch.randint(0, 3, (b,), generator=g, dtype=torch.int32) if stale_check else None
        for tree in trees:
            tree.update(idx, td, expected, alpha=[0.6, 0.0, 1.0, 0.5, 2.0, 0.3][step], eps=1e-6)
        leaves = torch.randint(0, values.numel(), (b,), generator=g)
        for tree, kernels in zip(trees, (reference, cpu), strict=True):
            tree.tree[tree.layout.leaf_offset + leaves[:1]] = float(step)
            kernels.recompute(state=tree.state, leaves=leaves)
        for name in ("tree", "mintree", "gen", "counters", "scalars", "claims"):
            _assert_same(getattr(trees[1], name), getattr(trees[0], name), f"step {step}: {name}")


def test_rank_keys_are_the_references(loops):
    g = torch.Generator().manual_seed(3)
    keys = [torch.zeros(101), torch.zeros(101)]
    trees = [PriorityTree(100, kernels, torch.device("cpu"), arity=4) for kernels in (reference, cpu)]
    for tree in trees:
        tree.counters[2] = 90  # C_SIZE
    for _ in range(4):
        idx = torch.randint(-2, 100, (150,), generator=g)
        td = _td(150, g)
        expected = torch.zeros(150, dtype=torch.int32)
        for tree, k in zip(trees, keys, strict=True):
            tree.set_keys(k, idx, td, expected, eps=1e-3)
    _assert_same(keys[1], keys[0], "keys")
    for name in ("counters", "scalars", "claims"):
        _assert_same(getattr(trees[1], name), getattr(trees[0], name), name)


@pytest.mark.parametrize("n_blocks, n_words", [(1, 1), (1, 3), (2, 5), (2, 8), (3, 9)])
def test_random_words_are_the_references_cached_or_not(n_blocks, n_words):
    """Small batches read Philox words from a cache of consecutive counters, large ones compute
    them: both are the reference's words, across the cache's chunks and seeds."""
    for seed in (0, 5, 2**63 - 1):
        counters = torch.zeros(8, dtype=torch.int64)
        for b in (1, 7, 256, 3000, 40_000):
            for start in (0, 2**32 - 5, cpu_numpy._WordCache.CHUNK - 3):
                counters[0] = start
                want = reference.random_words(seed, counters, b, n_blocks)[:n_words]
                got = cpu_numpy.random_words(seed, start, b, n_blocks, n_words)
                assert got.shape == (n_words, b)
                for w in range(n_words):
                    assert torch.equal(torch.from_numpy(got[w].astype(np.int64)), want[w]), (seed, b, start, w)


def test_the_word_cache_keeps_a_few_seeds():
    for seed in range(2 * cpu_numpy._WordCache.SEEDS):
        cpu_numpy.random_words(seed, 0, 4, rng_blocks(3), 3)
    assert len(cpu_numpy._WORDS._chunks) <= cpu_numpy._WordCache.SEEDS
    words = philox.randint4x_u32(1, np.arange(4, dtype=np.int64))
    assert np.array_equal(cpu_numpy.random_words(1, 0, 4, 1, 4), np.stack(words))


def test_the_loops_are_chosen_by_name_and_a_missing_numba_names_the_extra(monkeypatch):
    with pytest.raises(ValueError, match="CPU loops must be one of"):
        cpu.set_loops("fast")
    monkeypatch.setitem(sys.modules, "numba", None)  # as if numba were not installed
    monkeypatch.delitem(sys.modules, "gper.ops.tree.cpu_jit", raising=False)
    try:
        cpu.set_loops("auto")
        assert cpu.compiled() is None  # auto: the NumPy loops, silently
        cpu.set_loops("numba")
        with pytest.raises(ImportError, match=r'pip install "\.\[cpu\]"'):
            cpu.compiled()
        rb = gper.PrioritizedReplayBuffer(8, SPEC, device="cpu")
        rb.add(
            {
                "obs": torch.zeros(2, 3),
                "action": torch.zeros(2, dtype=torch.int64),
                "flag": torch.zeros(2, dtype=torch.uint8),
            }
        )
        with pytest.raises(ImportError, match="numba"):
            rb.sample(2)
    finally:
        cpu.set_loops("auto")


@needs_numba
@pytest.mark.parametrize("arity", [2, 4, 8, 16, 32])
def test_the_compiled_sums_are_torchs_where_the_check_found_its_order(arity):
    """Fresh rows (not the check's own): the compiled float32 sum of the width found is torch's, bit for bit."""
    cpu.set_loops("numba")
    try:
        jit = cpu.compiled()
        lanes = cpu.torch_sum_lanes(jit, arity)
        if not lanes:
            pytest.skip("this machine's torch sums in an order the compiled loops do not know: torch sums")
        g = np.random.default_rng(arity)
        rows = (g.standard_normal((5000, arity)) * np.exp2(g.integers(-30, 30, (5000, arity)))).astype(np.float32)
        rows[::3, 0] = -0.0
        rows[::11, 1] = np.inf
        rows[::13, -1] = np.nan
        got = np.empty(len(rows), dtype=np.float32)
        jit.row_sums(rows, lanes, got)
        want = torch.from_numpy(rows).sum(1).numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        cpu.set_loops("auto")
