"""Test helpers: verbose asserts, small buffers and their data, state snapshots, tree checks, and
what it takes to drive the kernels of either back end directly on hand-made trees
(:meth:`gper.replay.tree.PriorityTree.from_leaves` plus :func:`slot_rows` and :func:`sample_fresh`)."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

import torch

import gper
from gper._triton import HAS_TRITON
from gper.ops.state import C_TICKET, N_COUNTERS, S_MAXP, TreeState
from gper.ops.tree import reference
from gper.replay.tree import PriorityTree
from gper.training.checkpoints import list_checkpoints

#: the Triton kernels can run here on CPU tensors (conftest switches the interpreter on without CUDA)
TRITON_ON_CPU = HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"

SPEC = {
    "obs": ((3,), torch.float32),
    "action": ((), torch.int64),
    "done": ((), torch.bool),
}

#: a DQN-sized transition (51-float observations), for the GPU tests' larger buffers
WIDE_SPEC = {
    "obs": ((51,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
    "next_obs": ((51,), torch.float32),
    "done": ((), torch.bool),
}

#: eps of the "dyadic" tests: td = 2^k - EPS_DYADIC makes |td| + eps exactly 2^k in float32
EPS_DYADIC = 2.0**-12


def assert_verbose_allclose(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float = 0.0, atol: float = 0.0, what=""
):
    """Like ``torch.testing.assert_close`` but names the first mismatching index and its values.

    NaN equals NaN and an infinity equals the same infinity. Either side may be on any device
    (both are compared on the CPU).
    """
    actual, expected = torch.as_tensor(actual).cpu(), torch.as_tensor(expected).cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.double(), expected.double()
    same = (a == e) | (a.isnan() & e.isnan())
    close = (a - e).abs() <= atol + rtol * e.abs()
    bad = ~(same | close)
    if bool(bad.any()):
        flat = bad.flatten().nonzero().flatten()
        i = int(flat[0])
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), bad.shape))
        raise AssertionError(
            f"{what}: {len(flat)} of {bad.numel()} elements differ (rtol={rtol}, atol={atol}); "
            f"first at index {idx}: actual {a.flatten()[i].item()!r}, expected {e.flatten()[i].item()!r}"
        )


def assert_verbose_equal(actual: torch.Tensor, expected: torch.Tensor, what=""):
    """Exact equality of values and dtypes (NaN equals NaN), reporting the first mismatch (any devices)."""
    actual, expected = torch.as_tensor(actual).cpu(), torch.as_tensor(expected).cpu()
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.is_floating_point:
        assert_verbose_allclose(actual, expected, what=what)
        return
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    bad = (actual != expected).flatten().nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), actual.shape))
        raise AssertionError(
            f"{what}: {bad.numel()} of {actual.numel()} elements differ; first at index {idx}: "
            f"actual {actual.flatten()[i].item()!r}, expected {expected.flatten()[i].item()!r}"
        )


def transitions(n: int, start: int = 0, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """``n`` transitions of :data:`SPEC` whose contents identify them: item ``k`` has action ``start + k``."""
    k = torch.arange(start, start + n, device=device)
    return {
        "obs": torch.stack([k * 1.0, k * 0.5, -k * 1.0], 1).float(),
        "action": k.long(),
        "done": k % 3 == 0,
    }


def wide_transitions(n: int, device: torch.device | str, generator: torch.Generator | None = None):
    """``n`` random transitions of :data:`WIDE_SPEC` on ``device`` (never zeros: they hide bugs)."""
    kw = {"device": device, "generator": generator}
    return {
        "obs": torch.randn(n, 51, **kw),
        "action": torch.randint(0, 18, (n,), **kw),
        "reward": torch.randn(n, **kw),
        "next_obs": torch.randn(n, 51, **kw),
        "done": torch.rand(n, **kw) < 0.05,
    }


def make_buffer(
    capacity: int, backend: str = "torch", device: torch.device | str = "cpu", **kw
) -> gper.PrioritizedReplayBuffer:
    """A buffer of :data:`SPEC` on ``device`` (the CPU unless a test takes the ``device`` fixture)."""
    return gper.PrioritizedReplayBuffer(capacity, SPEC, device=device, backend=backend, **kw)


def dyadic_td(k: torch.Tensor, sign: torch.Tensor | None = None) -> torch.Tensor:
    """TD errors with ``|td| + EPS_DYADIC == 2**k`` exactly in float32 (``k`` in [-2, 8]).

    With ``alpha=0.5`` and even ``k`` the priority is exactly ``2**(k/2)`` through both ``pow``
    (torch) and ``exp2(alpha * log2(.))`` (Triton), and every sum of a few thousand of them is exact,
    so the two back ends must draw identical indices.
    """
    td = torch.pow(2.0, k.double()) - EPS_DYADIC
    if sign is not None:
        td = td * sign
    out = td.float()
    assert torch.equal(out.double(), td), "td not representable in float32"
    return out


def snapshot(rb: gper.PrioritizedReplayBuffer) -> dict:
    """A deep copy of everything that defines ``rb`` (its state_dict, len, seed)."""
    sd = rb.state_dict()
    out = {"len": len(rb), "seed": rb.seed}
    for k, v in sd.items():
        out[k] = v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return out


def assert_unchanged(rb: gper.PrioritizedReplayBuffer, before: dict):
    after = snapshot(rb)
    assert after.keys() == before.keys(), f"state keys changed: {sorted(after)} vs {sorted(before)}"
    for k in before:
        if isinstance(before[k], torch.Tensor):
            assert_verbose_equal(after[k], before[k], what=f"state_dict()[{k!r}]")
        else:
            assert after[k] == before[k], f"{k}: {after[k]!r} != {before[k]!r}"


def slot_rows(capacity: int, words: int = 4, device: torch.device | str = "cpu") -> torch.Tensor:
    """[capacity, words] int32 storage rows where row ``k`` holds ``k`` in every word, so a gathered
    row names the slot it came from."""
    return torch.arange(capacity, dtype=torch.int32, device=device)[:, None].repeat(1, words).contiguous()


def sample_fresh(
    tree: PriorityTree, b: int, mode: int, seed: int = 0, beta: float = 0.5, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tree.sample_into`` new output tensors (rows default to :func:`slot_rows`).

    Returns:
        (indices, weights, rows, generations) of the ``b`` draws.
    """
    dev = tree.device
    rows = slot_rows(tree.capacity, device=dev) if rows is None else rows
    out = {
        "rows": torch.empty(b, rows.shape[1], dtype=torch.int32, device=dev),
        "indices": torch.empty(b, dtype=torch.int64, device=dev),
        "generations": torch.empty(b, dtype=torch.int32, device=dev),
        "weights": torch.empty(b, dtype=torch.float32, device=dev),
    }
    tree.sample_into(rows, seed, mode, torch.tensor(beta, dtype=torch.float32, device=dev), out)
    return out["indices"], out["weights"], out["rows"], out["generations"]


