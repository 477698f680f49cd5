"""The two-launch tree repair (count pass + climb, ``gper.ops.tree.triton_climb``) and the one-launch add.

On the CPU these run the Triton kernels under the interpreter, one program after another: they
check the arithmetic (the needs, the ring range's wrap, the packing plan, the resting state).
Races between programs show only on a GPU: the ``gpu`` tests repeat contended updates and
wrapping adds at every arity and compare both trees with a rebuild after every round. With
dyadic priorities every sum is exact, so the comparison is exact too.
"""

from __future__ import annotations

import pytest
import torch

import gper
from gper.ops.tree import reference
from helpers import EPS_DYADIC, TRITON_ON_CPU, assert_at_rest, dyadic_td

needs_triton = pytest.mark.skipif(
    not (TRITON_ON_CPU or torch.cuda.is_available()), reason="needs triton (interpreter or GPU)"
)

#: a row of whole-word fields and of fields read by bytes (bool, int8, odd float16, uint8[3], int16)
MIXED_SPEC = {
    "obs": ((5,), torch.float32),
    "action": ((), torch.int64),
    "done": ((), torch.bool),
    "half": ((3,), torch.float16),
    "tag": ((3,), torch.uint8),
    "small": ((), torch.int16),
}


def _mixed(n: int, gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn(n, 5, generator=gen).to(device),
        "action": torch.randint(-(2**40), 2**40, (n,), generator=gen).to(device),
        "done": (torch.rand(n, generator=gen) < 0.5).to(device),
        "half": torch.randn(n, 3, generator=gen).half().to(device),
        "tag": torch.randint(0, 256, (n, 3), generator=gen, dtype=torch.uint8).to(device),
        "small": torch.randint(-(2**15), 2**15, (n,), generator=gen, dtype=torch.int16).to(device),
    }


def _assert_trees_exact(rb: gper.PrioritizedReplayBuffer, what: str) -> None:
    tree, mintree = rb.tree.tree.clone(), rb.tree.mintree.clone()
    reference.rebuild_trees(tree, mintree, rb.tree.layout)
    bad = (tree != rb.tree.tree).nonzero().flatten()
    assert bad.numel() == 0, f"{what}: sum tree differs from its rebuild at {bad[:8].tolist()}"
    bad = (mintree != rb.tree.mintree).nonzero().flatten()
    assert bad.numel() == 0, f"{what}: min tree differs from its rebuild at {bad[:8].tolist()}"


def _device() -> str:
    return "cuda" if torch.cuda.is_available() and not TRITON_ON_CPU else "cpu"


@needs_triton
@pytest.mark.parametrize("spec_name", ["mixed", "seven fields"])
@pytest.mark.parametrize(("capacity", "arity"), [(37, 2), (100, 4)])
def test_fused_add_writes_what_the_reference_writes(spec_name, capacity, arity):
    """Batches that wrap the ring, larger than the buffer, of every kind of field: the rows, the
    slots returned, generations, counters and both trees equal the torch back end's."""
    spec = dict(MIXED_SPEC)
    if spec_name == "seven fields":  # more fields than the kernel packs: field-by-field copies
        spec["extra"] = ((2,), torch.int32)
    dev = _device()
    bufs = [
        gper.PrioritizedReplayBuffer(capacity, spec, device=dev, backend=b, arity=arity) for b in ("torch", "triton")
    ]
    gen = torch.Generator().manual_seed(3)
    for n in (5, capacity - 3, 1, capacity + 9, 2 * capacity + 1, 17):
        data = _mixed(n, gen, dev)
        if "extra" in spec:
            data["extra"] = torch.randint(-100, 100, (n, 2), generator=gen, dtype=torch.int32).to(dev)
        slots = [rb.add(data) for rb in bufs]
        ref, tri = bufs
        assert torch.equal(slots[0], slots[1]), f"n={n}: slots"
        assert torch.equal(ref.rows.rows, tri.rows.rows), f"n={n}: rows"
        assert torch.equal(ref.tree.gen, tri.tree.gen), f"n={n}: generations"
        assert torch.equal(ref.tree.counters, tri.tree.counters), f"n={n}: counters"
        assert torch.equal(ref.tree.tree, tri.tree.tree), f"n={n}: sum tree"
        assert torch.equal(ref.tree.mintree, tri.tree.mintree), f"n={n}: min tree"
        assert_at_rest(tri.tree, f"after an add of {n}")


@needs_triton
@pytest.mark.parametrize(("capacity", "arity"), [(64, 2), (50, 4), (300, 8), (1100, 32)])
def test_updates_and_adds_keep_the_trees_exact(capacity, arity):
    """Updates with many duplicates, then adds that wrap the ring: both trees equal their rebuild
    and the scratch (claims, arrival counters, tickets) is back at rest after every call."""
    from gper.ops.tree import triton as tree_triton

    with tree_triton.launch_config(climb_min_batch=1):  # the climb for every batch size here
        _updates_and_adds(capacity, arity)


