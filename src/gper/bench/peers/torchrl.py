"""TorchRL as a peer: its prioritized replay buffers timed on the reference workload, and its sampler.

Timing: ``torchrl`` and ``torchrl-td``, TorchRL's ``PrioritizedReplayBuffer`` and
``TensorDictPrioritizedReplayBuffer`` over a ``LazyTensorStorage`` on the device. The sum tree
lives where the installed wheel can put it: PyPI's wheels have only the C++ CPU tree, so on a
GPU the data is on the GPU and the tree on the host. Exactness: ``torchrl`` (float32 trees) and
``torchrl-fp64`` (the float64 trees it offers).

TorchRL and tensordict are imported only when used (``pip install ".[peers]"``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from gper.bench.harness import chunks, fill, first_line
from gper.bench.peers.base import ExactSampler, Peer, Setting, Skip, compose_step_add, require, version
from gper.bench.workload import ALPHA, BETA, EPS, random_td, random_transitions

NAMES = ("torchrl", "torchrl-td", "torchrl-fp64")
WHERE_TIME_GOES = {
    "torchrl": "PyPI's wheel has only C++ trees on the host. sample: B masses drawn with numpy, one single-threaded "
    "descent per sample (scan_lower_bound), then the host indices are copied to the device for the gather and the "
    "host weights after it; update: the TD errors are copied to the host (a sync) and both trees are updated one "
    "index at a time; add: the data is written on the device, the new slots marked in both trees on the host.",
    "torchrl-td": "as torchrl, plus TensorDict work: index and weights set into the sample, td_error read back out.",
}


def require_torchrl() -> None:
    require("torchrl", "tensordict")
    logging.getLogger("torchrl").setLevel(logging.WARNING)


def status(name: str, device: torch.device) -> tuple[bool, str]:
    """Installed, and its compiled extension (the sum tree) loads with this torch.

    TorchRL's prioritized sampler needs its compiled extension, which loads only with the torch
    it was built against; that is checked here so the report says why instead of failing later.
    """
    try:
        require_torchrl()
    except Skip as e:
        return False, str(e)
    return sum_tree_status(device)


def versions() -> str:
    return f"torchrl {version('torchrl')}, tensordict {version('tensordict')}"


def sum_tree_status(device: torch.device) -> tuple[bool, str]:
    """Whether TorchRL's compiled extension (its sum tree) loads with this torch, and where the tree lives."""
    try:
        tree = tree_device(device)
    except ImportError as e:
        return False, (
            f"torchrl {version('torchrl')}: its C++ extension (the sum tree) does not load with "
            f"torch {torch.__version__}: {first_line(e)}"
        )
    return True, f"{versions()}, sum tree on {tree}"


def tree_device(device: torch.device) -> str:
    """Where TorchRL's sum tree can live next to storage on ``device``: CUDA only with a CUDA build."""
    import torchrl._torchrl as ext

    return "cuda" if device.type == "cuda" and hasattr(ext, "CudaSumSegmentTreeFp32") else "cpu"


class TorchRLPrioritized(Peer):
    """What the TorchRL peers share: a TorchRL prioritized buffer ``rb`` of ``capacity`` slots."""

    def randomize_priorities(self) -> None:
        for lo, hi in chunks(self.capacity):
            idx = torch.arange(lo, hi, dtype=torch.int64)
            self.rb.update_priority(idx, random_td(hi - lo, self.device, self.gen).abs())

    def _sample(self, b: int):
        """A prioritized sample, its IS weights moved to the data's device (they come back on the tree's)."""
        data, info = self.rb.sample(b, return_info=True)
        return data, torch.as_tensor(info["priority_weight"]).to(self.device), info["index"]