def tree_state(gen: torch.Tensor, counters: torch.Tensor) -> TreeState:
    """A tree state whose generations and counters are ``gen`` and ``counters`` (the rest a fresh
    tree's): for kernels that read no more of it."""
    tree = PriorityTree(gen.numel(), reference, gen.device)
    return tree.state._replace(gen=gen, counters=counters)


def assert_at_rest(tree: PriorityTree, what: str = "") -> None:
    """The scratch the kernels share between calls is back to its resting state: every claim -1,
    the climb's arrival counters after the claims 0 (Triton back end), the last-program election
    tickets (``C_TICKET`` and after) 0."""
    n = tree.capacity + tree.layout.arity
    assert bool((tree.claims[:n] == -1).all()), f"{what}: update claims not reset"
    assert bool((tree.claims[n:] == 0).all()), f"{what}: the climb's arrival counters not reset"
    tickets = tree.counters[C_TICKET:].tolist()
    assert tickets == [0] * (N_COUNTERS - C_TICKET), f"{what}: election tickets not reset: {tickets}"


def tree_error(tree: PriorityTree) -> float:
    """Largest relative difference between the stored sum tree and one rebuilt from its leaves
    (the min tree must equal its rebuild exactly)."""
    rebuilt, rebuilt_min = tree.tree.clone(), tree.mintree.clone()
    reference.rebuild_trees(rebuilt, rebuilt_min, tree.layout)
    rel = (rebuilt - tree.tree).abs() / rebuilt.abs().clamp_min(1e-30)
    assert torch.equal(rebuilt_min, tree.mintree), "min tree differs from its rebuild"
    return float(rel.max())


#: a stored priority against the oracle's float64 ``(|td| + eps) ** alpha``: the float32 rounding of
#: ``|td| + eps`` (scaled by alpha) plus float32 ``pow`` (torch, within 2 ulps) or
#: ``exp2(alpha * log2(x))`` (Triton, whose error grows with |log2 x|: about 8 ulps at x = 2^20)
LEAF_RTOL = 1e-6
#: the same on CUDA, where Triton's ``exp2``/``log2`` are the hardware approximations
#: (``ex2.approx``/``lg2.approx``, about 2^-22 each): within ~1e-6 of x, so 1e-5 with margin
CUDA_LEAF_RTOL = 1e-5


