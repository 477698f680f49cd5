"""cpprb as a peer: its PrioritizedReplayBuffer (C++ float32 tree, numpy storage, all on the host).

Timing: ``cpprb``, on the reference workload; on a GPU each call pays for moving its inputs to
the host and its results to the device. Exactness: ``cpprb`` (stratified sampling).

cpprb is imported only when used (``pip install ".[peers]"``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from gper.bench.harness import chunks, fill, first_line
from gper.bench.peers.base import ExactSampler, Peer, Setting, Skip, compose_step_add, require, version
from gper.bench.workload import ALPHA, BETA, EPS, random_td, random_transitions

NAMES = ("cpprb",)
#: cpprb's storage description of the reference transition (scalars get shape (1,), as cpprb stores them)
CPPRB_ENV = {
    "obs": {"shape": 51, "dtype": "float32"},
    "action": {"dtype": "int64"},
    "reward": {"dtype": "float32"},
    "next_obs": {"shape": 51, "dtype": "float32"},
    "done": {"dtype": "bool"},
}
WHERE_TIME_GOES = {
    "cpprb": "all on the host: add copies the new transitions to the host; sample is a single-threaded C++ stratified "
    "descent, numpy fancy-indexing of every field and a copy of each to the device; update copies the TD errors to "
    "the host for a serial C++ tree update.",
}


def status(name: str, device: torch.device) -> tuple[bool, str]:
    try:
        require("cpprb")
    except Skip as e:
        return False, str(e)
    try:
        import cpprb  # noqa: F401
    except ImportError as e:
        return False, f"cpprb does not import: {first_line(e)}"
    return True, f"cpprb {version('cpprb')}"


class CpprbPeer(Peer):
    """cpprb's PrioritizedReplayBuffer: numpy storage and a C++ float32 tree on the host.

    cpprb applies ``(priority + eps) ** alpha`` itself, so it is given ``|td|``; its weights are
    normalised by the global minimum priority, as gper's.
    """

    impls = ("cpprb",)

    def __init__(self, capacity: int, setting: Setting) -> None:
        super().__init__(capacity, setting)
        fill_limit_s = setting.fill_limit_s()
        require("cpprb")
        from cpprb import PrioritizedReplayBuffer

        env = {k: {**v, "dtype": np.dtype(v["dtype"])} for k, v in CPPRB_ENV.items()}
        self.rb = PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, eps=EPS)

        def add(lo: int, hi: int) -> None:
            self.rb.add(**self._host(random_transitions(hi - lo, self.device, self.gen)))

        fill(capacity, add, fill_limit_s, f"filling cpprb's buffer to {capacity:,} slots")
        self.randomize_priorities()

    @staticmethod
    def _host(data: dict[str, torch.Tensor]) -> dict:
        # on a GPU this is the device-to-host copy that a host-side buffer costs
        return {k: v.cpu().numpy() for k, v in data.items()}

    def _device(self, sample: dict) -> dict:
        """cpprb's arrays as tensors on the device (a host-to-device copy of each on a GPU)."""
        sample["indexes"] = sample["indexes"].astype(np.int64)
        if self.device.type != "cuda":
            return sample
        return {k: torch.from_numpy(v).to(self.device) for k, v in sample.items()}

    def randomize_priorities(self) -> None:
        for lo, hi in chunks(self.capacity):
            td = random_td(hi - lo, self.device, self.gen).abs().cpu().numpy()
            self.rb.update_priorities(np.arange(lo, hi), td)

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
        return compose_step_add(lambda: rb.add(**self._host(new)), step)


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> CpprbPeer:
    return CpprbPeer(capacity, setting)


class CpprbSampler(ExactSampler):
    kind = "stratified"

    def __init__(self) -> None:
        require("cpprb")

    def load(self, prios: np.ndarray) -> None:
        from cpprb import PrioritizedReplayBuffer

        n = len(prios)
        self.rb = PrioritizedReplayBuffer(n, {"x": {"dtype": np.uint8}}, alpha=1.0, eps=1e-12)
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            self.rb.add(x=np.zeros(hi - lo, dtype=np.uint8))
            self.rb.update_priorities(np.arange(lo, hi), prios[lo:hi].astype(np.float32))

    def draw(self, k: int):
        return self.rb.sample(k)["indexes"]


def sampler(name: str, device: torch.device) -> CpprbSampler:
    return CpprbSampler()