class TorchRLPeer(TorchRLPrioritized):
    """TorchRL's (TensorDict)PrioritizedReplayBuffer over a LazyTensorStorage on the device.

    TorchRL applies ``(priority + eps) ** alpha`` itself, so it is given ``|td|``; its IS weights
    are ``(p_i / p_min) ** -beta`` with the global minimum from its min tree, as gper's.
    """

    def __init__(self, capacity: int, setting: Setting, td_api: bool) -> None:
        super().__init__(capacity, setting)
        fill_limit_s = setting.fill_limit_s()
        require_torchrl()
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer

        device = self.device
        self.TensorDict = TensorDict
        self.td_api = td_api
        self.impls = ("torchrl-td",) if td_api else ("torchrl",)
        self.tree = tree_device(device)
        cls = TensorDictPrioritizedReplayBuffer if td_api else PrioritizedReplayBuffer
        storage = LazyTensorStorage(capacity, device=device)
        # the tree would follow a CUDA storage and refuse to be built without a CUDA wheel: say where
        self.rb = cls(alpha=ALPHA, beta=BETA, eps=EPS, storage=storage, sampler_device=self.tree)

        def add(lo: int, hi: int) -> None:
            self.rb.extend(self._tensordict(random_transitions(hi - lo, device, self.gen)))

        fill(capacity, add, fill_limit_s, f"filling TorchRL's buffer to {capacity:,} slots")
        self.randomize_priorities()

    def _tensordict(self, data: dict[str, torch.Tensor]):
        n = next(iter(data.values())).shape[0]
        return self.TensorDict(data, batch_size=[n], device=self.device)

    def prepare(self, b: int, first: bool) -> None:
        super().prepare(b, first)
        self.new_td = self._tensordict(self.new)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        rb, td = self.rb, self.td
        if name == "add":
            return lambda: rb.extend(self.new_td)
        if name == "step+add":
            return compose_step_add(self.op(impl, "add", b), self.op(impl, "step", b))
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


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> TorchRLPeer:
    return TorchRLPeer(capacity, setting, td_api=impls == ("torchrl-td",))


class TorchRLSampler(ExactSampler):
    """TorchRL's PrioritizedReplayBuffer with its C++ CPU tree (the PyPI build), over a 1-byte field.

    ``dtype`` is the trees' (TorchRL's default float32, or the float64 it offers). A buffer with
    float64 trees cannot be filled: ``extend`` marks the new slots with a float32 default priority
    that the float64 tree refuses ("expected scalar type Double but found Float", TorchRL 0.13.3
    and 0.14.1). So for float64 the sampler is driven as the buffer drives it (``update_priority``,
    then ``sample(storage, k)``) over a storage filled by a plain buffer.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        require_torchrl()
        self.dtype = dtype

    def load(self, prios: np.ndarray) -> None:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, PrioritizedSampler, ReplayBuffer

        n = len(prios)
        self.storage = LazyTensorStorage(n, device="cpu")
        if self.dtype == torch.float64:
            self.sampler = PrioritizedSampler(n, 1.0, 0.4, 1e-12, dtype=self.dtype, device="cpu")
            writer = ReplayBuffer(storage=self.storage)
        else:
            self.sampler = None
            writer = self.rb = PrioritizedReplayBuffer(
                alpha=1.0, beta=0.4, eps=1e-12, storage=self.storage, sampler_device="cpu"
            )
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            writer.extend(TensorDict({"x": torch.zeros(hi - lo, dtype=torch.uint8)}, batch_size=[hi - lo]))
            p = torch.from_numpy(prios[lo:hi]).to(self.dtype)
            (self.sampler or self.rb).update_priority(torch.arange(lo, hi), p)

    def draw(self, k: int):
        if self.sampler is not None:
            return self.sampler.sample(self.storage, k)[0].numpy()
        return self.rb.sample(k, return_info=True)[1]["index"].numpy()


def sampler(name: str, device: torch.device) -> TorchRLSampler:
    return TorchRLSampler(torch.float64 if name == "torchrl-fp64" else torch.float32)