def leaf_rtol(device: torch.device | str) -> float:
    """:data:`LEAF_RTOL` on the CPU, :data:`CUDA_LEAF_RTOL` on CUDA."""
    return CUDA_LEAF_RTOL if torch.device(device).type == "cuda" else LEAF_RTOL


def sum_rtol(arity: int, levels: int = 1, leaf: float = LEAF_RTOL) -> float:
    """Relative tolerance of a float32 node against the exact sum of the oracle leaves below it.

    A float32 sum of K non-negative float32 numbers, in any order, is within (K - 1) * 2^-24
    (relative) of the exact sum: each of the K - 1 additions rounds by at most half an ulp of a
    partial sum no larger than the total. ``levels`` stacked sums add up their errors (to first
    order), on top of the leaves' own error ``leaf`` (:data:`LEAF_RTOL`).
    """
    return levels * (arity - 1) * 2.0**-24 + leaf


def check_tree(pt: PriorityTree, leaves: list[float], what=""):
    """Every invariant of a priority tree whose leaves should be ``leaves`` (oracle priorities, 0 = empty).

    * leaves equal the oracle's to float32 rounding (:func:`leaf_rtol` of the tree's device);
    * every inner node is the sum (min tree: exactly the min) of its K children as stored;
    * padding is 0 in the sum tree and +inf in the min tree;
    * each level, and the root, equals the oracle's exact tree.
    """
    from oracle import build_trees

    tree, mintree, lay = pt.tree.cpu(), pt.mintree.cpu(), pt.layout
    k, leaf = lay.arity, leaf_rtol(pt.device)
    assert tree.numel() == mintree.numel() == lay.numel + 1
    want_sum, want_min = build_trees(leaves, lay)
    want_sum = torch.tensor(want_sum, dtype=torch.float64)
    want_min = torch.tensor(want_min, dtype=torch.float64)
    ends = list(lay.offsets[1:]) + [lay.numel]
    for level in range(lay.depth):
        off, n, end = lay.offsets[level], lay.sizes[level], ends[level]
        below = lay.depth - 1 - level
        assert_verbose_allclose(
            tree[off : off + n],
            want_sum[off : off + n],
            rtol=sum_rtol(k, below, leaf),
            what=f"{what} sum level {level}",
        )
        assert_verbose_allclose(
            mintree[off : off + n], want_min[off : off + n], rtol=leaf, what=f"{what} min level {level}"
        )
        assert_verbose_equal(tree[off + n : end], torch.zeros(end - off - n), what=f"{what} sum padding {level}")
        assert_verbose_equal(
            mintree[off + n : end], torch.full((end - off - n,), math.inf), what=f"{what} min padding {level}"
        )
        if level + 1 < lay.depth:
            child = tree[lay.offsets[level + 1] :][: n * k].view(n, k)
            cmin = mintree[lay.offsets[level + 1] :][: n * k].view(n, k)
            # the float64 sum of K float32 children is exact to 2^-53: the reference for the local check
            assert_verbose_allclose(
                tree[off : off + n], child.double().sum(1), rtol=(k - 1) * 2.0**-24, what=f"{what} node != children sum"
            )
            assert_verbose_equal(mintree[off : off + n], cmin.amin(1), what=f"{what} min node != min of children")
    top = tree[lay.offsets[0] : lay.offsets[0] + lay.sizes[0]].double().sum()
    exact = math.fsum(leaves)
    assert abs(float(top) - exact) <= sum_rtol(k, lay.depth, leaf) * exact, f"{what} root {float(top)} != {exact}"


#: alpha of :func:`parity_script`: with dyadic TD errors and even exponents its priorities are exact
PARITY_ALPHA = 0.5