def _updates_and_adds(capacity: int, arity: int) -> None:
    dev = _device()
    rb = gper.PrioritizedReplayBuffer(
        capacity, {"x": ((), torch.int32)}, device=dev, backend="triton", arity=arity, alpha=0.5, eps=EPS_DYADIC
    )
    gen = torch.Generator().manual_seed(capacity)
    rb.add({"x": torch.zeros(capacity, dtype=torch.int32, device=dev)})
    for round_ in range(4):
        b = int(torch.randint(1, 3 * capacity, (), generator=gen))
        hot = max(1, capacity // 7)  # a few slots drawn many times: duplicates share every ancestor
        idx = torch.where(
            torch.rand(b, generator=gen) < 0.5,
            torch.randint(0, hot, (b,), generator=gen),
            torch.randint(0, capacity, (b,), generator=gen),
        )
        k = 2 * torch.randint(-1, 5, (b,), generator=gen)
        rb.update_priorities(idx.to(dev), dyadic_td(k).to(dev))
        _assert_trees_exact(rb, f"round {round_}: update of {b}")
        assert_at_rest(rb.tree, f"round {round_}: update")
        n = int(torch.randint(1, capacity + 2, (), generator=gen))
        rb.add({"x": torch.zeros(n, dtype=torch.int32, device=dev)})
        _assert_trees_exact(rb, f"round {round_}: add of {n}")
        assert_at_rest(rb.tree, f"round {round_}: add")


@pytest.mark.gpu
@pytest.mark.parametrize("arity", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("capacity", [3000, 1 << 16, 100_003])
def test_contended_climbs_on_the_gpu(capacity, arity):
    """Many programs climbing at once: 16384-entry updates where half the entries hit 1% of the
    slots, then adds that wrap the ring, 60 rounds, each compared exactly with a rebuild."""
    rb = gper.PrioritizedReplayBuffer(
        capacity, {"x": ((), torch.int32)}, device="cuda", arity=arity, alpha=0.5, eps=EPS_DYADIC
    )
    assert rb.backend == "triton"
    rb.add({"x": torch.zeros(capacity, dtype=torch.int32, device="cuda")})
    gen = torch.Generator(device="cuda").manual_seed(arity)
    hot = max(1, capacity // 100)
    for round_ in range(60):
        b = 16384
        idx = torch.where(
            torch.rand(b, device="cuda", generator=gen) < 0.5,
            torch.randint(0, hot, (b,), device="cuda", generator=gen),
            torch.randint(0, capacity, (b,), device="cuda", generator=gen),
        )
        k = 2 * torch.randint(-1, 5, (b,), device="cuda", generator=gen)
        td = dyadic_td(k)
        rb.update_priorities(idx, td)
        last = torch.full((capacity,), -1, dtype=torch.int64, device="cuda")
        last.scatter_reduce_(0, idx, torch.arange(b, device="cuda"), reduce="amax")
        touched = (last >= 0).nonzero().flatten()
        expected = (td[last[touched]].abs() + EPS_DYADIC) ** 0.5
        assert torch.equal(rb.priorities(touched), expected), f"round {round_}: the last occurrence must win"
        _assert_trees_exact(rb, f"round {round_}: update")
        n = [1, 97, 4096, capacity // 3 + 1][round_ % 4]
        rb.add({"x": torch.zeros(n, dtype=torch.int32, device="cuda")})
        _assert_trees_exact(rb, f"round {round_}: add of {n}")
    assert_at_rest(rb.tree, "after the rounds")


@needs_triton
@pytest.mark.parametrize("arity", [2, 32])
def test_the_climb_ignores_stale_entries(arity):
    """A batch updated after some of its slots were overwritten, repaired by the climb: its stale
    entries are counted as stale and write nothing, the fresh ones win, the trees stay exact."""
    from gper.ops.tree import triton as tree_triton

    dev, cap = _device(), 300
    rb = gper.PrioritizedReplayBuffer(
        cap, {"x": ((), torch.int32)}, device=dev, backend="triton", arity=arity, alpha=0.5, eps=EPS_DYADIC
    )
    rb.add({"x": torch.zeros(cap, dtype=torch.int32, device=dev)})
    with tree_triton.launch_config(climb_min_batch=1):
        batch = rb.sample(200)
        rb.add({"x": torch.zeros(40, dtype=torch.int32, device=dev)})  # slots 0 .. 39 overwritten
        before = rb.priorities(batch.indices).clone()
        k = 2 * torch.randint(-1, 5, (200,), generator=torch.Generator().manual_seed(arity))
        rb.update_priorities(batch, dyadic_td(k).to(dev))
    stale = batch.indices < 40
    assert bool(stale.any()) and bool((~stale).any())
    assert torch.equal(rb.priorities(batch.indices[stale]), before[stale]), "a stale entry wrote its leaf"
    assert rb.stats()["stale_updates"] == int(stale.sum())
    _assert_trees_exact(rb, "after an update with stale entries")
    assert_at_rest(rb.tree, "after an update with stale entries")


@needs_triton
@pytest.mark.parametrize("case", ["wide field", "view starting mid-word"])
def test_add_of_wide_fields_and_of_views_that_start_inside_a_word(case):
    """A field wider than the add kernel writes (an image) is copied field by field, and a
    whole-word field given as a view that starts mid-word is read after a copy: both back ends
    store the same rows."""
    dev = _device()
    if case == "wide field":
        spec = {"img": ((70_000,), torch.float32), "x": ((), torch.int32)}
        data = {"img": torch.randn(3, 70_000).to(dev), "x": torch.arange(3, dtype=torch.int32).to(dev)}
    else:
        spec = {"pair": ((2,), torch.float16), "x": ((), torch.int32)}
        raw = torch.randint(0, 256, (2 + 3 * 4,), dtype=torch.uint8).to(dev)
        pair = raw[2:].view(torch.float16).view(3, 2)  # starts 2 bytes into a word
        assert pair.storage_offset() * pair.element_size() % 4 == 2
        data = {"pair": pair, "x": torch.arange(3, dtype=torch.int32).to(dev)}
    bufs = [gper.PrioritizedReplayBuffer(4, spec, device=dev, backend=b) for b in ("torch", "triton")]
    for rb in bufs:
        rb.add(data)
    assert torch.equal(bufs[0].rows.rows, bufs[1].rows.rows)
    assert_at_rest(bufs[1].tree, "after the add")
