"""What every peer module provides: a timing adapter (:class:`Peer`) and an exactness sampler
(:class:`ExactSampler`), and :class:`Skip` for what is left out on purpose.

A peer module (``gper.bench.peers.<module>``, found through :data:`gper.bench.peers.MODULES`)
defines, for each registry name it serves:

* ``status(name, device) -> (ok, text)``: whether it can run here, with its versions or why not.
  It imports nothing heavy: a missing library is reported, not raised.
* ``build(impls, capacity, setting) -> Peer``: a buffer at ``capacity`` that serves the
  implementation ids ``impls`` (as they appear in result rows), filled with random transitions
  of the reference workload and random priorities (timing).
* ``sampler(name, device) -> ExactSampler``: its sampler over given priorities (exactness; the
  trajectory workload's peers have none: they draw from the trees their flat counterparts check).
* ``WHERE_TIME_GOES``: name -> one line on where its time goes, for the peers report.
* optionally ``ops_of(impl)``: the ops an implementation is timed on (default all of :data:`OPS`),
  and ``ops_at(impl, b, setting)``: those of them timed at batch size ``b`` (default all).

Peer libraries are imported inside ``build`` and ``sampler`` only; when one is missing they
raise :class:`Skip` naming the ``peers`` extra (:func:`require`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gper.bench.timing import Timing, synchronize, time_fn
from gper.bench.workload import TrajectoryWorkload, random_td, random_transitions

#: every op a timing adapter of the flat workload serves (a sweep picks its own among them)
OPS = ("sample", "update", "step", "add", "step+add")
#: the ops of the trajectory workload (:class:`~gper.bench.workload.TrajectoryWorkload`): 1-step and
#: ``N_STEP``-step samples, PER steps (sample + update), ``add`` of one step of every stream (timed at
#: batch ``num_envs`` only) and ``sample_sequences`` (timed at batch ``seq_batch`` only)
TRAJ_OPS = ("sample-n1", "sample-n3", "step-n1", "step-n3", "add-envs", "sequences")
#: how to install the peer libraries
PEERS_EXTRA = 'pip install ".[peers]"'


class Skip(Exception):
    """A cell, a capacity or a peer left out on purpose (too slow, cannot run there): its reason is recorded."""


def require(*modules: str) -> None:
    """Raise :class:`Skip` if any of ``modules`` is not installed (without importing them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise Skip(f"{' and '.join(missing)} not installed ({PEERS_EXTRA})")


def version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Setting:
    """What a peer's buffer is built with, beyond its capacity.

    Attributes:
        device: where its data lives (peers with host-side parts move results to it).
        seed: seeds the data and, where the peer allows, its sampler.
        batches: the batch sizes that will be timed (flashbax shapes its adds from them).
        max_fill_s: a fill projected to take longer is given up (:class:`Skip`).
        deadline: ``time.monotonic()`` of the sweep's deadline, if any: a fill gets no more than what is left.
        backend: gper's kernels: "auto", "triton" or "torch".
        modes: how gper and the baselines are called ("eager", "graph"), in the order they are timed.
        traj: the trajectory workload's streams, window and sequences (its peers only).
    """

    device: torch.device
    seed: int = 0
    batches: tuple[int, ...] = ()
    max_fill_s: float = math.inf
    deadline: float | None = None
    backend: str = "auto"
    modes: tuple[str, ...] = ("eager",)
    traj: TrajectoryWorkload = TrajectoryWorkload()

    def fill_limit_s(self) -> float:
        """Seconds a fill may take from now: ``max_fill_s``, or what is left before the deadline if less."""
        left = math.inf if self.deadline is None else self.deadline - time.monotonic()
        return min(self.max_fill_s, max(left, 0.0))


def trajectory_ops_at(ops: Sequence[str], b: int, setting: Setting, add_op: str = "add-envs") -> tuple[str, ...]:
    """Those of ``ops`` timed at batch ``b``: ``add_op`` at ``num_envs`` (one step of every stream),
    ``sequences`` at ``seq_batch``, every other op at the batch sizes in ``setting.batches``."""
    w = setting.traj
    at = {add_op: b == w.num_envs, "sequences": b == w.seq_batch}
    return tuple(op for op in ops if at.get(op, b in setting.batches))


def compose_step_add(add: Callable[[], object], step: Callable[[], object]) -> Callable[[], object]:
    """``step+add``: ``add`` then ``step``."""
    return lambda: (add(), step())


class Peer:
    """A buffer of one peer at one capacity, filled and with random priorities, and the calls to time.

    Subclasses fill the buffer in ``__init__`` and define :meth:`randomize_priorities` and
    :meth:`op`; :meth:`prepare` draws each batch size's TD errors and new transitions.
    """

    impls: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("eager",)

    def __init__(self, capacity: int, setting: Setting) -> None:
        self.capacity = capacity
        self.device = setting.device
        self.gen = torch.Generator(device=setting.device).manual_seed(setting.seed)

    @staticmethod
    def ops_of(impl: str) -> tuple[str, ...]:
        """The ops timed for ``impl`` (all of :data:`OPS` unless a peer says otherwise)."""
        return OPS

    def ops_at(self, impl: str, b: int) -> tuple[str, ...]:
        """The ops timed for ``impl`` at batch size ``b`` (all of :meth:`ops_of` unless a peer says otherwise)."""
        return tuple(self.ops_of(impl))

    def modes_of(self, op: str) -> tuple[str, ...]:
        """How ``op`` is called: eagerly, and on CUDA also replayed as a graph where the peer allows it."""
        return self.modes

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
        """The zero-argument call that times op ``name`` of ``impl`` at batch ``b``, called as ``mode``."""
        raise NotImplementedError

    def steps_per_call(self, mode: str) -> int:
        """PER steps one call of ``op(..., mode)`` makes (its times are divided by this)."""
        return 1

    def sync(self, out: object) -> None:
        """Wait until the work that produced ``out`` is done."""
        synchronize(self.device)

    def time(self, fn: Callable[[], object], warmup: int, iters: int, repeats: int) -> Timing:
        return time_fn(fn, warmup=warmup, iters=iters, repeats=repeats, device=self.device)

    def close(self) -> None:
        """Drop the buffer (the caller then frees the device's cache)."""
        self.__dict__.clear()


class ExactSampler:
    """One peer's sampler over ``n`` slots. Subclasses define :meth:`load` and :meth:`draw`."""

    kind = "iid"  # or "stratified": one draw per equal-mass stratum of each batch
    max_slots: int | None = None

    def load(self, prios: np.ndarray) -> None:
        """Make a sampler over ``len(prios)`` slots with these priorities (exponent 1)."""
        raise NotImplementedError

    def draw(self, k: int):
        """Indices of one batch of ``k`` draws (a tensor or array; :meth:`count` adds them up)."""
        raise NotImplementedError

    def new_counts(self, n: int):
        return np.zeros(n, dtype=np.int64)

    def add_counts(self, counts, idx):
        counts += np.bincount(np.asarray(idx, dtype=np.int64), minlength=len(counts))
        return counts

    def finish(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=np.int64)

    def count(self, n: int, draws: int, k: int, budget_s: float) -> tuple[np.ndarray, int]:
        """Draw ``draws`` in batches of ``k`` (fewer if the budget runs out); hits per slot, draws made."""
        counts, done, t0 = self.new_counts(n), 0, time.perf_counter()
        while done < draws and (done == 0 or time.perf_counter() - t0 < budget_s):
            counts = self.add_counts(counts, self.draw(k))
            done += k
        return self.finish(counts), done


class TorchCounts(ExactSampler):
    """Counts kept on the sampler's torch device (no copy of every batch to the host)."""

    device = torch.device("cpu")

    def new_counts(self, n: int):
        return torch.zeros(n, dtype=torch.int64, device=self.device)

    def add_counts(self, counts, idx):
        return counts.index_add_(0, idx.long(), torch.ones_like(idx, dtype=torch.int64))

    def finish(self, counts) -> np.ndarray:
        return counts.cpu().numpy()


def flashbax_status(name: str, device: torch.device) -> tuple[bool, str]:
    """Whether flashbax and JAX are installed, and their versions (checked without importing JAX:
    the flashbax peers run it in a worker process)."""
    try:
        require("jax", "flashbax")
    except Skip as e:
        return False, str(e)
    return True, f"flashbax {version('flashbax')}, jax {version('jax')}, jaxlib {version('jaxlib')}"