def parity_script(backend: str, capacity: int, arity: int, sampling: str, weight_norm: str = "global"):
    """Adds (wrapping), samples, updates with stale entries and duplicates, all with dyadic
    priorities; returns the buffer and every batch it drew (the back ends must draw the same)."""
    g = torch.Generator().manual_seed(capacity + arity)
    rb = make_buffer(
        capacity,
        backend,
        arity=arity,
        alpha=PARITY_ALPHA,
        eps=EPS_DYADIC,
        sampling=sampling,
        weight_norm=weight_norm,
        seed=11,
        rank_refresh_interval=2,
    )
    seen = []
    added = 0
    for step, (n, b) in enumerate([(capacity // 2 + 1, 64), (capacity, 256), (3, 33)]):
        rb.add(transitions(n, added))
        added += n
        batch = rb.sample(b, beta=[0.4, 1.0, 0.0][step])
        seen.append(batch)
        if step == 1:
            rb.add(transitions(capacity // 5 + 1, added))  # some entries go stale
            added += capacity // 5 + 1
        k = torch.randint(-1, 4, (b,), generator=g) * 2
        sign = torch.randint(0, 2, (b,), generator=g) * 2 - 1
        rb.update_priorities(batch, dyadic_td(k, sign))
    seen.append(rb.sample(256))
    return rb, seen


def filled_wide_buffer(capacity: int, device: torch.device | str = "cuda", **kw) -> gper.PrioritizedReplayBuffer:
    """A full buffer of :data:`WIDE_SPEC` of random transitions (added 2^20 at a time)."""
    rb = gper.PrioritizedReplayBuffer(capacity, WIDE_SPEC, device=device, **kw)
    chunk = 1 << 20
    for start in range(0, capacity, chunk):
        rb.add(wide_transitions(min(chunk, capacity - start), device))
    return rb


def run_checkpoint(run_folder: str | Path) -> tuple[dict, dict]:
    """(trainer.pt, replay.safetensors) of the newest complete checkpoint of a ``gper train`` run folder, on the CPU."""
    path = list_checkpoints(Path(run_folder) / "checkpoints")[-1]
    trainer = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    from safetensors.torch import load_file

    return trainer, load_file(path / "replay.safetensors")


#: metrics that measure time, not what the run computed: they differ between two runs of the same settings
TIMING_METRICS = ("charts/SPS", "charts/train_steps_per_s", "eval/seconds")


def computed_records(run_folder: str | Path) -> list[dict]:
    """The records of a run folder's ``metrics.jsonl`` without the metrics of time (``TIMING_METRICS``,
    ``timing/*``): what two runs of the same settings on the CPU share bit for bit."""
    from gper.training.runlog import read_metrics

    return [
        {k: v for k, v in row.items() if k not in TIMING_METRICS and not k.startswith("timing/")}
        for row in read_metrics(Path(run_folder) / "metrics.jsonl")
    ]


def event_scalars(run_folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files in ``run_folder`` as TensorBoard shows them
    (events an event file's purge_step hides are left out): tag -> [(step, value)], in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_folder), size_guidance={"scalars": 0, "tensors": 0})  # 0: keep all
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def jsonl_scalars(run_folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """The numbers of a run folder's ``metrics.jsonl`` as :func:`event_scalars` returns them: tag ->
    [(step, value rounded to float32, as TensorBoard stores it)]; null values are left out."""
    import numpy as np

    from gper.training.runlog import read_metrics

    out: dict[str, list[tuple[int, float]]] = {}
    for row in read_metrics(Path(run_folder) / "metrics.jsonl"):
        for key, value in row.items():
            if key != "global_step" and value is not None:
                out.setdefault(key, []).append((row["global_step"], float(np.float32(value))))
    return out


def assert_same_training(a: str | Path, b: str | Path) -> None:
    """Two run folders whose newest checkpoints hold the same networks, optimizer, replay and history."""
    (ta, ra), (tb, rb) = run_checkpoint(a), run_checkpoint(b)
    for name in ("qnet", "target"):
        for key, value in ta["agent"][name].items():
            assert torch.equal(value, tb["agent"][name][key]), f"{name}.{key}"
    for slot, state in ta["agent"]["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, tb["agent"]["optimizer"]["state"][slot][key]), f"adam {slot}.{key}"
    for key in ("counters", "sums", "beta", "obs"):
        assert torch.equal(ta["agent"][key], tb["agent"][key]), key
    ra, rb = dict(ra), dict(rb)
    # the buffer's own beta scalar is scratch: every call writes it before a kernel reads it (a float
    # beta after a restore, a beta tensor when the buffer's graphs run), and the trainer passes its
    # own annealed beta tensor; so what it holds at the end depends on which calls ran eagerly
    ra["scalars"], rb["scalars"] = ra["scalars"][S_MAXP], rb["scalars"][S_MAXP]
    differ = {
        k: (int((ra[k] != rb[k]).sum()), (ra[k] != rb[k]).nonzero()[:4].flatten().tolist())
        for k in ra
        if isinstance(ra[k], torch.Tensor) and not torch.equal(ra[k], rb[k])
    }
    assert not differ, f"replay tensors differ (count, first positions): {differ}"
    assert ta["returns"] == tb["returns"] and ta["iteration"] == tb["iteration"]
