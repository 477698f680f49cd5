"""A seeded state-machine fuzz test: random sequences of calls on a ``PrioritizedReplayBuffer`` and on a
plain-Python model of it (``tests/fuzz_model.py``, over ``tests/oracle.py``), checked against each
other after every call.

A case is a seed and the buffer's fixed settings (capacity, arity, sampling mode, weight
normalisation). Its seed drives a ``random.Random`` that picks each operation from :data:`OPS`
and its arguments, so a case is one fixed sequence: a failure names the case, its seed, the step
and the last operations, and rerunning that case id (``-k``) replays it. ``GPER_FUZZ_SCALE``
lengthens every sequence.

After every operation: ``len``, every count of ``stats()``, the stored priority of every filled
slot, the batches still held (unchanged by later calls) and, after a checkpoint round trip, the
buffer that did not round-trip (bit-identical state, same draws); every few steps the whole tree
(``helpers.check_tree``), the storage, the generations and rank mode's keys. Every sampled batch
is checked entry by entry: index range, fields (exactly), generations, IS weights, and in
stratified mode the stratum of each draw. Now and then a large batch is tested against the
model's probabilities with a chi-square at a fixed seed (deterministic: it cannot flake),
together with a check that the same counts reject the wrong distribution wherever that is sure
to happen, so the test is known to have power.

Batches drawn before a ``load_state_dict`` are not used after it: what they mean there is the
buffer's to define. Floats are compared with the tolerances of ``tests/helpers.py``
(:func:`helpers.leaf_rtol`: the model computes in float64, the buffer in float32, Triton through
``exp2(alpha * log2 x)``).

Variants: the torch back end on the CPU (every shape, 10-40 s), the Triton kernels under the
interpreter (a few small cases, ~45 s), and on CUDA (``gpu``) the Triton kernels with the buffer's
own CUDA graphs and without them, in longer sequences. Under graphs, alpha, eps and weight_norm are
not assigned: captured graphs do not see them (:func:`test_settings_assigned_after_a_capture_take_effect`).

To add an operation, write ``op_<name>(run) -> str`` (the string goes in the trace of the failure
message) and give it a weight in :data:`OPS`.
"""

from __future__ import annotations

import copy
import math
import os
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import pytest
import torch

import gper
from fuzz_model import ReplayModel, chi2, chi2_groups, chi2_threshold, surely_rejected
from gper.ops.state import rng_blocks
from helpers import TRITON_ON_CPU, assert_verbose_allclose, assert_verbose_equal, check_tree, leaf_rtol, sum_rtol

#: a transition with a float, an int64, a bool and a uint8 field (fields of every alignment)
SPEC = {
    "obs": ((3,), torch.float32),
    "action": ((), torch.int64),
    "done": ((), torch.bool),
    "tag": ((2,), torch.uint8),
}
NAMES = tuple(SPEC)

#: batches held at once (more than the buffer's 3 sample slots per batch size, on CUDA)
MAX_KEPT = 4

#: ``GPER_FUZZ_SCALE=10`` runs every sequence ten times longer (the cases stay the same)
SCALE = float(os.environ.get("GPER_FUZZ_SCALE", "1"))


@dataclass(frozen=True)
class Case:
    """One fuzz sequence: its seed and the buffer's fixed settings."""

    seed: int
    capacity: int
    arity: int
    sampling: str
    weight_norm: str

    def __str__(self) -> str:
        return f"{self.sampling}-{self.weight_norm}-N{self.capacity}-K{self.arity}-seed{self.seed}"


#: (capacity, arity): 1 and 2; K - 1, K, K + 1 (one level to two); K^2 - 1, K^2, K^2 + 1 (two to
#: three); powers of two and their neighbours; a few thousand; every arity 2 .. 32
SHAPES = [
    (1, 2),
    (1, 32),
    (2, 2),
    (2, 16),
    (3, 4),
    (7, 8),
    (8, 8),
    (9, 8),
    (15, 16),
    (16, 16),
    (17, 16),
    (31, 32),
    (32, 32),
    (33, 32),
    (63, 8),
    (64, 8),
    (65, 8),
    (100, 4),
    (255, 16),
    (256, 16),
    (257, 16),
    (1000, 2),
    (1023, 32),
    (1024, 32),
    (1025, 32),
    (3000, 4),
]
COMBOS = [(s, w) for w in ("global", "batch") for s in ("proportional", "stratified", "rank", "uniform")]


def cases(shapes: list[tuple[int, int]], seed0: int) -> list[Case]:
    """One case per shape, the sampling mode and weight norm turning over all eight combinations."""
    return [Case(seed0 + i, n, k, *COMBOS[(i * 3) % len(COMBOS)]) for i, (n, k) in enumerate(shapes)]


