"""A sharded buffer's exact-mode kernels: the Triton ones (gper.ops.shard.triton, under the
interpreter on the CPU, compiled on CUDA) against the torch reference (gper.ops.shard.reference)
on the same device, bit for bit: the shared
draws (thresholds, owners, fractions, the counter's advance) for 1 to 8 shards with a shard of
mass 0 first, in the middle or last and counters across 2^32; the routed rows and update entries
of 1 to 3 ranks, whose round trip must also give each draw its owner's row; the gathered meta and
local mode's ratio and weights (an empty shard's too). Outputs are allocated
poisoned (NaN, or -7 in every word), so a word a kernel leaves unwritten fails."""

from __future__ import annotations

import inspect

import pytest
import torch

from gper._triton import HAS_TRITON
from gper.bench import capture_graph
from gper.ops.shard import reference as shard_reference
from gper.ops.shard.reference import OWNER_SHIFT
from gper.ops.state import C_STALE
from helpers import TRITON_ON_CPU, tree_state

FUNCTIONS = (
    "shard_meta",
    "shared_draws",
    "pack_rows",
    "unpack_rows",
    "pack_updates",
    "unpack_updates",
    "local_priorities",
    "local_weights",
)


@pytest.fixture
def triton_poisoned(monkeypatch, device):
    """gper.ops.shard.triton, with every ``torch.empty`` meanwhile filled with NaN (floats) or -7
    (integers); skipped where its kernels cannot run on ``device``."""
    if not (TRITON_ON_CPU if device.type == "cpu" else HAS_TRITON):
        pytest.skip("Triton needs triton, and on CPU tensors TRITON_INTERPRET=1")
    from gper.ops.shard import triton as shard_triton

    real = torch.empty

    def poisoned(*args, **kwargs):
        x = real(*args, **kwargs)
        return x.fill_(float("nan") if x.dtype.is_floating_point else -7)

    monkeypatch.setattr(torch, "empty", poisoned)
    return shard_triton


def assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal bit for bit (-0.0 is not 0.0; NaN is NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    int_type = {1: torch.uint8, 4: torch.int32, 8: torch.int64}[got.element_size()]
    a, b = got.contiguous().view(int_type), want.contiguous().view(int_type)
    bad = (a != b).nonzero()
    if bad.numel():
        at = tuple(bad[0])
        raise AssertionError(f"{what}: {bad.shape[0]} words differ, first at {list(at)}: {got[at]} != {want[at]}")


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_both_modules_define_each_function_with_the_same_keyword_parameters(name):
    from gper.ops.shard import triton as shard_triton

    ref, tri = inspect.signature(getattr(shard_reference, name)), inspect.signature(getattr(shard_triton, name))
    assert list(ref.parameters) == list(tri.parameters)
    assert {p.kind for p in ref.parameters.values()} == {inspect.Parameter.KEYWORD_ONLY}


def test_the_selector_picks_the_shard_back_end_by_name():
    from gper.ops import kernels

    assert kernels("shard", "torch") is shard_reference
    if HAS_TRITON:
        assert kernels("shard", "triton").__name__ == "gper.ops.shard.triton"
    with pytest.raises(ValueError, match="backend must be one of"):
        kernels("shard", "cuda")


def _masses(w: int, zero: int | str | None, seed: int, device: torch.device) -> torch.Tensor:
    """[W] float64 masses over many magnitudes (total priorities, or integer sizes for seed 0), 0 at
    ``zero`` (everywhere for "all": every priority 0, where every draw goes to the last shard)."""
    g = torch.Generator().manual_seed(seed)
    if seed == 0:
        mass = torch.randint(1, 50, (w,), generator=g).double()
    else:
        mass = torch.rand(w, dtype=torch.float64, generator=g) * 10.0 ** torch.randint(-6, 7, (w,), generator=g)
    if zero == "all":
        mass[:] = 0.0
    elif zero is not None:
        mass[zero] = 0.0
    # a strided column, as the buffer passes it (meta[:, META_TOTAL] of a [W, 4] meta)
    meta = torch.zeros(w, 4, dtype=torch.float64, device=device)
    meta[:, 0] = mass.to(device)
    return meta[:, 0]


@pytest.mark.parametrize("stratified", [False, True], ids=["independent", "stratified"])
@pytest.mark.parametrize("w", [1, 2, 3, 5, 8])
def test_shared_draws_are_the_reference_bit_for_bit(w, stratified, device, triton_poisoned):
    zeros = ([None] if w == 1 else [0, w // 2, w - 1]) + ["all"]
    key = 0x5DEECE66D1234567  # high key word non-zero
    for n in (1, 7, 1000):
        for zi, zero in enumerate(zeros):
            mass = _masses(w, zero, seed=zi, device=device)
            cum = mass.cumsum(0)
            # counters: 0; crossing 2^32 inside the draws (the high word of the offset changes); past 2^40
            for start in (0, 2**32 - 3, 2**40 + 5):
                # sometimes the zero-mass shard's own fractions (0; NaN where it is picked: all masses 0)
                rank = w - 1 if zero == "all" else (zi + start) % w
                out = []
                for mod in (shard_reference, triton_poisoned):
                    counter = torch.tensor([start], dtype=torch.int64, device=device)
                    ticket = torch.zeros(1, dtype=torch.int64, device=device)
                    t, owner, frac = mod.shared_draws(
                        cum=cum,
                        mass=mass,
                        counter=counter,
                        ticket=ticket,
                        key=key,
                        n=n,
                        stratified=stratified,
                        rank=rank,
                    )
                    assert int(counter) == start + n and int(ticket) == 0, (mod.__name__, int(counter), int(ticket))
                    out.append((t, owner, frac))
                what = f"W={w} n={n} zero={zero} counter={start}"
                (t0, o0, f0), (t1, o1, f1) = out
                assert_bits(t1, t0, f"{what}: thresholds")
                assert_bits(o1, o0, f"{what}: owners")
                assert (f0 is None) == (f1 is None) == (not stratified)
                if stratified:
                    assert_bits(f1, f0, f"{what}: fractions")
                    assert bool(((f0 >= 0) & (f0 < 1)).all()) or zero == "all"
                assert bool(((o0 >= 0) & (o0 < w)).all())
                if zero == "all":
                    assert bool((o0 == w - 1).all()), f"{what}: the cap at W - 1"
                elif zero is not None:
                    assert not bool((o0 == zero).any()), f"{what}: a shard of mass 0 was picked"


def test_the_high_word_of_the_counter_changes_the_draws(device, triton_poisoned):
    """Counters 2^32 apart (the same low word) draw differently, in both modules alike."""
    cum = torch.tensor([1.0, 3.0], dtype=torch.float64, device=device)
    ticket = torch.zeros(1, dtype=torch.int64, device=device)
    for mod in (shard_reference, triton_poisoned):
        draws = []
        for start in (5, 5 + 2**32):
            counter = torch.tensor([start], dtype=torch.int64, device=device)
            kw = dict(cum=cum, mass=cum, ticket=ticket, key=3, n=64, rank=0)
            draws.append(mod.shared_draws(counter=counter, stratified=False, **kw)[0])
        assert not torch.equal(*draws), mod.__name__


def _shard_draws(world: int, n: int, words: int, seed: int) -> list[dict[str, torch.Tensor]]:  # on the CPU
    """Per rank: what its descent drew for every one of the n shared draws, and its leaves."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(world):
        leaves = torch.rand(64, generator=g)
        leaves[:3] = torch.tensor([float("nan"), -0.0, 2.0**-126])  # bits that must travel unchanged
        out.append(
            {
                "rows": torch.randint(-(2**31), 2**31 - 1, (n, words), generator=g, dtype=torch.int32),
                "indices": torch.randint(0, 64, (n,), generator=g),
                "generations": torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int32),
                "leaves": leaves,
            }
        )
    return out


@pytest.mark.parametrize("world, b, words", [(1, 1, 4), (2, 7, 8), (3, 5, 132)])  # rows are whole 16-byte units
def test_routed_rows_are_the_reference_and_reach_the_rank_that_drew_them(world, b, words, device, triton_poisoned):
    n = world * b
    owner = torch.randint(0, world, (n,), generator=torch.Generator().manual_seed(1))
    drawn = _shard_draws(world, n, words, seed=world)
    sent = []
    for k in range(world):
        kw = {name: x.to(device) for name, x in drawn[k].items()} | dict(owner=owner.to(device), rank=k, world=world)
        want = shard_reference.pack_rows(**kw)
        got = triton_poisoned.pack_rows(**kw)
        assert_bits(got, want, f"rank {k}: packed")
        sent.append(want)
    total = torch.stack(sent).sum(0, dtype=torch.int32)  # the reduce-scatter's sum: [W, b, words + 4]
    for r in range(world):
        kw = dict(recv=total[r], owner=owner.to(device), rank=r, world=world)
        want = shard_reference.unpack_rows(**kw)
        got = triton_poisoned.unpack_rows(**kw)
        for name, a, e in zip(("rows", "indices", "generations", "priorities", "owners"), got, want, strict=True):
            assert_bits(a, e, f"rank {r}: {name}")
        rows, indices, gens, p, owners = (x.cpu() for x in want)
        draw = torch.arange(b) * world + r  # this rank's rows: draws j * W + r, each from its owner's shard
        assert torch.equal(owners, owner[draw])
        for j, (d, o) in enumerate(zip(draw.tolist(), owners.tolist(), strict=True)):
            src = drawn[o]
            assert torch.equal(rows[j], src["rows"][d]) and int(gens[j]) == int(src["generations"][d])
            assert int(indices[j]) == int(src["indices"][d])
            assert_bits(p[j : j + 1], src["leaves"][src["indices"][d : d + 1]], "priority")
    # any words unpack alike (slot words with the sign bit set in either half)
    junk = torch.randint(
        -(2**31), 2**31 - 1, (b, words + 4), generator=torch.Generator().manual_seed(2), dtype=torch.int32
    )
    kw = dict(recv=junk.to(device), owner=owner.to(device), rank=world - 1, world=world)
    for a, e in zip(triton_poisoned.unpack_rows(**kw), shard_reference.unpack_rows(**kw), strict=True):
        assert_bits(a, e, "unpacked words")


@pytest.mark.parametrize("stale", [False, True])
def test_routed_updates_are_the_reference(stale, device, triton_poisoned):
    world, b = 3, 9
    g = torch.Generator().manual_seed(4)
    packs = []
    for k in range(world):
        kw = dict(
            owners=torch.randint(0, world, (b,), generator=g),
            indices=torch.randint(0, 2**40 - 1, (b,), generator=g) % 20,
            generations=torch.randint(-(2**31), 2**31 - 1, (b,), generator=g, dtype=torch.int32),
            td=torch.randn(b, generator=g),
            stale=stale and k == 1,  # one rank's batch from before a restore
        )
        kw = {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in kw.items()}
        want = shard_reference.pack_updates(**kw)
        assert_bits(triton_poisoned.pack_updates(**kw), want, f"rank {k}: update words")
        packs.append(want)
    # entries no rank owns, of any words (a global slot whose low word has the sign bit set)
    junk = torch.randint(-(2**31), 2**31 - 1, (6, 4), generator=g, dtype=torch.int32)
    junk[:, 1] = torch.tensor([world << 8, -1, -(2**31), 2**31 - 1, (world + 5) << 8, -(1 << 8)], dtype=torch.int32)
    every = torch.cat(packs + [junk.to(device)])
    gen = torch.randint(-(2**31), 2**31 - 1, (20,), generator=g, dtype=torch.int32).to(device)
    for r in range(world):
        results = []
        for mod in (shard_reference, triton_poisoned):
            counters = torch.full((8,), 100, dtype=torch.int64, device=device)
            results.append((mod.unpack_updates(state=tree_state(gen, counters), every=every, rank=r), counters))
        (want, c0), (got, c1) = results
        for name, a, e in zip(("slots", "generations", "td"), got, want, strict=True):
            assert_bits(a, e, f"rank {r}: {name}")
        assert torch.equal(c1, c0), (c0, c1)
        g_all = every[:, :2].contiguous().view(torch.int64).view(-1).cpu()
        owned = (g_all >> 40) == r
        assert int(c0[C_STALE]) == 100 - int((~owned).sum())
        slot, expected, td = (x.cpu() for x in want)
        gen_cpu = gen.cpu()
        assert torch.equal(slot[owned], g_all[owned] & (2**40 - 1)) and torch.all(slot[~owned] == 0)
        assert torch.all(expected[~owned] == ~gen_cpu[0]) and torch.all(td[~owned] == 0)


@pytest.mark.parametrize("k", [4, 32])
def test_shard_meta_is_the_reference(k, device, triton_poisoned):
    g = torch.Generator().manual_seed(k)
    mintree = torch.rand(k + 3, generator=g) * 10.0 ** torch.randint(-30, 30, (k + 3,), generator=g)
    counters = torch.tensor([0, 0, 12345, 0], dtype=torch.int64)
    for top in (mintree[3:], torch.full((k,), float("inf"))):  # (an empty shard's min tree holds +inf)
        kw = dict(
            total=torch.tensor(float(top[top < float("inf")].double().sum()), dtype=torch.float64).to(device),
            mintop=top.to(device),
            size=counters.to(device)[2],
            maxp=torch.tensor([0.0, 3.5e7]).to(device)[1],
        )
        assert_bits(triton_poisoned.shard_meta(**kw), shard_reference.shard_meta(**kw), f"K={k}")


@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("w", [1, 3])
def test_local_ratio_priorities_and_weights_are_the_reference(w, uniform, device, triton_poisoned):
    b = 130  # two programs
    g = torch.Generator().manual_seed(w)
    leaves = torch.rand(40, generator=g)
    leaves[0] = 0.0
    indices = torch.randint(0, 40, (b,), generator=g)
    weights = torch.rand(b, generator=g)
    for zero in [None] if w == 1 else [None, 1]:  # shard 1 empty: its ratio and weights are 0
        mass = _masses(w, zero, seed=7, device=device)
        for rank in range(w):
            kw = dict(
                cum=mass.cumsum(0),
                mass=mass,
                leaves=leaves.to(device),
                indices=indices.to(device),
                rank=rank,
                uniform=uniform,
            )
            want = shard_reference.local_priorities(**kw)
            got = triton_poisoned.local_priorities(**kw)
            for name, a, e in zip(("ratio", "priorities", "owners"), got, want, strict=True):
                assert_bits(a, e, f"W={w} zero={zero} rank={rank}: {name}")
            assert (float(want[0]) == 0) == (rank == zero)
            kw = dict(ratio=want[0], weights=weights.to(device))
            assert_bits(triton_poisoned.local_weights(**kw), shard_reference.local_weights(**kw), "weights")


@pytest.mark.gpu
def test_on_cuda_the_reference_stratum_scale_is_the_division_torch_did_there():
    """On CUDA torch divides a tensor by a host number as a product by its reciprocal, so the
    reference's ``* (1 / n)`` is what ``/ n`` gave there, bit for bit (on the CPU ``/ n`` rounds
    once: the reference keeps the CUDA figures and makes the CPU's the same)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(0)
    for n in (7, 1000, 16384, 131072):
        u = (torch.randint(0, 2**32, (n,), generator=g).double() * 2.0**-32).cuda()
        cum = (torch.rand(3, dtype=torch.float64, generator=g) * 1e4).cumsum(0).cuda()
        divided = (torch.arange(n, dtype=torch.float64, device="cuda") + u) / n * cum[-1]
        assert_bits(shard_reference.thresholds(cum, u, True), divided, f"n={n}")


def _cuda_triton():
    if not (torch.cuda.is_available() and HAS_TRITON):
        pytest.skip("needs CUDA and triton")
    from gper.ops.shard import triton as shard_triton

    return shard_triton


@pytest.mark.gpu
@pytest.mark.parametrize("stratified", [False, True], ids=["independent", "stratified"])
def test_on_cuda_the_shared_counter_advances_exactly_under_many_programs(stratified):
    """The counter's advance relies on an atomic ticket between programs, which the interpreter
    (one program at a time) cannot race: here up to 1024 programs of a launch take tickets at
    once, 60 launches in a row eagerly and 120 replays of a captured launch, each checked against
    the reference (draws bit for bit, the counter moved by exactly n, the ticket back at 0)."""
    tri = _cuda_triton()
    dev = torch.device("cuda")
    mass = _masses(5, 2, seed=3, device=dev)
    cum = mass.cumsum(0)
    kw = dict(cum=cum, mass=mass, key=0x1E3779B97F4A7C15, stratified=stratified, rank=1)
    counter = torch.tensor([2**32 - 5000], dtype=torch.int64, device=dev)
    ticket = torch.zeros(1, dtype=torch.int64, device=dev)
    want_counter = int(counter)
    for i in range(60):
        n = (131072, 1, 16385, 127 * 128 + 1, 4096)[i % 5]
        ref_counter = torch.tensor([want_counter], dtype=torch.int64, device=dev)
        want = shard_reference.shared_draws(counter=ref_counter, ticket=torch.zeros_like(ticket), n=n, **kw)
        got = tri.shared_draws(counter=counter, ticket=ticket, n=n, **kw)
        want_counter += n
        assert (int(counter), int(ticket)) == (want_counter, 0), f"launch {i}, n={n}"
        for name, a, e in zip(("thresholds", "owners", "fractions"), got, want, strict=True):
            if e is not None:
                assert_bits(a, e, f"launch {i}, n={n}: {name}")
    n = 131072
    static = {}

    def draw():
        static["out"] = tri.shared_draws(counter=counter, ticket=ticket, n=n, **kw)

    graph = capture_graph(draw, warmup=1)  # the warm-up draws once, eagerly
    want_counter += n
    for r in range(120):
        ref_counter = torch.tensor([want_counter], dtype=torch.int64, device=dev)
        graph.replay()
        want = shard_reference.shared_draws(counter=ref_counter, ticket=torch.zeros_like(ticket), n=n, **kw)
        want_counter += n
        assert (int(counter), int(ticket)) == (want_counter, 0), f"replay {r}"
        if r % 10 == 0:
            for name, a, e in zip(("thresholds", "owners", "fractions"), static["out"], want, strict=True):
                if e is not None:
                    assert_bits(a, e, f"replay {r}: {name}")


@pytest.mark.gpu
def test_on_cuda_the_stale_count_is_exact_under_many_programs():
    """Each program of the update unpack subtracts its entries that another rank owns from the
    stale counter with one atomic: 1536 programs at once, 40 launches eagerly and 100 replays of a
    captured launch, the counter checked after each against a count on the host."""
    tri = _cuda_triton()
    dev = torch.device("cuda")
    world, n = 3, 3 * 65536
    g = torch.Generator(device=dev).manual_seed(11)
    gen = torch.randint(-(2**31), 2**31 - 1, (4096,), device=dev, dtype=torch.int32, generator=g)
    counters = torch.zeros(8, dtype=torch.int64, device=dev)

    def entries():
        owners = torch.randint(0, world + 1, (n,), device=dev, generator=g)  # world: no rank's
        return shard_reference.pack_updates(
            owners=owners,
            indices=torch.randint(0, 4096, (n,), device=dev, generator=g),
            generations=torch.randint(-(2**31), 2**31 - 1, (n,), device=dev, dtype=torch.int32, generator=g),
            td=torch.randn(n, device=dev, generator=g),
            stale=False,
        )

    def not_owned(every: torch.Tensor, rank: int) -> int:
        return int(((every[:, :2].contiguous().view(torch.int64).view(-1) >> OWNER_SHIFT) != rank).sum())

    want = 0
    for i in range(40):
        every, rank = entries(), i % world
        ref_counters = torch.zeros_like(counters)
        expect = shard_reference.unpack_updates(state=tree_state(gen, ref_counters), every=every, rank=rank)
        got = tri.unpack_updates(state=tree_state(gen, counters), every=every, rank=rank)
        want -= not_owned(every, rank)
        assert int(counters[C_STALE]) == want and int(ref_counters[C_STALE]) == -not_owned(every, rank), f"launch {i}"
        for name, a, e in zip(("slots", "generations", "td"), got, expect, strict=True):
            assert_bits(a, e, f"launch {i}: {name}")
    assert int(counters.count_nonzero()) == 1, "only the stale counter moves"
    every = entries()
    state = tree_state(gen, counters)
    graph = capture_graph(lambda: tri.unpack_updates(state=state, every=every, rank=0), warmup=1)
    per_launch = not_owned(every, 0)
    want -= per_launch  # the warm-up's, run eagerly
    for r in range(100):
        graph.replay()
        want -= per_launch
        assert int(counters[C_STALE]) == want, f"replay {r}"
