"""The Triton back end's launchers for several instances (``sample_instances``, ``update_instances``,
``add_rows_instances``) against the loop of single-tree launches on views (:mod:`gper.ops.instances`):
outputs and every tensor of the resulting state bit-identical. On CPU tensors under the interpreter
at small sizes; the ``gpu`` tests repeat it on CUDA at N = 64, capacity 2^16."""

from __future__ import annotations

import pytest
import torch

from gper.ops import instances as loop
from gper.ops.layout import TreeLayout
from gper.ops.state import (
    C_INVALID,
    C_NONFINITE,
    C_STALE,
    C_TICKET,
    MODE_PROPORTIONAL,
    MODE_STRATIFIED,
    MODE_UNIFORM,
    S_BETA,
    SampleOut,
    TreeState,
)
from gper.ops.tree import reference
from gper.ops.tree import triton as tt
from gper.replay.tree import PriorityTree
from helpers import EPS_DYADIC, dyadic_td

MODES = (MODE_PROPORTIONAL, MODE_STRATIFIED, MODE_UNIFORM)
#: a float64 (two words), an int32 word and a bool (read by bytes): 4 words a row
FIELDS = ((0, 8), (8, 4), (12, 1))
WORDS = 4


class Stack:
    """N stacked trees and rows, as a buffer of instances holds them."""

    def __init__(self, n: int, cap: int, arity: int, device: str) -> None:
        self.layout = TreeLayout.build(cap, arity)
        self.t = PriorityTree.allocate(self.layout, tt, torch.device(device), n)
        self.rows = torch.zeros(n, cap, WORDS, dtype=torch.int32, device=device)

    def state(self) -> TreeState:
        t = self.t
        return TreeState(self.layout, t["tree"], t["mintree"], t["gen"], t["claims"], t["counters"], t["scalars"])

    def clone(self) -> Stack:
        other = object.__new__(Stack)
        other.layout, other.rows = self.layout, self.rows.clone()
        # with the original's strides: a plain clone of a padded row view is dense, its rows no longer
        # 128-byte aligned, and the kernels compiled for it may vectorize (and so sum) differently
        other.t = {k: _same_strides(v) for k, v in self.t.items()}
        return other

    def assert_equal(self, other: Stack) -> None:
        assert torch.equal(self.rows, other.rows)
        for name, v in self.t.items():
            assert torch.equal(v, other.t[name]), name  # NaN nowhere: inf and finite values only


def _same_strides(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)


def _values(n: int, b: int, g: torch.Generator, device: str) -> tuple[torch.Tensor, ...]:
    x = torch.randint(-(2**31), 2**31 - 1, (n, b), generator=g, dtype=torch.int64).to(torch.int32)
    y = torch.randn(n, b, generator=g, dtype=torch.float64)
    d = torch.rand(n, b, generator=g) < 0.5
    return tuple(v.to(device) for v in (y, x, d))


def add_both(a: Stack, b: Stack, n_items: int, g: torch.Generator, device: str, leaf_value=None) -> None:
    """The same add through the batched launcher (``a``) and the loop (``b``); both compared."""
    n, cap = a.rows.shape[0], a.layout.capacity
    values = _values(n, n_items, g, device)
    skip = n_items - min(n_items, cap)
    values = tuple(v[:, skip:] for v in values)
    plan = tt.make_add_plan(fields=FIELDS, words=WORDS, device=device)
    kw = {"fields": FIELDS, "values": values, "plan": plan, "skip": skip, "total": n_items, "leaf_value": leaf_value}
    pa = tt.add_rows_instances(state=a.state(), rows=a.rows, **kw)
    pb = loop.loop_add_rows(tt, state=b.state(), rows=b.rows, **kw)
    assert torch.equal(pa, pb)
    a.assert_equal(b)