@dataclass(frozen=True)
class Limits:
    """How much of the slower work a run does (the interpreter, the CPU and the GPU afford different amounts).

    Attributes:
        dist_max: the distribution check runs only while at most this many slots are filled.
        dist_draws: its batch's largest size (40 draws per filled slot, at least 5000).
        dist_calls: in stratified mode it also draws this many batches of 2 (while at most 64 slots are filled).
        max_batch: largest batch of the other samples and updates.
        deep_every: the whole tree and storage are checked every this many steps (and at the end).
    """

    dist_max: int = 1100
    dist_draws: int = 20000
    dist_calls: int = 64
    max_batch: int = 300
    deep_every: int = 10


@dataclass
class Kept:
    """A sampled batch still held: one batch per buffer of the run, and what it held when drawn."""

    batches: list[gper.SampledBatch]
    indices: list[int]
    generations: list[int]
    copy: dict[str, torch.Tensor]
    step: int


class Run:
    """The buffers of one sequence (one, or two in lock step after a checkpoint round trip), the model,
    the batches held, and where the sequence is (for failure messages)."""

    def __init__(
        self,
        case: Case,
        backend: str,
        device: torch.device,
        cuda_graphs: bool,
        tmp_path: Path,
        limits: Limits,
    ) -> None:
        self.case, self.backend, self.device, self.cuda_graphs = case, backend, device, cuda_graphs
        self.tmp_path, self.limits = tmp_path, limits
        self.rng = random.Random(case.seed)
        self.step, self.op, self.trace = -1, "init", []
        self.rank = case.sampling == "rank"
        self.settings = list(SETTINGS)
        rng = self.rng
        alpha = rng.choice([0.0, 0.5, 0.6, 1.0, round(rng.random(), 3)])
        beta = rng.choice([0.0, 0.4, 1.0, rng.randrange(65) / 64])
        eps = rng.choice(EPS_RANK if self.rank else EPS)
        interval = rng.choice(REFRESH_INTERVALS)
        seed = rng.randrange(2**63)
        self.bufs = [self.new_buffer(seed, alpha, beta, eps, case.weight_norm, interval)]
        depth = self.bufs[0].tree.layout.depth
        self.depth = depth
        self.model = ReplayModel(
            case.capacity, case.sampling, case.weight_norm, alpha, beta, eps, interval, rng_blocks(depth)
        )
        self.kept: list[Kept] = []
        #: (state, model) saved by op_snapshot for op_rewind
        self.snapshot: tuple[dict, ReplayModel] | None = None
        self.invalid_seen: dict[int, int] = {id(self.bufs[0]): 0}
        self.leaf_rtol = leaf_rtol(device)
        # w = (p_i / p_min) ** -beta: both priorities' error, the float32 power (exp2/log2 in Triton,
        # whose error grows with |log2 of the ratio|, up to ~40 here), the batch division
        self.weight_rtol = 8 * self.leaf_rtol

    def new_buffer(
        self, seed: int, alpha: float, beta: float, eps: float, weight_norm: str, interval: int
    ) -> gper.PrioritizedReplayBuffer:
        c = self.case
        return gper.PrioritizedReplayBuffer(
            c.capacity,
            SPEC,
            alpha=alpha,
            beta=beta,
            eps=eps,
            sampling=c.sampling,
            weight_norm=weight_norm,
            device=self.device,
            backend=self.backend,
            seed=seed,
            rank_refresh_interval=interval,
            arity=c.arity,
            cuda_graphs=self.cuda_graphs,
        )

    @property
    def rb(self) -> gper.PrioritizedReplayBuffer:
        """The buffer checked against the model (the others are checked against it)."""
        return self.bufs[0]

    def where(self, what: str = "") -> str:
        return f"[{self.case} {self.backend}/{self.device.type} step {self.step} {self.op}] {what}"

    def check(self, deep: bool) -> None:
        """Everything the buffers expose against the model (``deep``: the whole tree and storage too)."""
        rb, m = self.rb, self.model
        self.check_stats(rb)
        n = m.size
        if n:
            idx = torch.arange(n, device=self.device)
            want_p = torch.tensor(m.leaves[:n], dtype=torch.float64)
            assert_verbose_allclose(rb.priorities(idx), want_p, rtol=self.leaf_rtol, what=self.where("priorities"))
        empty = rb.tree.leaves()[n:]
        assert_identical(empty, torch.zeros_like(empty), self.where("leaves of empty slots"))
        for kept in self.kept:
            b = kept.batches[0]
            for name, was in kept.copy.items():
                now = getattr(b, name) if name != "obs" else b["obs"]
                assert_identical(
                    now, was.to(now.device), self.where(f"{name} of the batch held since step {kept.step}")
                )
        for other in self.bufs[1:]:
            assert_same_state(other, rb, self.where("buffer that did not round-trip"))
        if deep:
            check_tree(rb.tree, m.leaves, what=self.where("tree"))
            state = rb.state_dict()
            assert state["gen"].tolist() == m.book.generations, self.where("generations")
            storage = rb.storage
            for k, name in enumerate(NAMES):
                stored = storage[name][:n].tolist()
                want_f = [m.items[i][k] for i in range(n)]
                assert_same_list(stored, want_f, self.where(f"storage[{name!r}]"))
            if self.rank:
                keys = state["key"][:n].double()
                want_k = torch.tensor(m.book.priorities[:n], dtype=torch.float64)
                assert_verbose_allclose(keys, want_k, rtol=self.leaf_rtol, what=self.where("rank keys"))

    def check_stats(self, rb: gper.PrioritizedReplayBuffer) -> None:
        """``len(rb)`` and ``rb.stats()`` against the model, and its warning about dropped entries."""
        m = self.model
        assert len(rb) == m.size, self.where(f"len {len(rb)} != {m.size}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", gper.GperWarning)
            got = rb.stats()
        want = m.stats()
        dropped = [w for w in caught if issubclass(w.category, gper.GperWarning)]
        grew = want["invalid_indices"] > self.invalid_seen[id(rb)]
        assert bool(dropped) == grew, self.where(f"GperWarning {[str(w.message) for w in dropped]}, expected {grew}")
        self.invalid_seen[id(rb)] = want["invalid_indices"]
        for key in ("size", "cursor", "rng_offset", "invalid_indices", "stale_updates", "nonfinite_td"):
            assert got[key] == want[key], self.where(f"stats()[{key!r}] = {got[key]}, model {want[key]}")
        assert math.isclose(got["max_priority"], want["max_priority"], rel_tol=self.leaf_rtol), self.where(
            f"max_priority {got['max_priority']!r}, model {want['max_priority']!r}"
        )
        tol = sum_rtol(self.case.arity, self.depth, self.leaf_rtol)
        assert math.isclose(got["total_priority"], want["total_priority"], rel_tol=tol), self.where(
            f"total_priority {got['total_priority']!r}, model {want['total_priority']!r}"
        )

    def check_batch(self, batch: gper.SampledBatch, b: int, beta: float) -> None:
        """One sampled batch against the model's contents and weights."""
        m = self.model
        assert batch.indices.dtype == torch.int64 and batch.generations.dtype == torch.int32, self.where("dtypes")
        assert batch.weights.dtype == torch.float32 and batch.batch_size == b, self.where("weights dtype / B")
        idx = batch.indices.tolist()
        bad = [i for i in idx if not 0 <= i < m.size]
        assert not bad, self.where(f"indices {bad[:5]} outside [0, {m.size})")
        gens = batch.generations.tolist()
        want_gen = [m.book.generations[i] for i in idx]
        assert_same_list(gens, want_gen, self.where("generations"))
        for k, name in enumerate(NAMES):
            assert_same_list(batch[name].tolist(), [m.items[i][k] for i in idx], self.where(f"batch[{name!r}]"))
        if m.sampling == "uniform":
            assert_verbose_equal(batch.weights, torch.ones(b), what=self.where("uniform weights"))
            return
        want_w = torch.tensor(m.weights(idx, beta), dtype=torch.float64)
        assert_verbose_allclose(batch.weights, want_w, rtol=self.weight_rtol, what=self.where(f"weights beta={beta}"))
        if m.weight_norm == "batch":
            assert float(batch.weights.max()) == 1.0, self.where("batch-normalised weights peak below 1")
        if m.sampling == "stratified":
            self.check_strata(idx)

    def check_strata(self, idx: list[int]) -> None:
        """Stratified draw ``s`` lies in ``[s/B, (s+1)/B)`` of the cumulative mass, in slot order."""
        leaves = self.model.leaves[: self.model.size]
        cum = [0.0, *accumulate(leaves)]
        total, b = cum[-1], len(idx)
        slack = 4 * sum_rtol(self.case.arity, self.depth, self.leaf_rtol) * total
        for s, i in enumerate(idx):
            lo, hi = s / b * total, (s + 1) / b * total
            ok = cum[i] <= hi + slack and cum[i + 1] >= lo - slack
            assert ok, self.where(f"draw {s} of {b} is slot {i}, mass [{cum[i]}, {cum[i + 1]}), stratum [{lo}, {hi})")


