"""The replay benchmark's workload: the user's transition spec, random data, and the things timed.

Three implementations serve the same calls on the same data:

* ``gper-<backend>``: :class:`gper.PrioritizedReplayBuffer` (K-ary sum tree, one fused sampling
  kernel on the Triton back end).
* ``seeds-cumsum``: the design of the project's seed notes, a flat ``[N]`` float32 priority
  array where every ``sample`` runs ``cumsum`` over all N priorities, ``searchsorted`` of B
  uniforms scaled by the total, then a gather of each field and the IS weights; an update is an
  ``index_put`` of new priorities (the next sample redoes the cumsum). O(N) per step.
* ``torch-multinomial``: the same flat array sampled with ``torch.multinomial`` (which refuses
  more than 2^24 categories).

Everything is generated on the device, in chunks, so filling 2^25 slots needs no host memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from gper import PrioritizedReplayBuffer

#: the user's transition: a 51-float observation, a discrete action, reward, next observation, done
SPEC: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "obs": ((51,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
    "next_obs": ((51,), torch.float32),
    "done": ((), torch.bool),
}
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
#: TD errors are drawn log-uniformly over these powers of ten (so priorities span 10^3 after alpha)
TD_LOG10_RANGE = (-3.0, 2.0)
#: slots generated per chunk while filling (about 430 MiB of transitions at a time)
FILL_CHUNK = 2**20

OPS = ("sample", "update", "step", "add")
GPER, SEEDS, MULTINOMIAL = "gper", "seeds-cumsum", "torch-multinomial"
#: the ops each baseline is timed on; multinomial's update and add are the seeds' own
BASELINE_OPS = {SEEDS: OPS, MULTINOMIAL: ("sample", "step")}


def ops_of(impl: str) -> tuple[str, ...]:
    """The ops timed for ``impl`` (gper and the seeds: all of :data:`OPS`)."""
    return BASELINE_OPS.get(impl, OPS)


def random_transitions(
    n: int, device: torch.device | str, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """``n`` random transitions of :data:`SPEC` on ``device`` (never zeros: they hide bugs)."""
    kw = {"device": device, "generator": generator}
    return {
        "obs": torch.randn(n, 51, **kw),
        "action": torch.randint(0, 18, (n,), **kw),
        "reward": torch.randn(n, **kw),
        "next_obs": torch.randn(n, 51, **kw),
        "done": torch.rand(n, **kw) < 0.05,
    }


def random_td(n: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """[n] float32 TD errors with random signs and log-uniform magnitudes over :data:`TD_LOG10_RANGE`."""
    lo, hi = TD_LOG10_RANGE
    mag = torch.pow(10.0, lo + (hi - lo) * torch.rand(n, device=device, generator=generator))
    sign = torch.randint(0, 2, (n,), device=device, generator=generator) * 2 - 1
    return mag * sign


def _chunks(n: int, size: int = FILL_CHUNK) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


class GperWorkload:
    """A full :class:`~gper.PrioritizedReplayBuffer` of random transitions with random priorities.

    Args:
        capacity: slots; the buffer is filled to capacity.
        device: where it lives (no CPU fallback: running out of memory raises).
        backend: "auto", "triton" or "torch".
        seed: seeds the buffer's sampler and the data.
    """

    def __init__(self, capacity: int, device: torch.device, backend: str, seed: int = 0) -> None:
        self.rb = PrioritizedReplayBuffer(
            capacity,
            SPEC,
            alpha=ALPHA,
            beta=BETA,
            eps=EPS,
            device=device,
            backend=backend,
            seed=seed,
            cpu_fallback=False,
        )
        self.impls = (f"{GPER}-{self.rb.backend}",)
        self.capacity = capacity
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        for lo, hi in _chunks(capacity):
            self.rb.add(random_transitions(hi - lo, device, self.gen))
        self.randomize_priorities()

    def randomize_priorities(self) -> None:
        """Give every slot the priority of a random TD error (the tree is then far from uniform)."""
        for lo, hi in _chunks(self.rb.capacity):
            idx = torch.arange(lo, hi, device=self.device, dtype=torch.int64)
            self.rb.update_priorities(idx, random_td(hi - lo, self.device, self.gen))

    def op(self, impl: str, name: str, b: int, td: torch.Tensor, new: dict[str, torch.Tensor]) -> Callable[[], object]:
        """The zero-argument call that times op ``name`` at batch ``b`` (drawn fresh for "update").

        Args:
            impl: one of :attr:`impls`.
            name: "sample", "update", "step" (sample then update) or "add".
            b: batch size.
            td: [b] float32 TD errors on the device, reused by every update.
            new: b transitions on the device, reused by every add.
        """
        rb = self.rb
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
        raise ValueError(f"unknown op {name!r}")


class SeedsBaseline:
    """The seeds' O(N) design: one ``[N]`` float32 priority array, fields in separate arrays.

    Serves two implementations: ``seeds-cumsum`` (cumsum + searchsorted) and
    ``torch-multinomial``. New items enter at the running max priority, as in gper; the write
    cursor is a host integer and an add is one device-to-device copy per field (two where it
    wraps), as in the seeds. Replays of a captured add therefore rewrite the same slots, which
    costs the same.

    Args:
        capacity: slots, filled to capacity.
        device: where the arrays live.
        seed: seeds the data (sampling uses torch's default generator, which graphs can capture).
    """

    def __init__(self, capacity: int, device: torch.device, seed: int = 0) -> None:
        self.capacity = capacity
        self.device = device
        self.impls = (SEEDS, MULTINOMIAL)
        self.fields = {
            name: torch.empty((capacity, *shape), dtype=dtype, device=device) for name, (shape, dtype) in SPEC.items()
        }
        self.prio = torch.empty(capacity, dtype=torch.float32, device=device)  # [N] (|td| + eps) ** alpha
        self.maxp = torch.ones((), dtype=torch.float32, device=device)
        self.cursor = 0
        self.gen = torch.Generator(device=device).manual_seed(seed)
        for lo, hi in _chunks(capacity):
            for name, x in random_transitions(hi - lo, device, self.gen).items():
                self.fields[name][lo:hi] = x
        self.randomize_priorities()

    def randomize_priorities(self) -> None:
        for lo, hi in _chunks(self.capacity):
            self.prio[lo:hi] = (random_td(hi - lo, self.device, self.gen).abs() + EPS).pow(ALPHA)
        self.maxp.copy_(self.prio.amax())

    def _gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {name: x[idx] for name, x in self.fields.items()}
        # w_i = (N * p_i / total) ** -beta; divided by the batch's largest weight this is
        # (p_i / min_j p_j) ** -beta: no O(N) pass for the global minimum (favours the baseline)
        p = self.prio[idx]
        out["weights"] = (p / p.amin()).pow(-BETA)
        out["indices"] = idx
        return out

    def sample_cumsum(self, b: int) -> dict[str, torch.Tensor]:
        """Inverse CDF: cumsum over all N priorities, then a binary search per draw."""
        cdf = torch.cumsum(self.prio, 0)
        u = torch.rand(b, device=self.device) * cdf[-1]
        idx = torch.searchsorted(cdf, u, right=True).clamp_max_(self.capacity - 1)
        return self._gather(idx)

    def sample_multinomial(self, b: int) -> dict[str, torch.Tensor]:
        return self._gather(torch.multinomial(self.prio, b, replacement=True))

    def update(self, idx: torch.Tensor, td: torch.Tensor) -> None:
        p = (td.abs() + EPS).pow(ALPHA)
        self.prio[idx] = p
        torch.maximum(self.maxp, p.amax(), out=self.maxp)

    def add(self, data: dict[str, torch.Tensor]) -> None:
        n = next(iter(data.values())).shape[0]
        lo, src = self.cursor, 0
        while src < n:
            hi = min(lo + n - src, self.capacity)
            for name, x in self.fields.items():
                x[lo:hi].copy_(data[name][src : src + hi - lo])
            self.prio[lo:hi].copy_(self.maxp.expand(hi - lo))
            src += hi - lo
            lo = hi % self.capacity
        self.cursor = (self.cursor + n) % self.capacity

    def op(self, impl: str, name: str, b: int, td: torch.Tensor, new: dict[str, torch.Tensor]) -> Callable[[], object]:
        """As :meth:`GperWorkload.op`, for ``seeds-cumsum`` or ``torch-multinomial``."""
        draw = self.sample_cumsum if impl == SEEDS else self.sample_multinomial
        if name == "sample":
            return lambda: draw(b)
        if name == "update":
            idx = draw(b)["indices"]
            return lambda: self.update(idx, td)
        if name == "step":
            return lambda: self.update(draw(b)["indices"], td)
        if name == "add":
            return lambda: self.add(new)
        raise ValueError(f"unknown op {name!r}")


def format_capacity(n: int) -> str:
    """``2^k`` for powers of two, the plain number otherwise."""
    return f"2^{int(math.log2(n))}" if n > 0 and n & (n - 1) == 0 else str(n)