def update_both(a: Stack, b: Stack, bsz: int, g: torch.Generator, device: str, with_gen: bool, alpha, eps) -> None:
    """One update of [N, bsz] entries with duplicates, out-of-range indices, stale generations and
    nonfinite TD errors, through both paths; the states compared."""
    n, cap = a.rows.shape[0], a.layout.capacity
    idx = torch.randint(-2, cap + 3, (n, bsz), generator=g)
    idx[:, : bsz // 4] = idx[:, :1]  # duplicates: a quarter of each row on one slot
    idx[:, -1], idx[:, -2] = -1, cap  # out of range in every instance (and more at random)
    td = torch.randn(n, bsz, generator=g) * 3
    td[:, 1::7] = float("nan")
    td[:, 2::11] = float("inf")
    td[:, 3::13] = -float("inf")
    gen = None
    if with_gen:
        gen = a.t["gen"].gather(1, idx.clamp(0, cap - 1).to(device)).cpu()
        gen[:, ::5] -= 1  # stale
        gen = gen.to(device)
    idx, td = idx.to(device), td.to(device)
    tt.update_instances(state=a.state(), idx=idx, td=td, expected_gen=gen, alpha=alpha, eps=eps)
    loop.loop_update(tt, state=b.state(), idx=idx, td=td, expected_gen=gen, alpha=alpha, eps=eps)
    a.assert_equal(b)


def sample_both(a: Stack, b: Stack, bsz: int, mode: int, beta_kind: str, seed: int) -> None:
    n, device = a.rows.shape[0], a.rows.device

    def out() -> SampleOut:
        return SampleOut(
            torch.full((n, bsz, WORDS), -7, dtype=torch.int32, device=device),
            torch.full((n, bsz), -7, dtype=torch.int64, device=device),
            torch.full((n, bsz), -7, dtype=torch.int32, device=device),
            torch.full((n, bsz), -7.0, dtype=torch.float32, device=device),
        )

    def beta(s: Stack):
        if beta_kind == "views":  # each instance's own scalar, read in place
            s.t["scalars"][:, S_BETA] = torch.linspace(0.1, 1.0, n, device=device)
            return list(s.t["scalars"][:, S_BETA].unbind())
        if beta_kind == "vector":
            return torch.linspace(0.0, 1.0, n, device=device)
        return torch.tensor(0.6, device=device)

    oa, ob = out(), out()
    tt.sample_instances(state=a.state(), rows=a.rows, seed=seed, mode=mode, beta=beta(a), out=oa)
    loop.loop_sample(tt, state=b.state(), rows=b.rows, seed=seed, mode=mode, beta=beta(b), out=ob)
    for x, y in zip(oa, ob, strict=True):
        assert torch.equal(x, y)
    a.assert_equal(b)


def _scenario(n: int, cap: int, arity: int, device: str, steps: int, bsz: int, add_n: int, seed: int) -> None:
    """Adds (the ring wraps, and one batch larger than the buffer), updates on both repair paths
    with and without generations, and samples in every mode, batched against the loop."""
    g = torch.Generator().manual_seed(seed)
    a = Stack(n, cap, arity, device)
    b = a.clone()
    add_both(a, b, cap // 2 + 1, g, device)
    assert_exact_and_at_rest(a, "first add")  # every priority 1: exact sums
    alpha = [0.6 + 0.1 * i for i in range(n)]
    eps = [1e-6 * (i + 1) for i in range(n)]
    for step in range(steps):
        add_both(a, b, add_n if step != 1 else cap + 3, g, device)
        min_batch = 1 if step % 2 == 0 else 1 << 30  # the climb, then the level-by-level repair
        with tt.launch_config(climb_min_batch=min_batch):
            update_both(a, b, bsz, g, device, step % 3 != 2, alpha, eps)
        for mode in MODES:
            sample_both(a, b, bsz, mode, ("views", "vector", "shared")[(step + mode) % 3], seed + 17)
    assert_at_rest(a, "after the steps")
    counts = a.t["counters"][:, [C_INVALID, C_STALE, C_NONFINITE]]
    assert (counts > 0).all()  # every kind of dropped input was met (and counted alike)


@pytest.mark.parametrize("arity", [4, 32])
@pytest.mark.parametrize("n", [1, 3])
def test_batched_launches_equal_the_loop(n, arity):
    _scenario(n, cap=70 if arity == 4 else 1100, arity=arity, device="cpu", steps=3, bsz=40, add_n=23, seed=5)


@pytest.mark.parametrize("arity", [4, 32])
def test_depth_one_tree(arity):
    # one level: the update's leaf-only apply, and the add without a parent level
    _scenario(3, cap=arity, arity=arity, device="cpu", steps=3, bsz=12, add_n=3, seed=9)


def test_leaf_value_and_field_by_field_fallback():
    g = torch.Generator().manual_seed(3)
    a = Stack(3, 50, 4, "cpu")
    b = a.clone()
    add_both(a, b, 30, g, "cpu", leaf_value=1.0)
    with tt.launch_config(climb=False):  # the add then writes field by field (the loop)
        add_both(a, b, 40, g, "cpu")


def test_large_seed_does_not_overflow():
    g = torch.Generator().manual_seed(4)
    a = Stack(3, 40, 4, "cpu")
    b = a.clone()
    add_both(a, b, 40, g, "cpu")
    for seed in (2**31 - 2, 2**63 - 3, 1):
        sample_both(a, b, 9, MODE_PROPORTIONAL, "vector", seed)


@pytest.mark.gpu
@pytest.mark.parametrize("arity", [4, 32])
def test_batched_launches_equal_the_loop_cuda(arity):
    _scenario(64, cap=1 << 16, arity=arity, device="cuda", steps=12, bsz=256, add_n=3000, seed=11)
    # and updates big enough for the climb at its default threshold
    with tt.launch_config():
        g = torch.Generator().manual_seed(1)
        a = Stack(64, 1 << 16, arity, "cuda")
        b = a.clone()
        add_both(a, b, 1 << 16, g, "cuda")
        for _ in range(4):
            update_both(a, b, 4096, g, "cuda", True, [0.6] * 64, [1e-6] * 64)


def assert_at_rest(s: Stack, what: str) -> None:
    """Every instance's scratch is back at rest: claims -1, the climb's counters 0, tickets 0."""
    n = s.layout.capacity + s.layout.arity
    assert bool((s.t["claims"][:, :n] == -1).all()) and bool((s.t["claims"][:, n:] == 0).all()), what
    assert bool((s.t["counters"][:, C_TICKET:] == 0).all()), what


def assert_exact_and_at_rest(s: Stack, what: str) -> None:
    """Every instance's trees equal their rebuild from the leaves (with dyadic priorities, whose
    sums are exact in any order), and :func:`assert_at_rest`."""
    for i in range(s.rows.shape[0]):
        tree, mintree = s.t["tree"][i].clone(), s.t["mintree"][i].clone()
        reference.rebuild_trees(tree, mintree, s.layout)
        assert torch.equal(tree, s.t["tree"][i]) and torch.equal(mintree, s.t["mintree"][i]), f"{what}: instance {i}"
    assert_at_rest(s, what)


@pytest.mark.gpu
@pytest.mark.parametrize("arity", [4, 32])
def test_climb_stress_many_duplicates_across_instances(arity):
    """Contended climbs in 64 instances at once: 16384-entry updates each, half of them on 1% of
    the slots (many duplicates per slot and per ancestor), dyadic priorities (every sum exact),
    then wrapping adds; each round equal to the loop's, to each tree's rebuild, and at rest."""
    g = torch.Generator().manual_seed(arity)
    n, cap, b = 64, 1 << 16, 16384
    a = Stack(n, cap, arity, "cuda")
    c = a.clone()
    add_both(a, c, cap, g, "cuda")
    alpha, eps = [0.5] * n, [EPS_DYADIC] * n
    for round_ in range(20):
        hot = torch.randint(0, cap // 100, (n, b), generator=g)
        idx = torch.where(torch.rand(n, b, generator=g) < 0.5, hot, torch.randint(0, cap, (n, b), generator=g))
        td = dyadic_td(2 * torch.randint(-1, 5, (n, b), generator=g))
        idx, td = idx.cuda(), td.cuda()
        tt.update_instances(state=a.state(), idx=idx, td=td, expected_gen=None, alpha=alpha, eps=eps)
        loop.loop_update(tt, state=c.state(), idx=idx, td=td, expected_gen=None, alpha=alpha, eps=eps)
        a.assert_equal(c)
        assert_exact_and_at_rest(a, f"round {round_}: update")
        add_both(a, c, [1, 97, 4096, cap // 3 + 1][round_ % 4], g, "cuda")
        assert_exact_and_at_rest(a, f"round {round_}: add")