def assert_identical(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """:func:`helpers.assert_verbose_equal`, after a fast exact comparison (these run every step)."""
    if got.dtype != want.dtype or got.device != want.device or not torch.equal(got, want):
        assert_verbose_equal(got, want, what=what)


def assert_same_list(got: list, want: list, what: str) -> None:
    if got != want:
        k = next(k for k, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        raise AssertionError(f"{what}: entry {k} is {got[k]!r}, expected {want[k]!r}")


def assert_same_state(other: gper.PrioritizedReplayBuffer, rb: gper.PrioritizedReplayBuffer, what: str) -> None:
    """Two buffers that received the same calls hold bit-identical state."""
    assert len(other) == len(rb) and other.seed == rb.seed, f"{what}: len/seed {len(other)}/{other.seed}"
    a, b = other.state_dict(), rb.state_dict()
    assert a.keys() == b.keys() and a["host"] == b["host"] and a["config"] == b["config"], f"{what}: host/config"
    for key, value in b.items():
        if isinstance(value, torch.Tensor):
            assert_identical(a[key], value, f"{what}: state[{key!r}]")


def assert_same_batch(got: gper.SampledBatch, want: gper.SampledBatch, what: str) -> None:
    for name in ("indices", "weights", "generations", "rows"):
        assert_identical(getattr(got, name), getattr(want, name), f"{what}: {name}")


EPS = [1e-6, 1e-4, 1e-2, 0.5]
#: rank mode ranks by the float32 key |td| + eps, which the model computes in float64 and Triton as
#: exp2(log2(.)) (hardware approximations on CUDA, ~1e-6): with TD errors on the grid of
#: :func:`random_td` and these eps, any two distinct keys differ by more than 1e-4 relative (3e-5
#: with the powers of two of :func:`op_distribution`), so rounding never decides an order; equal TD
#: errors give equal keys in every computation, and ties go by slot
EPS_RANK = [1e-6, 2.0**-11]
REFRESH_INTERVALS = [1, 2, 3, 7, 100]
#: the settings a built buffer lets a caller assign
SETTINGS = ("alpha", "beta", "eps", "weight_norm", "rank_refresh_interval")
BATCH_SIZES = [1, 2, 3, 7, 33, 64, 256]
TD_DTYPES = [torch.float32] * 5 + [torch.float64, torch.float16, torch.bfloat16]


def random_items(run: Run, n: int) -> tuple[dict[str, torch.Tensor], list[tuple]]:
    """``n`` random transitions (on the device or, sometimes on CUDA, the CPU) and their Python values."""
    g = torch.Generator().manual_seed(run.rng.getrandbits(62))
    data = {
        "obs": torch.randn(n, 3, generator=g),
        "action": torch.randint(-(2**40), 2**40, (n,), generator=g),
        "done": torch.rand(n, generator=g) < 0.5,
        "tag": torch.randint(0, 256, (n, 2), generator=g, dtype=torch.uint8),
    }
    items = list(zip(*(data[name].tolist() for name in NAMES), strict=True))
    if run.device.type != "cpu" and run.rng.random() < 0.7:
        data = {k: v.to(run.device) for k, v in data.items()}
    return data, items


def random_td(run: Run, b: int) -> tuple[torch.Tensor, list[float]]:
    """[b] TD errors with zeros, NaN and ±Inf among them, in a random float dtype; the float32 values
    the buffer reads from them."""
    rng = run.rng
    values = []
    for _ in range(b):
        u = rng.random()
        if u < 0.04:
            values.append(math.nan)
        elif u < 0.06:
            values.append(rng.choice([math.inf, -math.inf]))
        elif u < 0.1:
            values.append(0.0)
        elif run.rank:
            values.append(rng.choice([-1, 1]) * (1 + rng.randrange(16) / 16) * 2.0 ** rng.randrange(-6, 2))
        else:
            values.append(rng.choice([-1, 1]) * 10 ** rng.uniform(-4, 4))
    dtype = rng.choice(TD_DTYPES)
    td = torch.tensor(values, dtype=torch.float32).to(dtype)
    seen = td.float().tolist()
    td = td.to(run.device)
    if dtype == torch.float32 and rng.random() < 0.2:
        td.requires_grad_(True)  # a loss's TD errors: the buffer detaches them
    return td, seen


def op_add(run: Run) -> str:
    cap, rng = run.case.capacity, run.rng
    u = rng.random()
    if u < 0.5:
        n = rng.randint(1, min(8, cap + 1))
    elif u < 0.65:
        n = rng.choice([cap - 1, cap, cap + 1]) or 1
    else:
        n = rng.randint(1, cap + cap // 4 + 2)
    data, items = random_items(run, n)
    slots = run.model.add(items)
    for rb in run.bufs:
        pos = rb.add(data)
        assert pos.dtype == torch.int64 and pos.tolist() == slots, run.where(f"add({n}) wrote {pos.tolist()}")
    return f"n={n}"


def random_beta(run: Run) -> tuple[float | torch.Tensor | None, float]:
    """A beta argument (None: the buffer's; a float; a 0-d float32 or float64 device tensor) and its value."""
    rng = run.rng
    u = rng.random()
    if u < 0.3:
        return None, run.model.beta
    value = rng.randrange(65) / 64
    if u < 0.7:
        return value, value
    return torch.tensor(value, dtype=rng.choice([torch.float32, torch.float64]), device=run.device), value


def random_batch_size(run: Run) -> int:
    """Often a size in :data:`BATCH_SIZES`, or that of a batch held (so on CUDA several sample slots
    of one size are busy at once)."""
    rng = run.rng
    u = rng.random()
    if run.kept and u < 0.3:
        return len(rng.choice(run.kept).indices)
    return min(rng.choice(BATCH_SIZES) if u < 0.8 else rng.randint(1, 300), run.limits.max_batch)


def op_sample(run: Run, keep: float = 0.5) -> str:
    rng, m = run.rng, run.model
    b = random_batch_size(run)
    beta, value = random_beta(run)
    if m.size == 0:
        for rb in run.bufs:
            with pytest.raises(RuntimeError, match="empty"):
                rb.sample(b, beta=beta)
        return f"B={b} on an empty buffer"
    batches = [rb.sample(b, beta=beta) for rb in run.bufs]
    m.sample(b)
    run.check_batch(batches[0], b, value)
    for other in batches[1:]:
        assert_same_batch(other, batches[0], run.where("sample of the buffer that did not round-trip"))
    if rng.random() < keep:
        first = batches[0]
        copy = {name: getattr(first, name).clone() for name in ("indices", "weights", "generations", "rows")}
        copy["obs"] = first["obs"].clone()
        idx = first.indices.tolist()
        run.kept.append(Kept(batches, idx, [m.book.generations[i] for i in idx], copy, run.step))
        if len(run.kept) > MAX_KEPT:
            run.kept.pop(0)
    return f"B={b} beta={beta if not isinstance(beta, torch.Tensor) else f'tensor({value}, {beta.dtype})'}"


def op_update_batch(run: Run) -> str:
    """``update_priorities(batch, td)`` of a batch held since some earlier step (its slots may be overwritten)."""
    rng = run.rng
    if not run.kept:
        return "no batch held; " + op_sample(run, keep=1.0)
    k = rng.randrange(len(run.kept))
    kept = run.kept[k]
    if rng.random() < 0.5:
        run.kept.pop(k)
    td, seen = random_td(run, len(kept.indices))
    for rb, batch in zip(run.bufs, kept.batches, strict=True):
        rb.update_priorities(batch, td)
    run.model.update(kept.indices, seen, kept.generations)
    return f"batch of step {kept.step}, B={len(seen)}, td dtype {td.dtype}"


def op_update_indices(run: Run) -> str:
    """``update_priorities(indices, td)`` with raw indices, often repeating a few slots."""
    rng, n = run.rng, run.model.size
    if n == 0:
        return "skipped: empty"
    b = random_batch_size(run)
    pool = [rng.randrange(n) for _ in range(3)] if rng.random() < 0.3 else range(n)
    idx = [rng.choice(pool) for _ in range(b)]
    dtype = rng.choice([torch.int64, torch.int32])
    td, seen = random_td(run, b)
    idx_t = torch.tensor(idx, dtype=dtype, device=run.device)
    for rb in run.bufs:
        rb.update_priorities(idx_t, td)
    run.model.update(idx, seen)
    return f"B={b} {dtype} td {td.dtype}"


def op_update_out_of_range(run: Run) -> str:
    """Indices outside ``[0, size)``: on the CPU they raise (nothing changes); on CUDA without ``strict``
    they are dropped and counted, and the next ``stats()`` warns."""
    rng, n = run.rng, run.model.size
    b = rng.randint(1, 8)
    idx = [rng.randrange(n) if n and rng.random() < 0.5 else 0 for _ in range(b)]
    idx[rng.randrange(b)] = rng.choice([-1, n, n + 5, 2**40])
    if n == 0:
        idx = [rng.choice([-1, 0, 3]) for _ in range(b)]
    td, seen = random_td(run, b)
    idx_t = torch.tensor(idx, dtype=torch.int64, device=run.device)
    if run.device.type == "cpu":
        for rb in run.bufs:
            with pytest.raises(IndexError, match="out of range"):
                rb.update_priorities(idx_t, td)
            with pytest.raises(IndexError, match="out of range"):
                rb.priorities(idx_t)
        return f"raised for {idx}"
    for rb in run.bufs:
        rb.update_priorities(idx_t, td)
        got = rb.priorities(idx_t).tolist()
        assert all(math.isnan(p) == (not 0 <= i < n) for p, i in zip(got, idx, strict=True)), run.where(
            f"priorities({idx}) = {got}"
        )
    run.model.update(idx, seen)
    return f"dropped out of {idx}"


def op_stats(run: Run) -> str:
    # every step checks stats() of the main buffer; this reads the other's too
    for rb in run.bufs[1:]:
        run.check_stats(rb)
    return f"{len(run.bufs) - 1} more"


def op_settings(run: Run) -> str:
    """Assign one of the settings a buffer lets a caller change."""
    rng, m = run.rng, run.model
    name = rng.choice(run.settings)
    if name == "alpha":
        value = rng.choice([0.0, 0.3, 0.5, 0.6, 1.0, round(rng.random(), 3)])
    elif name == "beta":
        value = rng.randrange(65) / 64
    elif name == "eps":
        value = rng.choice(EPS_RANK if run.rank else EPS)
    elif name == "weight_norm":
        value = rng.choice(["global", "batch"])
    else:
        value = rng.choice(REFRESH_INTERVALS)
    for rb in run.bufs:
        setattr(rb, name, value)
        assert getattr(rb, name) == value, run.where(f"{name} reads {getattr(rb, name)!r} after setting {value!r}")
    setattr(m, name, value)
    return f"{name}={value}"


def round_trip(run: Run, through: str | None) -> str:
    """Checkpoint the main buffer into a fresh one built with other seed (the same settings otherwise),
    continue on the fresh one, and keep the original in lock step with it; then sample both."""
    old = run.rb
    state = old.state_dict()
    if through == "torch":
        path = run.tmp_path / f"state-{run.step}.pt"
        torch.save(state, path)
        state = torch.load(path, weights_only=True)
        path.unlink()
    m = run.model
    fresh = run.new_buffer(run.rng.randrange(2**63), m.alpha, m.beta, m.eps, m.weight_norm, m.rank_refresh_interval)
    if through == "file":  # the buffer's own file: rb.save / rb.load
        path = run.tmp_path / f"buffer-{run.step}.safetensors"
        old.save(path)
        fresh.load(path)
        path.unlink()
    else:
        fresh.load_state_dict(state)
    assert fresh.seed == old.seed and len(fresh) == len(old), run.where("seed/len after load_state_dict")
    run.bufs = [fresh, old]
    # a restored buffer takes the dropped entries its state counts as reported already
    run.invalid_seen[id(fresh)] = m.stats()["invalid_indices"]
    # batches drawn before a load are not carried across it (their staleness there is the buffer's to define)
    run.kept.clear()
    assert_same_state(fresh, old, run.where("state after load_state_dict"))
    return {None: "", "torch": "through torch.save; ", "file": "through rb.save; "}[through] + op_sample(run, keep=0.0)


def op_round_trip(run: Run) -> str:
    return round_trip(run, None)


def op_save_load(run: Run) -> str:
    return round_trip(run, "torch")


def op_buffer_file(run: Run) -> str:
    return round_trip(run, "file")


def op_snapshot(run: Run) -> str:
    """Save a deep copy of the state (and of the model) for a later :func:`op_rewind`."""
    state = {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in run.rb.state_dict().items()}
    run.snapshot = (state, copy.deepcopy(run.model))
    return f"size {run.model.size}"


def op_rewind(run: Run) -> str:
    """``load_state_dict`` of the snapshot into the buffers in place (their CUDA graphs captured since);
    refused, with nothing changed, when a setting in the checkpoint's configuration was changed since."""
    if run.snapshot is None:
        return "no snapshot; " + op_snapshot(run)
    state, saved = run.snapshot
    m = run.model
    same = all(getattr(saved, k) == getattr(m, k) for k in ("alpha", "beta", "eps", "weight_norm"))
    if not same:
        for rb in run.bufs:
            with pytest.raises(ValueError, match="configuration differs"):
                rb.load_state_dict(state)
        return "refused: settings changed since the snapshot"
    for rb in run.bufs:
        rb.load_state_dict(state)
    model = copy.deepcopy(saved)
    model.rank_refresh_interval = m.rank_refresh_interval  # a setting of the buffer, not of its checkpoint
    run.model = model
    for rb in run.bufs:  # the dropped entries the snapshot counts are reported already
        run.invalid_seen[id(rb)] = model.stats()["invalid_indices"]
    run.kept.clear()  # batches drawn before a load: see round_trip
    return f"back to size {model.size}; " + op_sample(run, keep=0.0)


def op_refresh(run: Run) -> str:
    if not run.rank:
        for rb in run.bufs:
            with pytest.raises(RuntimeError, match="rank"):
                rb.refresh_ranks()
        return "raised (not rank mode)"
    for rb in run.bufs:
        rb.refresh_ranks()
    run.model.refresh()
    return ""


def op_distribution(run: Run) -> str:
    """Spread the priorities, draw a large batch, and chi-square its counts against the model's
    probabilities; the same counts must fail against the wrong distribution (uniform, or for uniform
    sampling the priorities') wherever the two differ enough."""
    rng, m = run.rng, run.model
    n = m.size
    if n < 2 or n > run.limits.dist_max:
        return "skipped"
    idx = list(range(n))
    values = [rng.choice([-1, 1]) * 2.0 ** rng.randrange(-4, 5) for _ in idx]
    td = torch.tensor(values, dtype=torch.float32, device=run.device)
    idx_t = torch.tensor(idx, device=run.device)
    for rb in run.bufs:
        rb.update_priorities(idx_t, td)
    m.update(idx, values)
    if run.rank:
        for rb in run.bufs:
            rb.refresh_ranks()
        m.refresh()
    b = min(run.limits.dist_draws, max(5000, 40 * n))
    beta, value = random_beta(run)
    batches = [rb.sample(b, beta=beta) for rb in run.bufs]
    m.sample(b)
    for other in batches[1:]:
        assert_same_batch(other, batches[0], run.where("large sample of the buffer that did not round-trip"))
    batch = batches[0]
    drawn = batch.indices.cpu()
    assert int(drawn.min()) >= 0 and int(drawn.max()) < n, run.where("index outside [0, size)")
    for k, name in enumerate(NAMES):
        dtype = SPEC[name][1]
        table = torch.tensor([m.items[i][k] for i in range(n)], dtype=dtype)
        assert_verbose_equal(batch[name].cpu(), table[drawn], what=run.where(f"large batch[{name!r}]"))
    if m.sampling == "uniform":
        assert bool((batch.weights == 1).all()), run.where("uniform weights")
    else:
        want_w = torch.tensor(m.weights(drawn.tolist(), value), dtype=torch.float64)
        assert_verbose_allclose(batch.weights, want_w, rtol=run.weight_rtol, what=run.where("large batch weights"))
    counts = torch.bincount(drawn, minlength=n).tolist()
    probs = m.probabilities()
    stat, df = chi2(counts, probs, chi2_groups(probs, b))
    if df >= 1:
        assert stat < chi2_threshold(df), run.where(f"chi-square {stat:.1f} with {df} df, B={b}")
    leaves = m.leaves[:n]
    wrong = [1.0 / n] * n if m.sampling != "uniform" else [p / math.fsum(leaves) for p in leaves]
    groups = chi2_groups(wrong, b)
    power = surely_rejected(probs, wrong, groups, b)
    if power:
        stat_w, df_w = chi2(counts, wrong, groups)
        assert stat_w > chi2_threshold(df_w), run.where(
            f"chi-square against the wrong distribution only {stat_w:.1f} with {df_w} df, B={b}"
        )
    out = f"B={b} chi2={stat:.1f} df={df}" + (f", against the wrong one {stat_w:.1f}" if power else "")
    if m.sampling == "stratified" and n <= 64:
        out += "; " + stratified_small_batches(run, probs, run.limits.dist_calls)
    return out


def stratified_small_batches(run: Run, probs: list[float], calls: int, b: int = 2) -> str:
    """Many stratified batches of 2: each call draws a fresh point in each stratum, so their draws
    together follow the probabilities (a sampler that reused one point per stratum would not)."""
    counts = [0] * len(probs)
    for _ in range(calls):
        batches = [rb.sample(b) for rb in run.bufs]
        run.model.sample(b)
        for other in batches[1:]:
            assert_same_batch(other, batches[0], run.where("small stratified sample of the other buffer"))
        for i in batches[0].indices.tolist():
            counts[i] += 1
    stat, df = chi2(counts, probs, chi2_groups(probs, calls * b))
    if df >= 1:
        assert stat < chi2_threshold(df), run.where(
            f"{calls} stratified batches of {b}: chi-square {stat:.1f}, {df} df"
        )
    return f"{calls} x B={b}: chi2={stat:.1f} df={df}"


#: operation name -> (function, weight of its draw)
OPS: dict[str, tuple[Callable[[Run], str], float]] = {
    "add": (op_add, 20),
    "sample": (op_sample, 24),
    "update_batch": (op_update_batch, 18),
    "update_indices": (op_update_indices, 10),
    "update_out_of_range": (op_update_out_of_range, 1.5),
    "stats": (op_stats, 2),
    "settings": (op_settings, 6),
    "round_trip": (op_round_trip, 1.5),
    "save_load": (op_save_load, 1.5),
    "buffer_file": (op_buffer_file, 1.5),
    "snapshot": (op_snapshot, 1),
    "rewind": (op_rewind, 1.5),
    "refresh": (op_refresh, 2),
    "distribution": (op_distribution, 1.5),
}


def fuzz(
    case: Case,
    steps: int,
    backend: str,
    device: torch.device | str,
    tmp_path: Path,
    cuda_graphs: bool = False,
    limits: Limits = Limits(),
) -> Run:
    """Run ``steps`` random operations of ``case`` on a buffer and on the model, checking after each."""
    run = Run(case, backend, torch.device(device), cuda_graphs, tmp_path, limits)
    names = list(OPS)
    weights = [OPS[name][1] for name in names]
    run.check(deep=True)
    for step in range(steps):
        run.step = step
        run.op = name = run.rng.choices(names, weights)[0]
        try:
            detail = OPS[name][0](run)
            run.trace.append(f"{step}:{name}({detail})")
            run.check(deep=step % limits.deep_every == limits.deep_every - 1 or step == steps - 1)
        except Exception as e:
            last = "\n  ".join(run.trace[-8:])
            raise AssertionError(
                f"fuzz case {case} failed at step {step} ({name}) on {backend}/{torch.device(device).type}; "
                f"the sequence is fixed by the case: rerun it with -k '{case}'\n"
                f"last operations:\n  {last}\n{type(e).__name__}: {e}"
            ) from e
    return run


#: 26 cases of 300 steps: 10 s on two idle CPU cores, 40 s while they are busy with other work
TORCH_CASES = cases(SHAPES, seed0=1000)
TORCH_STEPS = 300


@pytest.mark.parametrize("case", TORCH_CASES, ids=str)
def test_fuzz_torch(case, tmp_path):
    fuzz(case, int(TORCH_STEPS * SCALE), "torch", "cpu", tmp_path)


#: the Triton kernels under the interpreter cost tens of milliseconds a launch: a few short sequences
TRITON_CPU_CASES = [
    Case(2000, 1, 2, "proportional", "global"),
    Case(2001, 7, 8, "stratified", "batch"),
    Case(2002, 16, 16, "rank", "global"),
    Case(2003, 33, 32, "uniform", "batch"),
    Case(2004, 63, 4, "rank", "batch"),
    Case(2005, 100, 2, "proportional", "batch"),
    Case(2006, 257, 16, "stratified", "global"),
]
TRITON_CPU_STEPS = 80
#: the interpreter's time grows with the batch: smaller batches, distribution checks only while small
TRITON_CPU_LIMITS = Limits(dist_max=64, dist_draws=2000, dist_calls=16, max_batch=64)


@pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton on CPU tensors needs triton and TRITON_INTERPRET=1")
# alpha = 0 with an infinite TD error computes 0 * inf = NaN in the update kernel before the nonfinite
# entry is replaced by the max priority; NumPy (the interpreter) warns about it
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("case", TRITON_CPU_CASES, ids=str)
def test_fuzz_triton_interpreted(case, tmp_path):
    fuzz(case, int(TRITON_CPU_STEPS * SCALE), "triton", "cpu", tmp_path, limits=TRITON_CPU_LIMITS)


#: on the GPU every shape in two more of the eight (sampling, weight_norm) combinations than on the
#: CPU, with longer sequences, through the buffer's own CUDA graphs
GPU_CASES = [
    Case(3000 + 2 * i + j, n, k, *COMBOS[(i * 3 + shift) % len(COMBOS)])
    for i, (n, k) in enumerate(SHAPES)
    for j, shift in enumerate((1, 5))
]
GPU_STEPS = 800
GPU_LIMITS = Limits(dist_draws=100000)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_fuzz_triton_cuda_graphs(case, tmp_path):
    fuzz(case, int(GPU_STEPS * SCALE), "triton", "cuda", tmp_path, cuda_graphs=True, limits=GPU_LIMITS)


#: the same kernels compiled, without graphs: here the frozen settings are assigned too
GPU_DIRECT_CASES = cases(SHAPES, seed0=4000)
GPU_DIRECT_STEPS = 400


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_DIRECT_CASES, ids=str)
def test_fuzz_triton_cuda_direct(case, tmp_path):
    fuzz(case, int(GPU_DIRECT_STEPS * SCALE), "triton", "cuda", tmp_path, cuda_graphs=False, limits=GPU_LIMITS)


def settings_after_capture(device: str, name: str, value: object) -> tuple[torch.Tensor, torch.Tensor]:
    """What a buffer does with a setting assigned after its calls were captured: (got, want).

    Eight slots of priorities 1e-3, 2, 3 .. 8 (alpha 0.5, eps 1e-6; the first is practically never
    drawn, so global weights stay below 1) take an update and a sample twice each
    (on CUDA the first call captures a graph and the second replays or captures by address); then
    ``name`` is assigned and the same update, or a sample, runs again.
    """
    rb = gper.PrioritizedReplayBuffer(8, SPEC, alpha=0.5, eps=1e-6, device=device, seed=5, cuda_graphs=True)
    rb.add({"obs": torch.zeros(8, 3), "action": torch.arange(8), "done": torch.zeros(8, dtype=torch.bool),
            "tag": torch.zeros(8, 2, dtype=torch.uint8)})  # fmt: skip
    idx = torch.arange(8, device=device)
    td = torch.arange(1, 9, dtype=torch.float32, device=device) ** 2 - 1e-6
    td[0] = 0.0
    for _ in range(2):
        rb.update_priorities(idx, td)
        rb.sample(16)
    setattr(rb, name, value)
    if name == "weight_norm":
        # batch normalisation divides by the batch's largest weight: the largest is exactly 1
        return rb.sample(16).weights.max().cpu(), torch.tensor(1.0)
    rb.update_priorities(idx, td)
    return rb.priorities(idx).cpu(), ((td.double() + rb.eps) ** rb.alpha).float().cpu()


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("name, value", [("alpha", 1.0), ("eps", 0.5), ("weight_norm", "batch")])
def test_settings_assigned_after_a_capture_take_effect(device, name, value):
    got, want = settings_after_capture(device, name, value)
    assert_verbose_allclose(got, want, rtol=1e-5, what=f"{name} = {value!r} after a capture")
