"""gper as a peer: :class:`gper.PrioritizedReplayBuffer` timed on the reference workload, and its sampler.

Timing (``gper-triton`` on CUDA, ``gper-torch`` on the CPU): a full buffer of random transitions
with random priorities; ``sample`` gathers every field and the IS weights, ``update`` takes a
batch drawn just before and a [B] tensor of TD errors, ``step`` is sample then update of what it
drew, ``add`` writes B pre-made transitions. Each is called eagerly and, on CUDA, replayed as
one captured graph. Exactness: ``gper`` (proportional) and ``gper-stratified``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import gper
from gper.bench.harness import chunks
from gper.bench.peers.base import Peer, Setting, TorchCounts, compose_step_add
from gper.bench.workload import ALPHA, BETA, EPS, SPEC, random_td, random_transitions

NAMES = ("gper", "gper-stratified")
WHERE_TIME_GOES: dict[str, str] = {}


def impl_name(device: torch.device, backend: str = "auto") -> str:
    """``gper-triton`` or ``gper-torch``: what ``backend`` picks on ``device`` (raises if it cannot run there)."""
    probe = gper.PrioritizedReplayBuffer(1, SPEC, device=device, backend=backend, cpu_fallback=False)
    return f"gper-{probe.backend}"


def status(name: str, device: torch.device) -> tuple[bool, str]:
    if device.type == "cpu":  # the torch back end's loops there: compiled (the cpu extra: numba) or NumPy calls
        from gper.ops.tree import cpu

        return True, f"torch {torch.__version__}, {cpu.describe()}"
    return True, f"torch {torch.__version__}"


class GperPeer(Peer):
    """A full :class:`~gper.PrioritizedReplayBuffer` of random transitions with random priorities.

    Built with ``cpu_fallback=False``: running out of device memory raises instead of moving
    the buffer to the host. ``setting.backend`` picks the kernels, ``setting.modes`` how each op
    is called; the seed seeds the buffer's sampler and the data.
    """

    def __init__(self, capacity: int, setting: Setting) -> None:
        super().__init__(capacity, setting)
        self.rb = gper.PrioritizedReplayBuffer(
            capacity,
            SPEC,
            alpha=ALPHA,
            beta=BETA,
            eps=EPS,
            device=setting.device,
            backend=setting.backend,
            seed=setting.seed,
            cpu_fallback=False,
        )
        self.impls = (f"gper-{self.rb.backend}",)
        self.modes = setting.modes
        for lo, hi in chunks(capacity):
            self.rb.add(random_transitions(hi - lo, self.device, self.gen))
        self.randomize_priorities()

    def randomize_priorities(self) -> None:
        """Give every slot the priority of a random TD error (the tree is then far from uniform)."""
        for lo, hi in chunks(self.rb.capacity):
            idx = torch.arange(lo, hi, device=self.device, dtype=torch.int64)
            self.rb.update_priorities(idx, random_td(hi - lo, self.device, self.gen))

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        rb, td, new = self.rb, self.td, self.new
        if name == "sample":
            return lambda: rb.sample(b)
        if name == "update":
            # a batch drawn now, so no add since has made its slots stale (stale entries are skipped)
            batch = rb.sample(b)
            return lambda: rb.update_priorities(batch, td)
        if name == "step":
            return lambda: rb.update_priorities(rb.sample(b), td)
        if name == "add":
            return lambda: rb.add(new)
        if name == "step+add":
            return compose_step_add(self.op(impl, "add", b), self.op(impl, "step", b))
        raise ValueError(f"unknown op {name!r}")


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> GperPeer:
    return GperPeer(capacity, setting)


class GperSampler(TorchCounts):
    """gper's sampler (``proportional`` or ``stratified``) over a 1-byte field."""

    def __init__(self, device: torch.device, sampling: str) -> None:
        self.device, self.sampling = device, sampling
        self.kind = "stratified" if sampling == "stratified" else "iid"

    def load(self, prios: np.ndarray) -> None:
        n = len(prios)
        self.rb = gper.PrioritizedReplayBuffer(
            n, {"x": ((), torch.uint8)}, alpha=1.0, eps=1e-12, sampling=self.sampling, device=self.device, seed=1
        )
        p = torch.from_numpy(prios.astype(np.float32)).to(self.device)
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            self.rb.add({"x": torch.zeros(hi - lo, dtype=torch.uint8, device=self.device)})
            self.rb.update_priorities(torch.arange(lo, hi, device=self.device), p[lo:hi])

    def draw(self, k: int):
        return self.rb.sample(k).indices


def sampler(name: str, device: torch.device) -> GperSampler:
    return GperSampler(device, "stratified" if name == "gper-stratified" else "proportional")
