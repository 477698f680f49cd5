"""Time gper against the prioritized replay buffers people use today, on the user's workload.

Usage::

    python benchmarks/bench_peers.py                         # GPU if there is one: 2^16..2^25, batches 256, 16384
    python benchmarks/bench_peers.py --device cpu            # CPU: 2^16 and 2^20 (gper's torch back end)
    python benchmarks/bench_peers.py --peers gper torchrl-td flashbax --capacities 24 --batches 16384
    python benchmarks/bench_peers.py --quick                 # a smoke run

Peers (each imported only when asked for; one that is not installed, or does not load, is skipped
with a message and named in the report):

* ``gper-triton`` / ``gper-torch``: :class:`gper.PrioritizedReplayBuffer`, eager and replayed as
  one captured CUDA graph (:mod:`gper.bench.workload`'s ``GperWorkload``).
* ``seeds-cumsum`` and ``torch-multinomial``: the seeds' O(N) design and ``torch.multinomial``,
  as in ``gper bench`` (``SeedsBaseline``).
* ``torchrl`` and ``torchrl-td``: TorchRL's ``PrioritizedReplayBuffer`` and
  ``TensorDictPrioritizedReplayBuffer`` over a ``LazyTensorStorage`` on the device. The sum tree
  lives where the installed wheel can put it: PyPI's wheels have only the C++ CPU tree, so on a
  GPU the data is on the GPU and the tree on the host.
* ``cpprb``: cpprb's ``PrioritizedReplayBuffer`` (C++ tree and numpy storage, on the host).
* ``flashbax`` and ``flashbax-x64``: flashbax's ``make_prioritised_flat_buffer`` on JAX's device,
  its add / sample / set_priorities jitted (the state donated, so it is updated in place), in
  float32 and with ``jax_enable_x64``. Each runs in a subprocess of its own, because x64 is a
  process-wide switch and because JAX keeps the memory it took until its process ends.

What is timed, per capacity and batch size B, on a buffer filled to capacity with random
transitions (obs and next_obs 51 float32, action int64, reward float32, done bool) whose
priorities are then set from log-uniform TD errors:

* ``add``: B new transitions, already on the device.
* ``sample``: B transitions with their IS weights and indices, every field on the device.
* ``update``: new priorities for one sampled batch, from a [B] tensor of TD errors on the device.
* ``step``: ``sample`` then ``update`` of what it drew (the PER step of a training loop).
* ``step+add``: ``add`` then ``step``.

Where a peer hands results to the host (cpprb's arrays, TorchRL's host-side IS weights), the time
includes moving them to the device, and where it needs TD errors or new data on the host, moving
them there; on the CPU nothing moves. Each number is the median over repeats of the mean over
enough back-to-back calls to fill ``--target-ms``, after warm-up calls (compilation, allocation);
CUDA events time torch work, wall time around calls closed by ``block_until_ready`` times JAX.
A cell whose single call takes longer than ``--max-call-s``, or a capacity whose fill would
take longer than ``--max-fill-s``, is skipped and the reason recorded. Running out of memory is
recorded per cell, and the sweep goes on.

Results go to ``--out``: ``peers-<device>-<stamp>.csv`` (rewritten as rows arrive, so a run cut
short keeps what it measured), ``.md`` (header, summaries, all rows) and ``.png`` (time per PER
step against capacity, log-log, one line per implementation, one panel per batch size).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from gper.bench.command import parse_sizes
from gper.bench.report import environment, format_markdown, header_line, print_table
from gper.bench.timing import Timing, capture_graph, synchronize, time_fn
from gper.bench.workload import (
    ALPHA,
    BETA,
    EPS,
    FILL_CHUNK,
    MULTINOMIAL,
    SEEDS,
    TD_LOG10_RANGE,
    GperWorkload,
    SeedsBaseline,
    format_capacity,
    random_td,
    random_transitions,
)

OPS = ("sample", "update", "step", "add", "step+add")
#: in the order they run (the targets' peers first, so a run cut short by --deadline-s keeps them)
PEERS = ("gper", "torchrl", "torchrl-td", "flashbax", "cpprb", "flashbax-x64", "seeds", "multinomial")
JAX_PEERS = ("flashbax", "flashbax-x64")
MODES = ("graph", "eager", "jit", "jit-split", "jit-scan")
#: PER steps per call of flashbax's ``jit-scan`` mode (a jitted lax.scan: JAX's counterpart of a CUDA graph)
SCAN_STEPS = 64
COLUMNS = ("impl", "op", "capacity", "batch", "mode", "median_us", "x_gper_eager", "x_gper_graph")
COLUMNS += ("min_us", "max_us", "iters", "repeats", "status", "note")
#: the order implementations are listed in, in tables and in the plot
IMPL_ORDER = ("gper-triton", "gper-torch", SEEDS, MULTINOMIAL, "torchrl", "torchrl-td", "cpprb", "flashbax")
IMPL_ORDER += ("flashbax-x64",)
#: the issue's targets at 2^24 slots on the H200: gper's step is at least this many times faster
TARGETS = {
    ("torchrl", 16384, "graph"): 300,
    ("torchrl", 16384, "eager"): 100,
    ("torchrl", 256, "eager"): 15,
    ("flashbax", 16384, "graph"): 50,
    ("flashbax", 16384, "eager"): 25,
    ("flashbax", 256, "eager"): 15,
}
#: per capacity and batch size, by device: (capacities as log2, batches, repeats)
DEFAULTS = {
    ("cuda", False): ((16, 20, 24, 25), (256, 16384), 7),
    ("cuda", True): ((16, 20), (256, 16384), 3),
    ("cpu", False): ((16, 20), (256, 16384), 5),
    ("cpu", True): ((12, 16), (256,), 2),
}
#: cpprb's storage description of the user's transition (scalars get shape (1,), as cpprb stores them)
CPPRB_ENV = {
    "obs": {"shape": 51, "dtype": "float32"},
    "action": {"dtype": "int64"},
    "reward": {"dtype": "float32"},
    "next_obs": {"shape": 51, "dtype": "float32"},
    "done": {"dtype": "bool"},
}
#: where each peer's time goes, from reading its source and profiling it on the CPU (one line each, for the report)
WHERE_TIME_GOES = {
    "torchrl": "PyPI's wheel has only C++ trees on the host. sample: B masses drawn with numpy, one single-threaded "
    "descent per sample (scan_lower_bound), then the host indices are copied to the device for the gather and the "
    "host weights after it; update: the TD errors are copied to the host (a sync) and both trees are updated one "
    "index at a time; add: the data is written on the device, the new slots marked in both trees on the host.",
    "torchrl-td": "as torchrl, plus TensorDict work: index and weights set into the sample, td_error read back out.",
    "cpprb": "all on the host: add copies the new transitions to the host; sample is a single-threaded C++ stratified "
    "descent, numpy fancy-indexing of every field and a copy of each to the device; update copies the TD errors to "
    "the host for a serial C++ tree update.",
    "flashbax": "sample: a vmapped descent per sample (fori_loop, a lax.cond per level) and a gather of two items per "
    "sample; set_priorities and add: on GPU set_batch_bincount, whose bincount spans the whole capacity (O(N) a "
    "call), then level-by-level scatter-adds of deltas; on CPU set_batch_scan, one point update after another. "
    "A single jitted step that samples and updates makes XLA copy the tree (O(N)); separate calls (jit-split) don't. "
    "Each call also pays JAX's host-side dispatch; jit-scan (64 steps in one jitted lax.scan) shows the device time.",
    "flashbax-x64": "as flashbax with a float64 tree and probabilities (its stratified draws stay float32).",
    SEEDS: "a cumsum over all N priorities on every sample (O(N)), then searchsorted and the gathers.",
    MULTINOMIAL: "torch.multinomial over all N priorities on every sample (O(N)); it refuses more than 2^24.",
}
_log_prefix = "[bench_peers]"


def log(msg: str) -> None:
    print(f"{_log_prefix} {msg}", file=sys.stderr, flush=True)


class Skip(Exception):
    """A cell or a capacity left out on purpose (too slow, cannot run there): its reason is recorded."""


@dataclass
class Row:
    """One timing, or why there is none (``status``: skipped, oom or error, with a ``note``)."""

    impl: str
    op: str
    capacity: int
    batch: int
    mode: str
    median_us: float | None = None
    x_gper_eager: float | None = None
    x_gper_graph: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    iters: int | None = None
    repeats: int | None = None
    status: str = "ok"
    note: str = ""

    def key(self) -> tuple:
        order = IMPL_ORDER.index(self.impl) if self.impl in IMPL_ORDER else len(IMPL_ORDER)
        return (self.capacity, self.batch, OPS.index(self.op), order, MODES.index(self.mode))


@dataclass
class PeersConfig:
    """What to sweep and how (the flags of this script document each field)."""

    capacities: list[int]
    batches: list[int]
    device: torch.device
    peers: list[str] = field(default_factory=lambda: list(PEERS))
    ops: list[str] = field(default_factory=lambda: list(OPS))
    repeats: int = 7
    warmup: int = 3
    target_ms: float = 20.0
    max_call_s: float = 2.0
    max_cell_s: float = 4.0
    max_fill_s: float = 180.0
    worker_timeout_s: float = 1500.0
    out: Path | None = Path("benchmarks/results")
    plot: bool = True
    seed: int = 0
    command: str = ""
    #: ``time.monotonic()`` after which no fill or cell starts (the rest is recorded as skipped)
    deadline: float | None = None
    #: the 1-minute load average at the start and end of a CPU run (others' work there skews the numbers)
    load: str = ""

    def left_s(self) -> float:
        """Seconds left before the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def fill_limit_s(self) -> float:
        return min(self.max_fill_s, max(self.left_s(), 0.0))

    def check_deadline(self) -> None:
        if self.left_s() <= 0:
            raise Skip("not started: past --deadline-s")


