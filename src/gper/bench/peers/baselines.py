"""The O(N) baselines gper is measured against: the cumsum + searchsorted baseline and ``torch.multinomial``.

* ``cumsum`` (registry name ``cumsum``): a flat ``[N]`` float32 priority array where every
  ``sample`` runs ``cumsum`` over all N priorities, ``searchsorted`` of B uniforms scaled by the
  total, then a gather of each field and the IS weights; an update is an ``index_put`` of new
  priorities (the next sample redoes the cumsum). O(N) per step.
* ``torch-multinomial`` (registry name ``multinomial``): the same flat array sampled with
  ``torch.multinomial`` (which refuses more than 2^24 categories); its update and add are the
  cumsum baseline's own.

Both are timed on one set of arrays (:class:`BaselinesPeer`), and both have an exactness
sampler on a bare priority array (:class:`BaselineSampler`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from gper.bench.harness import chunks
from gper.bench.peers.base import OPS, Peer, Setting, TorchCounts, compose_step_add
from gper.bench.workload import ALPHA, BETA, EPS, SPEC, random_td, random_transitions

CUMSUM, MULTINOMIAL = "cumsum", "torch-multinomial"
NAMES = ("cumsum", "multinomial")
#: registry name -> implementation id in result rows
IMPLS = {"cumsum": CUMSUM, "multinomial": MULTINOMIAL}
#: the ops each baseline is timed on; multinomial's update and add are the cumsum baseline's own
BASELINE_OPS = {CUMSUM: OPS, MULTINOMIAL: ("sample", "step")}
WHERE_TIME_GOES = {
    "cumsum": "a cumsum over all N priorities on every sample (O(N)), then searchsorted and the gathers.",
    "multinomial": "torch.multinomial over all N priorities on every sample (O(N)); it refuses more than 2^24.",
}


def status(name: str, device: torch.device) -> tuple[bool, str]:
    return True, f"torch {torch.__version__}"


class CumsumBaseline:
    """The O(N) cumsum baseline: one ``[N]`` float32 priority array, fields in separate arrays.

    Serves two implementations: ``cumsum`` (cumsum + searchsorted) and ``torch-multinomial``.
    New items enter at the running max priority, as in gper; the write cursor is a host integer
    and an add is one device-to-device copy per field (two where it wraps). Replays of a
    captured add therefore rewrite the same slots, which costs the same.

    Args:
        capacity: slots, filled to capacity.
        device: where the arrays live.
        gen: the generator of the data (sampling uses torch's default generator, which graphs can capture).
    """

    def __init__(self, capacity: int, device: torch.device, gen: torch.Generator) -> None:
        self.capacity = capacity
        self.device = device
        self.gen = gen
        self.fields = {
            name: torch.empty((capacity, *shape), dtype=dtype, device=device) for name, (shape, dtype) in SPEC.items()
        }
        self.prio = torch.empty(capacity, dtype=torch.float32, device=device)  # [N] (|td| + eps) ** alpha
        self.maxp = torch.ones((), dtype=torch.float32, device=device)
        self.cursor = 0
        for lo, hi in chunks(capacity):
            for name, x in random_transitions(hi - lo, device, self.gen).items():
                self.fields[name][lo:hi] = x
        self.randomize_priorities()

    def randomize_priorities(self) -> None:
        for lo, hi in chunks(self.capacity):
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


class BaselinesPeer(Peer):
    """``cumsum`` and ``torch-multinomial`` (whichever ``impls`` names) on one :class:`CumsumBaseline`."""

    def __init__(self, capacity: int, setting: Setting, impls: tuple[str, ...] = (CUMSUM, MULTINOMIAL)) -> None:
        super().__init__(capacity, setting)
        self.base = CumsumBaseline(capacity, self.device, self.gen)
        self.impls = impls
        self.modes = setting.modes

    @staticmethod
    def ops_of(impl: str) -> tuple[str, ...]:
        return BASELINE_OPS.get(impl, OPS)

    def randomize_priorities(self) -> None:
        self.base.randomize_priorities()

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        base, td, new = self.base, self.td, self.new
        draw = base.sample_cumsum if impl == CUMSUM else base.sample_multinomial
        if name == "sample":
            return lambda: draw(b)
        if name == "update":
            idx = draw(b)["indices"]
            return lambda: base.update(idx, td)
        if name == "step":
            return lambda: base.update(draw(b)["indices"], td)
        if name == "add":
            return lambda: base.add(new)
        if name == "step+add":
            return compose_step_add(self.op(impl, "add", b), self.op(impl, "step", b))
        raise ValueError(f"unknown op {name!r}")


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> BaselinesPeer:
    return BaselinesPeer(capacity, setting, impls)


ops_of = BaselinesPeer.ops_of


class _BareArray(CumsumBaseline):
    """The baseline's sampling code (``sample_cumsum`` / ``sample_multinomial``) on a bare priority array."""

    def __init__(self, prio: torch.Tensor) -> None:  # no fields: the checks need indices only
        self.prio, self.capacity, self.device = prio, len(prio), prio.device

    def _gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"indices": idx}


class BaselineSampler(TorchCounts):
    def __init__(self, device: torch.device, multinomial: bool) -> None:
        self.device, self.multinomial = device, multinomial
        self.max_slots = 2**24 if multinomial else None  # torch refuses more categories

    def load(self, prios: np.ndarray) -> None:
        self.array = _BareArray(torch.from_numpy(prios.astype(np.float32)).to(self.device))

    def draw(self, k: int):
        return (self.array.sample_multinomial if self.multinomial else self.array.sample_cumsum)(k)["indices"]


def sampler(name: str, device: torch.device) -> BaselineSampler:
    return BaselineSampler(device, name == "multinomial")
