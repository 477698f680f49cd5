"""Test helpers: verbose asserts, small buffers, state snapshots, and a harness that drives the
kernels of either back end directly on hand-written trees."""

from __future__ import annotations

import copy
import math
import os

import torch

import gper
from gper._triton import HAS_TRITON
from gper.ops.layout import TreeLayout
from gper.ops.reference import rebuild
from gper.ops.state import N_COUNTERS, N_SCALARS

#: the Triton kernels can run here on CPU tensors (conftest switches the interpreter on without CUDA)
TRITON_ON_CPU = HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"

SPEC = {
    "obs": ((3,), torch.float32),
    "action": ((), torch.int64),
    "done": ((), torch.bool),
}

#: eps of the "dyadic" tests: td = 2^k - EPS_DYADIC makes |td| + eps exactly 2^k in float32
EPS_DYADIC = 2.0**-12


def assert_verbose_allclose(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float = 0.0, atol: float = 0.0, what=""
):
    """Like ``torch.testing.assert_close`` but names the first mismatching index and its values.

    NaN equals NaN and an infinity equals the same infinity.
    """
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
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
    """Exact equality of values and dtypes (NaN equals NaN), reporting the first mismatch."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
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


def transitions(n: int, start: int = 0) -> dict[str, torch.Tensor]:
    """``n`` transitions of :data:`SPEC` whose contents identify them: item ``k`` has action ``start + k``."""
    k = torch.arange(start, start + n)
    return {
        "obs": torch.stack([k * 1.0, k * 0.5, -k * 1.0], 1).float(),
        "action": k.long(),
        "done": k % 3 == 0,
    }


def make_buffer(capacity: int, backend: str = "torch", **kw) -> gper.PrioritizedReplayBuffer:
    return gper.PrioritizedReplayBuffer(capacity, SPEC, device="cpu", backend=backend, **kw)


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


class RawTree:
    """A hand-made tree pair plus the rest of what the kernels take, to drive ``ops`` directly.

    Args:
        leaves: [capacity] leaf priorities (0 = never drawn; the min tree stores +inf there).
        arity: K.
        size: filled slots the counters report (default: all).
    """

    def __init__(self, leaves, arity: int, size: int | None = None, words: int = 4):
        leaves = torch.as_tensor(leaves, dtype=torch.float32)
        cap = leaves.numel()
        self.layout = lay = TreeLayout.build(cap, arity)
        self.tree = torch.zeros(lay.numel + 1)
        self.mintree = torch.full((lay.numel + 1,), math.inf)
        self.tree[lay.leaf_offset : lay.leaf_offset + cap] = leaves
        self.mintree[lay.leaf_offset : lay.leaf_offset + cap] = torch.where(leaves > 0, leaves, math.inf)
        rebuild(self.tree, self.mintree, lay)
        # row k holds k in every word, so a gathered row names the slot it came from
        self.rows = torch.arange(cap, dtype=torch.int32)[:, None].repeat(1, words).contiguous()
        self.gen = torch.zeros(cap, dtype=torch.int32)
        self.scratch = {}  # per back end: the update's claim scratch (all -1 between calls)
        self.counters = torch.zeros(N_COUNTERS, dtype=torch.int64)
        self.counters[2] = cap if size is None else size  # C_SIZE
        self.scalars = torch.zeros(N_SCALARS, dtype=torch.float32)
        self.scalars[0] = 1.0  # S_MAXP

    def sample(self, ops, b: int, mode: int, seed: int = 0, beta: float = 0.5):
        """Run ``ops.sample``; returns (indices, weights, rows, generations)."""
        out_rows = torch.empty(b, self.rows.shape[1], dtype=torch.int32)
        out_idx = torch.empty(b, dtype=torch.int64)
        out_gen = torch.empty(b, dtype=torch.int32)
        out_w = torch.empty(b, dtype=torch.float32)
        ops.sample(
            self.tree,
            self.mintree,
            self.layout,
            self.rows,
            self.gen,
            self.counters,
            seed,
            b,
            mode,
            torch.tensor(beta),
            out_rows,
            out_idx,
            out_gen,
            out_w,
        )
        return out_idx, out_w, out_rows, out_gen

    def update(self, ops, idx, td, expected_gen=None, alpha: float = 1.0, eps: float = 0.5):
        """Run ``ops.update``; with the defaults, ``td = 2^k - 0.5`` gives priority exactly ``2^k`` (both back ends)."""
        if ops.__name__ not in self.scratch:
            self.scratch[ops.__name__] = ops.make_scratch(self.layout, self.tree.device)
        ops.update(
            self.tree,
            self.mintree,
            self.layout,
            self.scratch[ops.__name__],
            self.gen,
            self.counters,
            self.scalars,
            torch.as_tensor(idx, dtype=torch.int64),
            torch.as_tensor(td, dtype=torch.float32),
            expected_gen,
            alpha,
            eps,
        )


#: a stored priority against the oracle's float64 ``(|td| + eps) ** alpha``: the float32 rounding of
#: ``|td| + eps`` (scaled by alpha) plus float32 ``pow`` (torch, within 2 ulps) or
#: ``exp2(alpha * log2(x))`` (Triton, whose error grows with |log2 x|: about 8 ulps at x = 2^20)
LEAF_RTOL = 1e-6


def sum_rtol(arity: int, levels: int = 1) -> float:
    """Relative tolerance of a float32 node against the exact sum of the oracle leaves below it.

    A float32 sum of K non-negative float32 numbers, in any order, is within (K - 1) * 2^-24
    (relative) of the exact sum: each of the K - 1 additions rounds by at most half an ulp of a
    partial sum no larger than the total. ``levels`` stacked sums add up their errors (to first
    order), on top of the leaves' own :data:`LEAF_RTOL`.
    """
    return levels * (arity - 1) * 2.0**-24 + LEAF_RTOL


def check_tree(tree: torch.Tensor, mintree: torch.Tensor, layout: TreeLayout, leaves: list[float], what=""):
    """Every invariant of a tree pair whose leaves should be ``leaves`` (oracle priorities, 0 = empty).

    * leaves equal the oracle's to float32 rounding;
    * every inner node is the sum (min tree: exactly the min) of its K children as stored;
    * padding is 0 in the sum tree and +inf in the min tree;
    * each level, and the root, equals the oracle's exact tree.
    """
    from oracle import build_trees

    k, lay = layout.arity, layout
    assert tree.numel() == mintree.numel() == lay.numel + 1
    want_sum, want_min = build_trees(leaves, lay)
    want_sum = torch.tensor(want_sum, dtype=torch.float64)
    want_min = torch.tensor(want_min, dtype=torch.float64)
    ends = list(lay.offsets[1:]) + [lay.numel]
    for level in range(lay.depth):
        off, n, end = lay.offsets[level], lay.sizes[level], ends[level]
        below = lay.depth - 1 - level
        assert_verbose_allclose(
            tree[off : off + n], want_sum[off : off + n], rtol=sum_rtol(k, below), what=f"{what} sum level {level}"
        )
        assert_verbose_allclose(
            mintree[off : off + n], want_min[off : off + n], rtol=LEAF_RTOL, what=f"{what} min level {level}"
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
    assert abs(float(top) - exact) <= sum_rtol(k, lay.depth) * exact, f"{what} root {float(top)} != {exact}"