# ----------------------------------------------------------------------------------------------
# which peers are here, and their versions


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def peer_status(peer: str, device: torch.device) -> tuple[bool, str]:
    """Whether ``peer`` can run here, and its versions (or why it cannot), without importing JAX.

    TorchRL's prioritized sampler needs its compiled extension, which loads only with the torch
    it was built against; that is checked here so the report says why instead of failing later.
    """
    if peer in ("gper", "seeds", "multinomial"):
        return True, f"torch {torch.__version__}"
    if peer in ("torchrl", "torchrl-td"):
        if importlib.util.find_spec("torchrl") is None or importlib.util.find_spec("tensordict") is None:
            return False, "torchrl / tensordict not installed"
        try:
            import torchrl._torchrl as ext
        except ImportError as e:
            return False, (
                f"torchrl {_version('torchrl')}: its C++ extension (the sum tree) does not load with "
                f"torch {torch.__version__}: {_first_line(e)}"
            )
        tree = "cuda" if device.type == "cuda" and hasattr(ext, "CudaSumSegmentTreeFp32") else "cpu"
        return True, f"torchrl {_version('torchrl')}, tensordict {_version('tensordict')}, sum tree on {tree}"
    if peer == "cpprb":
        if importlib.util.find_spec("cpprb") is None:
            return False, "cpprb not installed"
        try:
            import cpprb  # noqa: F401
        except ImportError as e:
            return False, f"cpprb does not import: {_first_line(e)}"
        return True, f"cpprb {_version('cpprb')}"
    if peer in JAX_PEERS:
        missing = [m for m in ("jax", "flashbax") if importlib.util.find_spec(m) is None]
        if missing:
            return False, f"{' and '.join(missing)} not installed"
        return True, f"flashbax {_version('flashbax')}, jax {_version('jax')}, jaxlib {_version('jaxlib')}"
    raise ValueError(f"unknown peer {peer!r}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def _is_oom(e: BaseException) -> bool:
    # torch raises OutOfMemoryError; JAX raises XlaRuntimeError with RESOURCE_EXHAUSTED; numpy MemoryError
    return isinstance(e, torch.OutOfMemoryError | MemoryError) or "RESOURCE_EXHAUSTED" in str(e)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# timing


def time_sync(
    fn: Callable[[], object], sync: Callable[[object], None], warmup: int, iters: int, repeats: int
) -> Timing:
    """Median over ``repeats`` of the wall time of ``iters`` calls, closed by ``sync(last result)``.

    For JAX, whose calls return before the device is done: CUDA events on torch's stream would
    not see XLA's work, and a ``block_until_ready`` on the last result of a chain of calls that
    each consume the previous state waits for all of them.
    """
    out = None
    for _ in range(warmup):
        out = fn()
    sync(out)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn()
        sync(out)
        samples.append((time.perf_counter() - t0) * 1e6 / iters)
    return Timing(statistics.median(samples), min(samples), max(samples), iters, repeats, tuple(samples))


def measure(cfg: PeersConfig, peer: Peer, fn: Callable[[], object], mode: str) -> Timing:
    """Time one cell: a probe call first decides how many calls a repeat needs, or skips the cell.

    The probe keeps slow peers from costing minutes per cell: a repeat is ``target_ms`` of calls
    (at least one), and the repeats stop at ``max_cell_s``; a call slower than ``max_call_s``
    is not timed at all.
    """
    if mode == "graph":
        graph = capture_graph(fn, warmup=cfg.warmup)
        try:
            return _measure_eager(cfg, peer, graph.replay)
        finally:
            graph.reset()
    return _measure_eager(cfg, peer, fn)


def _measure_eager(cfg: PeersConfig, peer: Peer, fn: Callable[[], object]) -> Timing:
    peer.sync(fn())  # the first call compiles, allocates, fills caches
    t0 = time.perf_counter()
    peer.sync(fn())
    probe = time.perf_counter() - t0
    if probe > cfg.max_call_s:
        raise Skip(f"one call took {probe:.2f} s (over --max-call-s {cfg.max_call_s:g})")
    iters = int(min(max(cfg.target_ms / 1e3 / max(probe, 1e-7), 1), 10_000))
    repeats = max(1, min(cfg.repeats, int(cfg.max_cell_s / max(probe * iters, 1e-9))))
    warmup = max(1, min(cfg.warmup, int(0.5 / max(probe, 1e-9))))
    return peer.time(fn, warmup, iters, repeats)


# ----------------------------------------------------------------------------------------------
# the peers that run in this process (torch, numpy and C++)


class Peer:
    """A buffer of one peer at one capacity, filled and with random priorities, and the calls to time.

    Subclasses fill the buffer in ``__init__`` and define :meth:`prepare` (the TD errors and new
    transitions of one batch size) and :meth:`op` (the zero-argument call of one op).
    """

    impls: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("eager",)

    def modes_of(self, op: str) -> tuple[str, ...]:
        """How ``op`` is called: eagerly, and on CUDA also replayed as a graph where the peer allows it."""
        return self.modes

    def __init__(self, capacity: int, device: torch.device, seed: int) -> None:
        self.capacity = capacity
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    @staticmethod
    def ops_of(impl: str) -> tuple[str, ...]:
        """The ops timed for ``impl`` (all of :data:`OPS` unless a peer says otherwise)."""
        return OPS

    def prepare(self, b: int, first: bool) -> None:
        """Draw the [b] TD errors and the b new transitions; re-randomise priorities after the first size.

        The timed adds of one batch size put many slots at the max priority; fresh random
        priorities keep every batch size's tree equally far from uniform.
        """
        if not first:
            self.randomize_priorities()
        self.td = random_td(b, self.device, self.gen)
        self.new = random_transitions(b, self.device, self.gen)

    def randomize_priorities(self) -> None:
        raise NotImplementedError

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        raise NotImplementedError

    def steps_per_call(self, mode: str) -> int:
        """PER steps one call of ``op(..., mode)`` makes (its times are divided by this)."""
        return 1

    def sync(self, out: object) -> None:
        synchronize(self.device)

    def time(self, fn: Callable[[], object], warmup: int, iters: int, repeats: int) -> Timing:
        return time_fn(fn, warmup=warmup, iters=iters, repeats=repeats, device=self.device)

    def close(self) -> None:
        """Drop the buffer (the caller then frees the device's cache)."""
        self.__dict__.clear()


def _chunks(n: int, size: int = FILL_CHUNK) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def _fill(n: int, add: Callable[[int, int], None], max_s: float, what: str) -> None:
    """Call ``add(lo, hi)`` over chunks of ``n`` slots; give up early if the whole would exceed ``max_s``.

    ``max_s`` is ``--max-fill-s``, or what is left before ``--deadline-s`` if that is less.
    """
    chunks = _chunks(n)
    t0 = time.perf_counter()
    for i, (lo, hi) in enumerate(chunks):
        add(lo, hi)
        spent = time.perf_counter() - t0
        projected = spent / (i + 1) * len(chunks)
        if projected > max_s:
            raise Skip(f"{what} would take about {projected:.0f} s, over the {max_s:.0f} s left for it")


class GperPeer(Peer):
    """gper, through the ``gper bench`` workload (eager, and as a captured graph on CUDA)."""

    def __init__(self, capacity: int, device: torch.device, seed: int) -> None:
        super().__init__(capacity, device, seed)
        self.wl = GperWorkload(capacity, device, "auto", seed)
        self.gen = self.wl.gen
        self.impls = self.wl.impls
        self.modes = ("graph", "eager") if device.type == "cuda" else ("eager",)

    def randomize_priorities(self) -> None:
        self.wl.randomize_priorities()

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        return _composed(self.wl, impl, name, b, self.td, self.new)


def _composed(wl, impl: str, name: str, b: int, td: torch.Tensor, new: dict) -> Callable[[], object]:
    """The workload's op, or ``step+add`` made of its ``add`` and ``step``."""
    if name != "step+add":
        return wl.op(impl, name, b, td, new)
    add, step = wl.op(impl, "add", b, td, new), wl.op(impl, "step", b, td, new)
    return lambda: (add(), step())


class SeedsPeer(Peer):
    """The seeds' O(N) design and ``torch.multinomial``, on one set of flat arrays."""

    def __init__(self, capacity: int, device: torch.device, seed: int, impls: tuple[str, ...]) -> None:
        super().__init__(capacity, device, seed)
        self.wl = SeedsBaseline(capacity, device, seed)
        self.gen = self.wl.gen
        self.impls = impls
        self.modes = ("graph", "eager") if device.type == "cuda" else ("eager",)

    @staticmethod
    def ops_of(impl: str) -> tuple[str, ...]:
        # multinomial changes only the draw: its update and add are the seeds' own
        return ("sample", "step") if impl == MULTINOMIAL else OPS

    def randomize_priorities(self) -> None:
        self.wl.randomize_priorities()

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        return _composed(self.wl, impl, name, b, self.td, self.new)


def torchrl_tree_device(device: torch.device) -> str:
    """Where TorchRL's sum tree can live next to storage on ``device``: CUDA only with a CUDA build."""
    import torchrl._torchrl as ext

    return "cuda" if device.type == "cuda" and hasattr(ext, "CudaSumSegmentTreeFp32") else "cpu"


class TorchRLPeer(Peer):
    """TorchRL's (TensorDict)PrioritizedReplayBuffer over a LazyTensorStorage on the device.

    TorchRL applies ``(priority + eps) ** alpha`` itself, so it is given ``|td|``; its IS weights
    are ``(p_i / p_min) ** -beta`` with the global minimum from its min tree, as gper's.
    """

    def __init__(self, capacity: int, device: torch.device, seed: int, td_api: bool, max_fill_s: float) -> None:
        super().__init__(capacity, device, seed)
        logging.getLogger("torchrl").setLevel(logging.WARNING)
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer

        self.TensorDict = TensorDict
        self.td_api = td_api
        self.impls = ("torchrl-td",) if td_api else ("torchrl",)
        self.tree = torchrl_tree_device(device)
        cls = TensorDictPrioritizedReplayBuffer if td_api else PrioritizedReplayBuffer
        storage = LazyTensorStorage(capacity, device=device)
        # the tree would follow a CUDA storage and refuse to be built without a CUDA wheel: say where
        self.rb = cls(alpha=ALPHA, beta=BETA, eps=EPS, storage=storage, sampler_device=self.tree)

        def add(lo: int, hi: int) -> None:
            self.rb.extend(self._tensordict(random_transitions(hi - lo, device, self.gen)))

        _fill(capacity, add, max_fill_s, f"filling TorchRL's buffer to {capacity:,} slots")
        self.randomize_priorities()

    def _tensordict(self, data: dict[str, torch.Tensor]):
        n = next(iter(data.values())).shape[0]
        return self.TensorDict(data, batch_size=[n], device=self.device)

    def randomize_priorities(self) -> None:
        for lo, hi in _chunks(self.capacity):
            idx = torch.arange(lo, hi, dtype=torch.int64)
            self.rb.update_priority(idx, random_td(hi - lo, self.device, self.gen).abs())

    def prepare(self, b: int, first: bool) -> None:
        super().prepare(b, first)
        self.new_td = self._tensordict(self.new)

    def _sample(self, b: int):
        """A PrioritizedReplayBuffer sample, its weights moved to the data's device (they come back on the tree's)."""
        data, info = self.rb.sample(b, return_info=True)
        return data, torch.as_tensor(info["priority_weight"]).to(self.device), info["index"]

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        rb, td = self.rb, self.td
        if name == "add":
            return lambda: rb.extend(self.new_td)
        if name == "step+add":
            step = self.op(impl, "step", b)
            return lambda: (rb.extend(self.new_td), step())
        if self.td_api:
            if name == "sample":
                return lambda: rb.sample(b)
            if name == "update":
                batch = rb.sample(b)

                def update():
                    batch.set("td_error", td.abs())
                    rb.update_tensordict_priority(batch)

                return update

            def step():
                batch = rb.sample(b)
                batch.set("td_error", td.abs())
                rb.update_tensordict_priority(batch)
                return batch

            return step
        if name == "sample":
            return lambda: self._sample(b)
        if name == "update":
            index = self._sample(b)[2]
            return lambda: rb.update_priority(index, td.abs())

        def step_prb():
            data, weights, index = self._sample(b)
            rb.update_priority(index, td.abs())
            return data, weights

        return step_prb


class CpprbPeer(Peer):
    """cpprb's PrioritizedReplayBuffer: numpy storage and a C++ float32 tree on the host.

    cpprb applies ``(priority + eps) ** alpha`` itself, so it is given ``|td|``; its weights are
    normalised by the global minimum priority, as gper's.
    """

    impls = ("cpprb",)

    def __init__(self, capacity: int, device: torch.device, seed: int, max_fill_s: float) -> None:
        super().__init__(capacity, device, seed)
        import numpy as np
        from cpprb import PrioritizedReplayBuffer

        self.np = np
        env = {k: {**v, "dtype": np.dtype(v["dtype"])} for k, v in CPPRB_ENV.items()}
        self.rb = PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, eps=EPS)

        def add(lo: int, hi: int) -> None:
            self.rb.add(**self._host(random_transitions(hi - lo, device, self.gen)))

        _fill(capacity, add, max_fill_s, f"filling cpprb's buffer to {capacity:,} slots")
        self.randomize_priorities()

    @staticmethod
    def _host(data: dict[str, torch.Tensor]) -> dict:
        # on a GPU this is the device-to-host copy that a host-side buffer costs
        return {k: v.cpu().numpy() for k, v in data.items()}

    def _device(self, sample: dict) -> dict:
        """cpprb's arrays as tensors on the device (a host-to-device copy of each on a GPU)."""
        sample["indexes"] = sample["indexes"].astype(self.np.int64)
        if self.device.type != "cuda":
            return sample
        return {k: torch.from_numpy(v).to(self.device) for k, v in sample.items()}

    def randomize_priorities(self) -> None:
        for lo, hi in _chunks(self.capacity):
            td = random_td(hi - lo, self.device, self.gen).abs().cpu().numpy()
            self.rb.update_priorities(self.np.arange(lo, hi), td)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        rb, td, new = self.rb, self.td, self.new
        if name == "sample":
            return lambda: self._device(rb.sample(b, beta=BETA))
        if name == "update":
            index = rb.sample(b, beta=BETA)["indexes"]
            return lambda: rb.update_priorities(index, td.abs().cpu().numpy())
        if name == "add":
            return lambda: rb.add(**self._host(new))

        def step():
            raw = rb.sample(b, beta=BETA)
            batch = self._device(dict(raw))
            rb.update_priorities(raw["indexes"], td.abs().cpu().numpy())
            return batch

        if name == "step":
            return step
        return lambda: (rb.add(**self._host(new)), step())


# ----------------------------------------------------------------------------------------------
# flashbax, in a worker process of its own


class FlashbaxPeer(Peer):
    """flashbax's prioritised flat buffer, every call jitted, the state donated to add and set_priorities.

    The buffer is a [A, N / A] trajectory layout (A = ``add_batch_size``): an add of B transitions
    is one call adding [A, B / A] sequences, which is how flashbax takes batches. Sampling returns
    pairs (t, t+1); only the first is used, so XLA may drop the second gather (favouring flashbax).
    flashbax returns probabilities, not weights: the weights are ``(N P_i) ** -beta`` divided by
    the batch's largest, as in flashbax's own PER example (no O(N) pass; favours flashbax).
    ``set_priorities`` stores ``p ** alpha``, so it is given ``|td| + eps``.
    """

    modes = ("jit",)

    def __init__(self, capacity: int, device: torch.device, seed: int, x64: bool, batches: list[int], cfg) -> None:
        self.capacity, self.device, self.x64 = capacity, device, x64
        import jax
        import jax.numpy as jnp
        from flashbax import make_prioritised_flat_buffer

        self.jax, self.jnp = jax, jnp
        self.impls = ("flashbax-x64",) if x64 else ("flashbax",)
        self.backend = "gpu" if device.type == "cuda" else "cpu"
        self.add_batch = math.gcd(*batches, 256)
        while self.add_batch > 1 and capacity // self.add_batch < 4:
            self.add_batch //= 2
        a = self.add_batch
        self.make = lambda sample_batch: make_prioritised_flat_buffer(
            max_length=capacity,
            min_length=a,
            sample_batch_size=sample_batch,
            add_sequences=True,
            add_batch_size=a,
            priority_exponent=ALPHA,
            device=self.backend,
        )
        self.int_dtype = jnp.int64 if x64 else jnp.int32  # JAX has no int64 without x64
        example = {
            "obs": jnp.zeros(51, jnp.float32),
            "action": jnp.zeros((), self.int_dtype),
            "reward": jnp.zeros((), jnp.float32),
            "next_obs": jnp.zeros(51, jnp.float32),
            "done": jnp.zeros((), bool),
        }
        buffer = self.make(min(batches))
        self.key = jax.random.PRNGKey(seed)
        self.gen_data = jax.jit(self._random_transitions, static_argnums=1)
        self.gen_td = jax.jit(self._random_td, static_argnums=1)
        self.state = buffer.init(example)
        add = jax.jit(buffer.add, donate_argnums=0)
        per_add = min(FILL_CHUNK, capacity) // a

        def fill(lo: int, hi: int) -> None:
            self.state = add(self.state, self.gen_data(self._next_key(), per_add))
            jax.block_until_ready(self.state)

        _fill(capacity, fill, cfg.fill_limit_s(), f"filling flashbax's buffer to {capacity:,} slots")
        self.set_all = jax.jit(buffer.set_priorities, donate_argnums=0)
        self.randomize_priorities()

    def _next_key(self):
        self.key, sub = self.jax.random.split(self.key)
        return sub

    def _random_transitions(self, key, t: int) -> dict:
        jax, jnp, a = self.jax, self.jnp, self.add_batch
        k = jax.random.split(key, 5)
        return {
            "obs": jax.random.normal(k[0], (a, t, 51), jnp.float32),
            "action": jax.random.randint(k[1], (a, t), 0, 18, self.int_dtype),
            "reward": jax.random.normal(k[2], (a, t), jnp.float32),
            "next_obs": jax.random.normal(k[3], (a, t, 51), jnp.float32),
            "done": jax.random.uniform(k[4], (a, t)) < 0.05,
        }

    def _random_td(self, key, n: int):
        jax, jnp = self.jax, self.jnp
        lo, hi = TD_LOG10_RANGE
        k1, k2 = jax.random.split(key)
        mag = jnp.power(10.0, lo + (hi - lo) * jax.random.uniform(k1, (n,), jnp.float32))
        return mag * jnp.where(jax.random.bernoulli(k2, 0.5, (n,)), 1.0, -1.0).astype(jnp.float32)

    def randomize_priorities(self) -> None:
        jnp = self.jnp
        for lo, hi in _chunks(self.capacity):
            idx = jnp.arange(lo, hi, dtype=self.int_dtype)
            self.state = self.set_all(self.state, idx, jnp.abs(self.gen_td(self._next_key(), hi - lo)) + EPS)
        self.jax.block_until_ready(self.state)

    def prepare(self, b: int, first: bool) -> None:
        jax, jnp, cap = self.jax, self.jnp, self.capacity
        if not first:
            self.randomize_priorities()
        self.td = self.gen_td(self._next_key(), b)
        self.new = self.gen_data(self._next_key(), b // self.add_batch) if b % self.add_batch == 0 else None
        buffer = self.make(b)

        def sample(state, key):
            key, sub = jax.random.split(key)
            s = buffer.sample(state, sub)
            w = (s.probabilities * cap) ** -BETA
            return key, s.experience.first, w / jnp.max(w), s.indices

        def update(state, index, td):
            return buffer.set_priorities(state, index, jnp.abs(td) + EPS)

        def step(state, key, td):
            key, batch, weights, index = sample(state, key)
            return update(state, index, td), key, batch, weights

        def step_add(state, key, new, td):
            return step(buffer.add(state, new), key, td)

        def steps(state, key, td):
            # SCAN_STEPS PER steps in one compiled loop; a checksum of every sampled field keeps XLA
            # from dropping the gathers of a batch nobody reads
            def body(carry, _):
                state, key, acc = carry
                state, key, batch, weights = step(state, key, td)
                leaves = jax.tree_util.tree_leaves(batch)
                total = weights.sum() + sum(jnp.sum(x.astype(jnp.float32)) for x in leaves)
                acc = acc + total.astype(jnp.float32)  # float64 under x64: the carry keeps its type
                return (state, key, acc), None

            (state, key, acc), _ = jax.lax.scan(body, (state, key, jnp.float32(0)), None, length=SCAN_STEPS)
            return state, key, acc

        self.f_sample = jax.jit(sample)
        self.f_steps = jax.jit(steps, donate_argnums=0)
        self.f_update = jax.jit(update, donate_argnums=0)
        self.f_step = jax.jit(step, donate_argnums=0)
        self.f_add = jax.jit(buffer.add, donate_argnums=0)
        self.f_step_add = jax.jit(step_add, donate_argnums=0)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        td, new = self.td, self.new
        if name in ("add", "step+add") and new is None:
            raise Skip(f"an add of {b} must be [{self.add_batch}, {b}/{self.add_batch}] sequences")

        def sample():
            self.key, batch, weights, index = self.f_sample(self.state, self.key)
            return batch, weights

        def update():
            self.state = self.f_update(self.state, index, td)
            return self.state

        def step():
            self.state, self.key, batch, weights = self.f_step(self.state, self.key, td)
            return self.state, batch, weights

        def add():
            self.state = self.f_add(self.state, new)
            return self.state

        def step_add():
            self.state, self.key, batch, weights = self.f_step_add(self.state, self.key, new, td)
            return self.state, batch, weights

        def step_scan():
            self.state, self.key, acc = self.f_steps(self.state, self.key, td)
            return self.state, acc

        def step_split():
            self.key, batch, weights, drawn = self.f_sample(self.state, self.key)
            self.state = self.f_update(self.state, drawn, td)
            return self.state, batch, weights

        def step_add_split():
            add()
            return step_split()  # not add's state: step_split donated it

        if name == "update":
            index = self.f_sample(self.state, self.key)[3]
        if mode == "jit-split":
            return {"step": step_split, "step+add": step_add_split}[name]
        if mode == "jit-scan":
            return step_scan
        return {"sample": sample, "update": update, "step": step, "add": add, "step+add": step_add}[name]

    def modes_of(self, op: str) -> tuple[str, ...]:
        # one jitted function, as in a jitted training step; and separate jitted calls, which spare XLA the
        # copy of the tree that it makes when one function both reads it (sample) and updates it in place
        # and the step as a compiled loop (jit-scan), as a training loop written in JAX would run it
        return (
            ("jit", "jit-split", "jit-scan") if op == "step" else ("jit", "jit-split") if op == "step+add" else ("jit",)
        )

    def steps_per_call(self, mode: str) -> int:
        return SCAN_STEPS if mode == "jit-scan" else 1

    def sync(self, out: object) -> None:
        self.jax.block_until_ready(out)

    def time(self, fn: Callable[[], object], warmup: int, iters: int, repeats: int) -> Timing:
        return time_sync(fn, self.sync, warmup, iters, repeats)


def jax_versions(x64: bool) -> str:
    import jax

    dev = jax.devices()[0]
    return (
        f"flashbax {_version('flashbax')}, jax {jax.__version__} on {jax.default_backend()} "
        f"({getattr(dev, 'device_kind', dev.platform)}){', x64' if x64 else ''}"
    )


# ----------------------------------------------------------------------------------------------
# the sweep


def run_group(cfg: PeersConfig, cap: int, build: Callable[[], Peer], impls: tuple[str, ...], ops_of) -> list[Row]:
    """Build one peer's buffer at capacity ``cap`` and time every op at every batch size on it."""
    batches = [b for b in cfg.batches if b <= cap]
    plan = [(b, i, op) for b in batches for i in impls for op in cfg.ops if op in ops_of(i)]
    t0 = time.perf_counter()
    peer, why, status = None, "", ""
    try:
        cfg.check_deadline()
        peer = build()
        synchronize(cfg.device)
    except Skip as e:
        status, why = "skipped", str(e)
    except Exception as e:
        status = "oom" if _is_oom(e) else "error"
        why = f"{type(e).__name__}: {_first_line(e)}"
    if peer is None:
        _free(cfg.device)
        log(f"  {', '.join(impls)} at {format_capacity(cap)}: {status}: {why}")
        return [Row(i, op, cap, b, _plain_mode(i), status=status, note=why) for b, i, op in plan]
    log(f"  {', '.join(impls)}: filled {cap:,} slots in {time.perf_counter() - t0:.1f} s")
    rows: list[Row] = []
    try:
        for n, b in enumerate(batches):
            t0 = time.perf_counter()
            try:
                peer.prepare(b, first=n == 0)
            except Exception as e:
                status = "oom" if _is_oom(e) else "error"
                _free(cfg.device)
                note = f"{type(e).__name__}: {_first_line(e)}"
                rows += [Row(i, op, cap, bb, _plain_mode(i), status=status, note=note) for bb, i, op in plan if bb == b]
                continue
            for impl in peer.impls:
                for op in (op for op in cfg.ops if op in peer.ops_of(impl)):
                    for mode in peer.modes_of(op):
                        rows.append(_cell(cfg, peer, impl, op, cap, b, mode))
            log(f"    batch {b}: {time.perf_counter() - t0:.1f} s")
    finally:
        peer.close()
        del peer
        _free(cfg.device)
    return rows


def _plain_mode(impl: str) -> str:
    """How ``impl`` is called when nothing else is said: the mode a row that never ran is filed under."""
    return "jit" if impl in JAX_PEERS else "eager"


def _cell(cfg: PeersConfig, peer: Peer, impl: str, op: str, cap: int, b: int, mode: str) -> Row:
    row = Row(impl, op, cap, b, mode)
    try:
        cfg.check_deadline()
        t = measure(cfg, peer, peer.op(impl, op, b, mode), mode)
        k = peer.steps_per_call(mode)
        if k > 1:
            t = dataclasses.replace(
                t,
                median_us=t.median_us / k,
                min_us=t.min_us / k,
                max_us=t.max_us / k,
                samples_us=tuple(x / k for x in t.samples_us),
            )
    except Skip as e:
        row.status, row.note = "skipped", str(e)
    except Exception as e:
        row.status = "oom" if _is_oom(e) else "error"
        row.note = f"{type(e).__name__}: {_first_line(e)}"
    else:
        row.median_us, row.min_us, row.max_us = t.median_us, t.min_us, t.max_us
        row.iters, row.repeats = t.iters, t.repeats
        return row
    log(f"    {row.status}: {impl} {op} {format_capacity(cap)} B={b} {mode}: {row.note}")
    _free(cfg.device)
    return row


def in_process_group(cfg: PeersConfig, peer: str, cap: int, ours: str) -> tuple[Callable[[], Peer], tuple, Callable]:
    """One in-process peer at capacity ``cap``: (build its filled buffer, its impls, the ops of each impl)."""
    dev, seed = cfg.device, cfg.seed
    if peer == "gper":
        return (lambda: GperPeer(cap, dev, seed)), (ours,), Peer.ops_of
    if peer in ("seeds", "multinomial"):
        impls = tuple(i for p, i in (("seeds", SEEDS), ("multinomial", MULTINOMIAL)) if p in cfg.peers)
        return (lambda: SeedsPeer(cap, dev, seed, impls)), impls, SeedsPeer.ops_of
    if peer in ("torchrl", "torchrl-td"):
        build = lambda: TorchRLPeer(cap, dev, seed, peer == "torchrl-td", cfg.fill_limit_s())
        return build, (peer,), Peer.ops_of
    if peer == "cpprb":
        return (lambda: CpprbPeer(cap, dev, seed, cfg.fill_limit_s())), ("cpprb",), Peer.ops_of
    raise ValueError(f"{peer!r} does not run in this process")


def gper_impl(device: torch.device) -> str:
    """``gper-triton`` on CUDA, ``gper-torch`` on the CPU: what ``backend="auto"`` picks."""
    from gper import PrioritizedReplayBuffer

    probe = PrioritizedReplayBuffer(1, {"x": ((), torch.uint8)}, device=device, cpu_fallback=False)
    return f"gper-{probe.backend}"


def run(cfg: PeersConfig) -> tuple[list[Row], dict]:
    """Run every peer over every capacity; write and print the results. Returns (rows, report info)."""
    if cfg.device.type == "cuda":
        torch.cuda.set_device(cfg.device)
    env = environment(cfg.device)
    versions, absent = {}, {}
    for peer in cfg.peers:
        ok, text = peer_status(peer, cfg.device)
        (versions if ok else absent)[peer] = text
        if not ok:
            log(f"skipping {peer}: {text}")
    cfg.peers = [p for p in cfg.peers if p in versions]
    files = ResultPaths(cfg.out, env) if cfg.out is not None else None
    log(header_line(env, "peers"))
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    rows: list[Row] = []
    ours = gper_impl(cfg.device)
    for peer in cfg.peers:
        if peer in JAX_PEERS:
            got, text = run_worker(cfg, peer)
            rows += got
            versions[peer] = text or versions[peer]
        elif peer == "multinomial" and "seeds" in cfg.peers:
            continue  # timed with the seeds, on the same arrays
        else:
            for cap in cfg.capacities:
                log(f"{peer} at capacity {format_capacity(cap)} ({cap:,})")
                rows += run_group(cfg, cap, *in_process_group(cfg, peer, cap, ours))
                if files:
                    files.write_csv(rows)
        if files:
            files.write_csv(rows)
    add_ratios(rows)
    rows.sort(key=Row.key)
    if hasattr(os, "getloadavg"):
        cfg.load = f"{load0:.1f} and {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    report = make_report(cfg, env, versions, absent, rows)
    print(report["text"])
    for title, table in report["tables"]:
        print()
        print_table(*table, title=title)
    if files:
        files.write_csv(rows)
        files.md.write_text(report["markdown"], encoding="utf-8")
        if cfg.plot and plot(rows, files.png, header_line(env, "peers")):
            log(f"wrote {files.png}")
        log(f"wrote {files.csv} and {files.md}")
    return rows, {"env": env, "versions": versions, "absent": absent, "files": files}


def run_worker(cfg: PeersConfig, peer: str) -> tuple[list[Row], str]:
    """Run a JAX peer over every capacity in a subprocess; rows it could not reach are marked skipped."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--worker-out", str(out)]
        cmd += ["--device", cfg.device.type, "--capacities", *[_size_arg(c) for c in cfg.capacities]]
        cmd += ["--batches", *map(str, cfg.batches), "--ops", *cfg.ops, "--repeats", str(cfg.repeats)]
        cmd += ["--warmup", str(cfg.warmup), "--target-ms", str(cfg.target_ms), "--max-call-s", str(cfg.max_call_s)]
        cmd += ["--max-cell-s", str(cfg.max_cell_s), "--max-fill-s", str(cfg.max_fill_s), "--seed", str(cfg.seed)]
        cmd += ["--threads", str(torch.get_num_threads())]
        timeout = cfg.worker_timeout_s
        if cfg.deadline is not None:  # the worker stops starting work at the same deadline; a margin to report
            cmd += ["--deadline-s", f"{max(cfg.left_s(), 0.0):.1f}"]
            timeout = min(timeout, max(cfg.left_s(), 0.0) + 60)
        env = dict(os.environ)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU to torch as well
        if cfg.device.type != "cuda":
            env["JAX_PLATFORMS"] = "cpu"
        src = str(Path(__file__).resolve().parents[1] / "src")
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        _free(cfg.device)
        log(f"{peer}: in a subprocess")
        why = ""
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout)
            if proc.returncode:
                why = f"the {peer} worker exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            why = f"the {peer} worker ran past its time limit ({timeout:.0f} s)"
        done = json.loads(out.read_text()) if out.exists() else {"rows": [], "versions": ""}
    rows = [Row(**r) for r in done["rows"]]
    seen = {(r.capacity, r.batch, r.op) for r in rows}
    for cap in cfg.capacities:
        for b in (b for b in cfg.batches if b <= cap):
            for op in cfg.ops:
                if (cap, b, op) not in seen:
                    rows.append(Row(peer, op, cap, b, "jit", status="skipped", note=why or "not reached"))
    if why:
        log(why)
    return rows, done.get("versions", "")


def _size_arg(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


def worker_main(cfg: PeersConfig, peer: str, out: Path) -> int:
    """The subprocess side of :func:`run_worker`: time one JAX peer, writing its rows after each capacity."""
    x64 = peer == "flashbax-x64"
    import jax

    if x64:
        jax.config.update("jax_enable_x64", True)
    want = "gpu" if cfg.device.type == "cuda" else "cpu"
    done = {"rows": [], "versions": ""}
    try:
        if jax.default_backend() != want:
            raise RuntimeError(f"JAX runs on {jax.default_backend()}, not {want}")
        done["versions"] = jax_versions(x64)
    except Exception as e:
        note = f"{type(e).__name__}: {_first_line(e)}"
        cells = [(c, b, op) for c in cfg.capacities for b in cfg.batches if b <= c for op in cfg.ops]
        done["rows"] = [asdict(Row(peer, op, c, b, "jit", status="error", note=note)) for c, b, op in cells]
        out.write_text(json.dumps(done))
        log(f"{peer}: {note}")
        return 0
    for cap in cfg.capacities:
        log(f"{peer} at capacity {format_capacity(cap)} ({cap:,})")
        build = partial(FlashbaxPeer, cap, cfg.device, cfg.seed, x64, cfg.batches, cfg)
        done["rows"] += [asdict(r) for r in run_group(cfg, cap, build, (peer,), Peer.ops_of)]
        out.write_text(json.dumps(done))
        jax.clear_caches()
    return 0


# ----------------------------------------------------------------------------------------------
# report


def add_ratios(rows: list[Row]) -> None:
    """Each row's median over gper's (eager and graph) for the same op and size: how many times slower."""
    ours = {(r.op, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.impl.startswith("gper") and r.median_us}
    for r in rows:
        if r.median_us is None:
            continue
        for mode in ("eager", "graph"):
            base = ours.get((r.op, r.capacity, r.batch, mode))
            setattr(r, f"x_gper_{mode}", r.median_us / base if base else None)


class ResultPaths:
    """``peers-<device>-<stamp>.{csv,md,png}`` in ``out``."""

    def __init__(self, out: Path, env: dict[str, str]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"peers-{env['slug']}-{env['stamp']}"
        self.csv, self.md, self.png = (stem.with_suffix(s) for s in (".csv", ".md", ".png"))

    def write_csv(self, rows: list[Row]) -> None:
        add_ratios(rows)
        with open(self.csv, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for r in sorted(rows, key=Row.key):
                d = asdict(r)
                for k in ("median_us", "min_us", "max_us"):
                    d[k] = None if d[k] is None else round(d[k], 3)
                for k in ("x_gper_eager", "x_gper_graph"):
                    d[k] = None if d[k] is None else round(d[k], 3)
                w.writerow({k: "" if d[k] is None else d[k] for k in COLUMNS})


def _us(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def _times(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}x" if x >= 100 else f"{x:.1f}x" if x >= 0.1 else f"{x:.2g}x"


def _label(impl: str, mode: str) -> str:
    """``impl`` alone where it is called one way only, else with its mode."""
    if mode in ("graph", "jit-split", "jit-scan") or impl.startswith("gper") or impl in (SEEDS, MULTINOMIAL):
        return f"{impl} {mode}"
    return impl


def summary(rows: list[Row], op: str) -> tuple[list[str], list[list[str]], list[bool]] | None:
    """One line per (capacity, batch) with ``op``'s median for every implementation and mode, in µs."""
    cells = {(r.capacity, r.batch, r.impl, r.mode): r for r in rows if r.op == op}
    if not cells:
        return None
    cols = sorted({(r.impl, r.mode) for r in cells.values()}, key=lambda c: Row(c[0], op, 0, 0, c[1]).key())
    headers = ["capacity", "batch"] + [_label(i, m) for i, m in cols]
    lines = []
    for cap, b in sorted({(k[0], k[1]) for k in cells}):
        line = [format_capacity(cap), str(b)]
        for impl, mode in cols:
            r = cells.get((cap, b, impl, mode))
            line.append("" if r is None else _us(r.median_us) if r.median_us is not None else r.status)
        lines.append(line)
    return headers, lines, [False] + [True] * (len(headers) - 1)


def headline(rows: list[Row], device: torch.device) -> tuple[str, tuple] | None:
    """gper's step against each peer's at 2^24 (or the largest capacity measured), at the largest and smallest batch.

    Each peer is taken in its fastest way of calling one step (for flashbax, the better of one
    jitted step and separate jitted calls), and, where it ran, as a compiled loop of steps too
    (flashbax's jit-scan): a line each. Where gper ran as a graph too, both ratios are given, and
    on CUDA the issue's targets beside them (they were set for the H200 at 2^24).
    """
    step = {(r.impl, r.capacity, r.batch, r.mode): r.median_us for r in rows if r.op == "step" and r.median_us}
    caps = sorted({c for _, c, _, _ in step})
    if not caps:
        return None
    cap = 2**24 if 2**24 in caps else caps[-1]
    ours = next((i for i, c, _, _ in step if i.startswith("gper") and c == cap), None)
    batches = sorted({b for i, c, b, _ in step if c == cap and i == ours}, reverse=True)
    if ours is None or not batches:
        return None
    batches = list(dict.fromkeys((batches[0], batches[-1])))
    graph = any(m == "graph" for i, c, _, m in step if i == ours and c == cap)
    g = {(b, m): step.get((ours, cap, b, m)) for b in batches for m in ("graph", "eager")}
    peers = sorted({i for i, c, _, _ in step if c == cap and not i.startswith("gper")}, key=IMPL_ORDER.index)
    targets = device.type == "cuda" and graph
    headers = ["peer", "batch", "peer us"] + (["gper graph us", "peer / gper graph"] if graph else [])
    headers += ["gper eager us", "peer / gper eager"] + (["target graph / eager"] if targets else [])
    lines = []
    for p in peers:
        for b in batches:
            ways = {m: v for (i, c, bb, m), v in step.items() if (i, c, bb) == (p, cap, b) and m != "graph"}
            per_call = {m: v for m, v in ways.items() if m != "jit-scan"}
            best = [min(per_call.items(), key=lambda kv: kv[1])] if per_call else []
            best += [("jit-scan", ways["jit-scan"])] if "jit-scan" in ways else []
            for mode, t in best:
                lines.append(_headline_line(p, b, mode, t, g, graph, targets))
    if not lines:
        return None
    title = (
        f"step (sample + update) at {format_capacity(cap)}: peer's time over gper's ({ours}); above 1, gper is faster"
    )
    return title, (headers, lines, [False] + [True] * (len(headers) - 1))


def _headline_line(p: str, b: int, mode: str, t: float, g: dict, graph: bool, targets: bool) -> list[str]:
    """One headline row: peer ``p`` at batch ``b`` called as ``mode`` (``t`` us) against gper's graph and eager."""
    gg, ge = g.get((b, "graph")), g.get((b, "eager"))
    rg, re = (t / gg if gg else None), (t / ge if ge else None)
    line = [p if mode in ("eager", "jit") else f"{p} ({mode})", str(b), _us(t)]
    line += [_us(gg), _times(rg)] if graph else []
    line += [_us(ge), _times(re)]
    if targets:
        fam = "flashbax" if p.startswith("flashbax") else "torchrl" if p.startswith("torchrl") else None
        tg, te = TARGETS.get((fam, b, "graph")), TARGETS.get((fam, b, "eager"))
        line.append(" / ".join(f"{x}x {_met(v, x)}" if x else "-" for v, x in ((rg, tg), (re, te))))
    return line


def _met(ratio: float | None, target: int) -> str:
    return "?" if ratio is None else "met" if ratio >= target else "NOT met"


def make_report(cfg: PeersConfig, env: dict, versions: dict, absent: dict, rows: list[Row]) -> dict:
    head = header_line(env, "peers")
    peers_line = "Peers: " + "; ".join(f"{p}: {v}" for p, v in versions.items())
    if absent:
        peers_line += ". Skipped: " + "; ".join(f"{p} ({why})" for p, why in absent.items())
    cuda = cfg.device.type == "cuda"
    clock = "CUDA events for torch, wall time closed by block_until_ready for JAX" if cuda else "wall time"
    settings = (
        f"Median of up to {cfg.repeats} repeats, each the mean of enough back-to-back calls to last about "
        f"{cfg.target_ms:g} ms ({clock}), after warm-up calls. Buffers filled to capacity, priorities from "
        "log-uniform TD errors (1e-3..1e2), alpha 0.6, beta 0.4, eps 1e-6. eager = plain calls; "
        "graph = replays of one captured CUDA graph; jit = calls of jitted JAX functions, state donated. "
        "Peers' results are on the device and their transfers are counted (host-side trees and storage). "
        "x_gper_eager / x_gper_graph = this median over gper's for the same op and size (above 1: slower than gper). "
        "flashbax and the seeds normalise IS weights by the batch's largest (no O(N) pass); gper, TorchRL and cpprb "
        "by the global minimum priority. flashbax stores action as int32 without x64 (JAX has no int64 then)."
    )
    if not cuda:
        settings += (
            f" Ran on the CPU with {torch.get_num_threads()} torch thread(s): gper's torch back end; "
            "no CUDA graphs; nothing is transferred."
        )
        if cfg.load:
            settings += f" Load average of the machine at the start and end: {cfg.load}."
    tables = []
    for op, title in (("step", "step = sample + update_priorities, us"), ("step+add", "step+add = add + step, us")):
        s = summary(rows, op)
        if s:
            tables.append((title, s))
    h = headline(rows, cfg.device)
    if h:
        tables.append(h)
    full = _all_rows(rows)
    command = cfg.command or " ".join(sys.argv)
    md = [f"# {head}", "", peers_line, "", settings, "", f"Command: `{command}`", ""]
    for title, table in tables:
        md += [f"## {title}", "", format_markdown(*table), ""]
    notes = [f"- **{p}**: {WHERE_TIME_GOES[k]}" for p, k in _where_keys(versions)]
    if notes:
        md += ["## Where each peer's time goes (from its source)", "", *notes, ""]
    md += [f"![time per PER step](peers-{env['slug']}-{env['stamp']}.png)", "", "## All rows", ""]
    md += [format_markdown(*full), ""]
    return {
        "text": f"{head}\n{peers_line}\n{settings}",
        "tables": [("all rows", full), *tables],  # printed in this order: the summaries end the output
        "markdown": "\n".join(md),
    }


def _where_keys(versions: dict) -> list[tuple[str, str]]:
    keys = {"seeds": SEEDS, "multinomial": MULTINOMIAL}
    return [(p, keys.get(p, p)) for p in versions if keys.get(p, p) in WHERE_TIME_GOES]


def _all_rows(rows: list[Row]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["impl", "op", "capacity", "batch", "mode", "median_us", "x_gper_eager", "x_gper_graph", "note"]
    lines = [
        [
            r.impl,
            r.op,
            format_capacity(r.capacity),
            str(r.batch),
            r.mode,
            _us(r.median_us) if r.median_us is not None else r.status,
            _times(r.x_gper_eager),
            _times(r.x_gper_graph),
            r.note,
        ]
        for r in rows
    ]
    return headers, lines, [False, False, True, True, False, True, True, True, False]


def plot(rows: list[Row], path: Path, title: str) -> bool:
    """Time per PER step against capacity, log-log, a line per implementation and mode, a panel per batch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return False
    step = [r for r in rows if r.op == "step" and r.median_us is not None]
    batches = sorted({r.batch for r in step})
    if not batches:
        return False
    fig, axes = plt.subplots(1, len(batches), figsize=(6.5 * len(batches), 5), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        lines = sorted(
            {(r.impl, r.mode) for r in step if r.batch == b}, key=lambda c: Row(c[0], "step", 0, 0, c[1]).key()
        )
        colors = plt.get_cmap("tab20").colors  # up to 13 lines on a GPU: more than the default cycle's 10
        for n, (impl, mode) in enumerate(lines):
            pts = sorted((r.capacity, r.median_us) for r in step if r.batch == b and (r.impl, r.mode) == (impl, mode))
            style = "-" if impl.startswith("gper") else "--"
            ax.plot(
                [c for c, _ in pts],
                [t for _, t in pts],
                style,
                color=colors[n % len(colors)],
                marker="os^vD"[n % 5],
                label=_label(impl, mode),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("capacity (slots)")
        ax.set_ylabel("time per PER step (sample + update), us")
        ax.set_title(f"batch {b}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------------
# command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument(
        "--capacities",
        nargs="+",
        metavar="N",
        help="log2 sizes (or 2^k, or slot counts above 40); default CUDA: 16 20 24 25, CPU: 16 20",
    )
    p.add_argument("--batches", nargs="+", metavar="B", help="batch sizes (default 256 16384)")
    p.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS), help="what to time (default all)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="which calls to time (default all)")
    p.add_argument("--repeats", type=int, help="timed repeats per cell, the median is reported (default CUDA 7, CPU 5)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per cell (default 3)")
    p.add_argument("--target-ms", type=float, default=20.0, help="length of a repeat (default 20 ms)")
    p.add_argument("--max-call-s", type=float, default=2.0, help="skip a cell whose single call takes longer (2 s)")
    p.add_argument("--max-cell-s", type=float, default=4.0, help="fewer repeats past this many seconds per cell (4)")
    p.add_argument("--max-fill-s", type=float, default=180.0, help="skip a capacity whose fill would take longer")
    p.add_argument("--worker-timeout-s", type=float, default=1500.0, help="limit for each JAX peer's subprocess")
    p.add_argument(
        "--deadline-s",
        type=float,
        help="start no fill or cell after this many seconds: the rest is recorded as skipped and the report "
        "is written (for a machine lent for a fixed time)",
    )
    p.add_argument("--out", default="benchmarks/results", help="results directory (default benchmarks/results)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        help="torch's intra-op threads (default: torch's choice); 1 keeps a busy shared CPU from stalling "
        "torch's parallel kernels",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer sizes and repeats")
    p.add_argument("--worker", choices=JAX_PEERS, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> PeersConfig:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_peers: --device cuda, but torch sees no CUDA GPU")
    if device.type == "cuda" and device.index is None and not args.worker:
        device = torch.device("cuda", torch.cuda.current_device())
    caps, batches, repeats = DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    try:
        capacities = parse_sizes(args.capacities, 40) if args.capacities else [2**k for k in caps]
        batch_sizes = parse_sizes(args.batches, None) if args.batches else list(batches)
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"bench_peers: {e}") from None
    return PeersConfig(
        capacities=capacities,
        batches=batch_sizes,
        device=device,
        peers=list(dict.fromkeys(args.peers)),
        ops=[op for op in OPS if op in args.ops],
        repeats=args.repeats or repeats,
        warmup=args.warmup,
        target_ms=args.target_ms,
        max_call_s=args.max_call_s,
        max_cell_s=args.max_cell_s,
        max_fill_s=args.max_fill_s,
        worker_timeout_s=args.worker_timeout_s,
        deadline=None if args.deadline_s is None else time.monotonic() + args.deadline_s,
        out=Path(args.out),
        plot=not args.no_plot,
        seed=args.seed,
        command="python " + " ".join(sys.argv),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    if args.worker:
        return worker_main(cfg, args.worker, args.worker_out)
    rows, _ = run(cfg)
    return 1 if any(r.status == "error" and r.impl.startswith("gper") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
