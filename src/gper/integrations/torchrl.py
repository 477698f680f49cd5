"""gper's GPU replay behind TorchRL's prioritized replay interface: TensorDicts in and out.

:class:`PrioritizedReplayBuffer` takes the names and semantics of TorchRL's
``TensorDictPrioritizedReplayBuffer`` (``torchrl.data``): ``extend``/``add`` take TensorDicts,
``sample`` returns one with ``"index"`` and the IS weights under ``"priority_weight"`` (what
TorchRL's losses, ``DQNLoss`` among them, multiply the per-sample loss by, from TorchRL 0.11), and
``update_tensordict_priority`` reads ``"index"`` and the loss's ``"td_error"`` back. Priorities
are those of PER (Schaul et al. 2016, arXiv:1511.05952) as TorchRL's ``PrioritizedSampler``
computes them: ``(|p| + eps) ** alpha`` for a written priority ``p``, and weights
``(p_i / p_min) ** -beta``.

Storage, sampling and updates are gper's (:class:`gper.PrioritizedReplayBuffer`, every field of a
transition in one row on the device); TensorDict's nested keys are flattened to gper's fields
(``("next", "observation")`` is the field ``"next.observation"``) and nested again on the way out.

Needs ``tensordict`` (``pip install ".[torchrl]"``, which brings TorchRL too); importing
:mod:`gper.integrations` does not import it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import torch

try:
    from tensordict import NonTensorData, TensorDict, TensorDictBase
except ImportError as err:
    raise ImportError('gper.integrations.torchrl needs tensordict: pip install ".[torchrl]"') from err

import gper
from gper._device import canonical_device
from gper.integrations._tensordict import KeyLayout, NestedKey, as_key, reduce_priority, show, stored_leaves
from gper.integrations._torchrl_state import TorchRLState
from gper.replay.checks import check_batch_size
from gper.replay.config import MUTABLE, ReplayConfig, with_defaults

#: TorchRL's name for the slots drawn (TensorDictReplayBuffer writes it into every sample)
INDEX_KEY = "index"
#: TorchRL's name for the write generation of each sampled slot (its generation-tracking writers
#: write it too); ``update_tensordict_priority`` skips entries whose slot was overwritten since
GENERATION_KEY = "index_generation"
#: which state of which buffer a sample was drawn from (a non-tensor int): a sample taken before
#: a load, or from another buffer, updates nothing
STATE_KEY = "gper_state"
#: how multi-element priorities (a ``td_error`` of shape [B, 1] or [B, T]) reduce to one per item
REDUCTIONS = ("max", "min", "mean", "median")
#: the rows and weights of a batch rebuilt for its priority update (which reads neither)
_NONE = torch.empty(0)


class PrioritizedReplayBuffer(TorchRLState):
    """TorchRL's ``TensorDictPrioritizedReplayBuffer``, with gper's buffer on the device inside.

    The stored keys are fixed by the first :meth:`extend`: every tensor leaf of that TensorDict,
    nested keys included, with its per-item shape and dtype (gper then allocates ``capacity``
    rows). Not stored: ``"index"``, ``"index_generation"``, ``"gper_state"``, the weight key and
    the priority key (a priority present at ``extend`` sets the new items' priorities instead, as
    in TorchRL).

    Args:
        alpha: priority exponent in [0, 1]: priority ``p`` samples with probability ∝ ``(|p| + eps) ** alpha``.
        beta: IS exponent in [0, 1]; assign :attr:`beta` to anneal it.
        capacity: slots, an int >= 1 (TorchRL's storage ``max_size``).
        batch_size: default batch of :meth:`sample` and of iteration.
        device: where the buffer and every sample live; default CUDA when available, else the CPU.
        eps: added to ``|p|`` before the exponent, > 0 (TorchRL's default).
        priority_key: where :meth:`update_tensordict_priority` (and :meth:`extend`) read priorities;
            TorchRL's losses write ``"td_error"``.
        weight_key: where :meth:`sample` writes the [B] float32 IS weights; ``"priority_weight"`` is
            what TorchRL's losses read from 0.11 on (before, TorchRL wrote ``"_weight"``, unused by its losses).
        reduction: how a priority with more than one element per item reduces: "max" (TorchRL's
            default), "min", "mean" or "median".
        sampling: gper's sampling: "proportional" (TorchRL's), "stratified", "rank" or "uniform".
        weight_norm: "global" divides by the largest weight any stored item could get, which gives
            TorchRL's ``(p_i / p_min) ** -beta``; "batch" by the batch's largest.
        seed: gper's sampler key; None draws one from torch's global generator, so
            ``torch.manual_seed`` makes runs repeat, as with TorchRL's buffers.
        backend: "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch".
        strict, cpu_fallback, rank_refresh_interval, cuda_graphs: passed to
            :class:`gper.PrioritizedReplayBuffer`.
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        capacity: int,
        batch_size: int | None = None,
        device: str | torch.device | None = None,
        eps: float = 1e-8,
        priority_key: NestedKey = "td_error",
        weight_key: NestedKey = "priority_weight",
        reduction: str = "max",
        sampling: str = "proportional",
        weight_norm: str = "global",
        seed: int | None = None,
        backend: str = "auto",
        strict: bool = False,
        cpu_fallback: bool = True,
        rank_refresh_interval: int = 100,
        cuda_graphs: bool = True,
    ) -> None:
        if seed is None:
            seed = int(torch.randint(2**62, ()))
        settings: dict[str, Any] = dict(
            alpha=alpha,
            beta=beta,
            eps=eps,
            sampling=sampling,
            weight_norm=weight_norm,
            backend=backend,
            seed=seed,
            strict=strict,
            cpu_fallback=cpu_fallback,
            rank_refresh_interval=rank_refresh_interval,
            cuda_graphs=cuda_graphs,
        )
        # every setting checked now, though the buffer is built at the first extend
        cfg = ReplayConfig.check(capacity, with_defaults("PrioritizedReplayBuffer", settings))
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self._batch_size = None if batch_size is None else check_batch_size(batch_size)
        self._priority_key, self._weight_key = as_key(priority_key), as_key(weight_key)
        self._reduction = reduction
        self._device = canonical_device(device)
        # the gper buffer's arguments, with the checked floats
        checked = dict(capacity=capacity, device=self._device, alpha=cfg.alpha, beta=cfg.beta, eps=cfg.eps)
        self._args: dict[str, Any] = settings | checked
        self._metadata = {(INDEX_KEY,), (GENERATION_KEY,), (STATE_KEY,), self._weight_key, self._priority_key}
        self._layout: KeyLayout | None = None
        self._rb: gper.PrioritizedReplayBuffer | None = None
        self._new_state()

    def _new_state(self) -> None:
        """A new state (built, emptied, loaded): samples drawn before it update nothing."""
        self._token = secrets.randbits(62)
        self._source: object = None  # the gper batch stamp of this state, set by each sample

    # ---------------------------------------------------------------- settings

    @property
    def buffer(self) -> gper.PrioritizedReplayBuffer | None:
        """The gper buffer inside (``stats()``, ``priorities(index)``); None until the first extend."""
        return self._rb

    @property
    def device(self) -> torch.device:
        return self._rb.device if self._rb is not None else self._device

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def capacity(self) -> int:
        return self._args["capacity"]

    @property
    def priority_key(self) -> tuple[str, ...]:
        return self._priority_key

    @property
    def weight_key(self) -> tuple[str, ...]:
        return self._weight_key

    @property
    def reduction(self) -> str:
        return self._reduction

    @property
    def keys(self) -> list[tuple[str, ...]] | None:
        """The stored keys (nested keys as tuples), fixed by the first extend; None before it."""
        return None if self._layout is None else self._layout.keys

    def _setting(self, name: str, value: object) -> None:
        value = MUTABLE[name](value)  # the check gper's own setter makes
        if self._rb is not None:
            setattr(self._rb, name, value)
        self._args[name] = value

    @property
    def alpha(self) -> float:
        """Priority exponent (assignable: later updates use the new value)."""
        return self._args["alpha"]

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._setting("alpha", value)

    @property
    def beta(self) -> float:
        """IS exponent of the next samples (assign it to anneal; no CUDA graph is recaptured)."""
        return self._args["beta"]

    @beta.setter
    def beta(self, value: float) -> None:
        self._setting("beta", value)

    @property
    def eps(self) -> float:
        """Offset added to ``|p|`` by later updates."""
        return self._args["eps"]

    @eps.setter
    def eps(self, value: float) -> None:
        self._setting("eps", value)

    def __len__(self) -> int:
        return 0 if self._rb is None else len(self._rb)

    def __repr__(self) -> str:
        keys = None if self._layout is None else [show(k) for k in self._layout.keys]
        return (
            f"gper.integrations.torchrl.PrioritizedReplayBuffer(capacity={self.capacity}, size={len(self)}, "
            f"batch_size={self._batch_size}, alpha={self.alpha}, beta={self.beta}, eps={self.eps}, "
            f"device={str(self.device)!r}, backend={self._rb.backend if self._rb else self._args['backend']!r}, "
            f"keys={keys})"
        )

    # ---------------------------------------------------------------- writes

    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        """Append a batch of transitions (the oldest are overwritten when full).

        New items enter at the largest priority so far, or, when the TensorDict holds the
        priority key and ``update_priority`` is not False, at their own priorities (as TorchRL).
        Unlike TorchRL, ``"index"`` is not written into the TensorDict passed (that would copy it
        to the host when the data are on the CPU and the buffer on the GPU): use the return value.

        Args:
            tensordicts: a TensorDict with one batch dimension [N], on the CPU or the buffer's device.
            update_priority: read the priority key, when present (default True).

        Returns:
            [min(N, capacity)] int64 slots written, on the buffer's device.

        Raises:
            TypeError, KeyError, ValueError: not a TensorDict of [N], keys, shapes or dtypes that
                differ from the first extend's, a non-tensor leaf, a wrong device; nothing changes then.
        """
        td, what = tensordicts, "extend()"
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"{what} takes a TensorDict, got {type(td).__name__}")
        if td.batch_dims != 1:
            raise ValueError(
                f"{what} takes a TensorDict with one batch dim [N], got {list(td.batch_size)}: reshape(-1) it"
            )
        stored = stored_leaves(td, self._metadata, what)
        layout = KeyLayout.of(stored, what) if self._layout is None else self._layout
        layout.check(stored, what)
        n = td.batch_size[0]
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        for key, value in stored.items():
            if value.device.type != "cpu" and value.device != self.device:
                raise ValueError(f"{what}: {show(key)!r} is on {value.device}, expected {self.device} or cpu")
        priority = td.get(self.priority_key, None) if update_priority is not False else None
        if priority is not None:
            priority = self._priority_vector(priority, n, what)
        if self._rb is None:  # the first extend, or the first after empty(); a bad dtype raises here
            self._rb = gper.PrioritizedReplayBuffer(spec=layout.spec(), **self._args)
            self._layout = layout
        index = self._rb.add(layout.flat(stored))
        if priority is not None:  # the last min(n, capacity) items were kept
            self._rb.update_priorities(index, priority[n - index.numel() :].to(self._rb.device))
        return index

    def add(self, data: TensorDictBase) -> torch.Tensor:
        """Append one transition: a TensorDict with batch_size []. Returns its 0-d int64 slot (on the device)."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"add() takes a TensorDict, got {type(data).__name__}")
        if data.batch_dims != 0:
            raise ValueError(f"add() takes one transition (batch_size []), got {list(data.batch_size)}: use extend()")
        return self.extend(data.unsqueeze(0))[0]

    def empty(self) -> None:
        """Drop every transition (and the device memory; the stored keys stay). The next extend
        starts a buffer afresh, with the same settings and seed."""
        self._rb = None
        self._new_state()

    # ---------------------------------------------------------------- sampling

    def _built(self, what: str) -> gper.PrioritizedReplayBuffer:
        if self._rb is None or len(self._rb) == 0:
            raise RuntimeError(f"{what}: the buffer is empty; extend() it first")
        return self._rb

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> TensorDict | tuple[TensorDict, dict]:
        """Draw a batch with replacement.

        Args:
            batch_size: B >= 1; default the constructor's ``batch_size``.
            return_info: also return ``{"index", weight key, "index_generation"}`` as a dict (TorchRL's ``info``).

        Returns:
            A TensorDict [B] on the buffer's device: every stored key (views of one gathered row
            per draw), ``"index"`` [B] int64, the weight key [B] float32, ``"index_generation"``
            [B] int32 and ``"gper_state"`` (an int), the last two for
            :meth:`update_tensordict_priority`'s check.
        """
        b = self._batch_size if batch_size is None else batch_size
        if b is None:
            raise RuntimeError("sample(): no batch_size given here nor to the constructor")
        rb = self._built("sample()")
        batch = rb.sample(check_batch_size(b))
        self._source = batch.source
        extra = {(INDEX_KEY,): batch.indices, self.weight_key: batch.weights, (GENERATION_KEY,): batch.generations}
        state = NonTensorData(self._token, batch_size=[b], device=rb.device)
        td = TensorDict(self._layout.nest(batch, extra | {(STATE_KEY,): state}), batch_size=[b], device=rb.device)
        info = {show(k): v for k, v in extra.items()}
        return (td, info) if return_info else td

    def __iter__(self) -> Iterator[TensorDict]:
        """Batches of ``batch_size``, without end (a prioritized sampler never runs out, as in TorchRL)."""
        if self._batch_size is None:
            raise RuntimeError("cannot iterate over the buffer: no batch_size was given to the constructor")
        while True:
            yield self.sample()

    # ---------------------------------------------------------------- priorities

    def _priority_vector(self, priority: object, n: int, what: str) -> torch.Tensor:
        if not isinstance(priority, torch.Tensor):
            raise TypeError(f"{what}: {show(self.priority_key)!r} must be a tensor, got {type(priority).__name__}")
        if priority.dim() == 0 or priority.shape[0] != n or priority.numel() == 0:
            raise ValueError(
                f"{what}: {show(self.priority_key)!r} has shape {list(priority.shape)}, expected [{n}, ...]"
            )
        return reduce_priority(priority, self.reduction)

    def update_priority(self, index: int | torch.Tensor, priority: float | torch.Tensor) -> None:
        """Set the priorities of slots ``index`` (raw: no check that they still hold what was sampled).

        Args:
            index: an int or [B] integer tensor of slots.
            priority: a number (for every slot) or [B] tensor; stored as ``(|p| + eps) ** alpha``.
        """
        rb, what = self._built("update_priority()"), "update_priority()"
        index = torch.as_tensor(index)
        if index.dtype.is_floating_point or index.dtype == torch.bool or index.is_complex():
            raise TypeError(f"{what}: index must be integers, got {index.dtype}")
        index = index.reshape(-1).to(rb.device, torch.int64)
        priority = torch.as_tensor(priority)
        if priority.numel() == 1:
            priority = priority.reshape(1).expand(index.numel())
        elif priority.numel() != index.numel():
            raise ValueError(f"{what}: {priority.numel()} priorities for {index.numel()} indices")
        rb.update_priorities(index, priority.reshape(-1).to(rb.device, torch.float32).contiguous())

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Set priorities from a sample: ``data["index"]`` and ``data[priority_key]`` (reduced per item).

        Entries whose slot has been overwritten since the sample was drawn are left alone (and
        counted in ``buffer.stats()["stale_updates"]``); so is the whole sample when it was drawn
        before a load or empty, or from another buffer. A TensorDict without ``"index_generation"``
        updates its indices unchecked, like :meth:`update_priority`.
        """
        rb, what = self._built("update_tensordict_priority()"), "update_tensordict_priority()"
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"{what} takes a TensorDict, got {type(data).__name__}")
        if data.batch_dims != 1:
            raise ValueError(f"{what} takes a TensorDict with one batch dim [B], got {list(data.batch_size)}")
        index, priority = data.get(INDEX_KEY, None), data.get(self.priority_key, None)
        if index is None or priority is None:
            missing = [show(as_key(k)) for k, v in ((INDEX_KEY, index), (self.priority_key, priority)) if v is None]
            raise KeyError(f"{what}: the TensorDict has no {missing} (sample() writes 'index'; the loss the priority)")
        b = data.batch_size[0]
        priority = self._priority_vector(priority, b, what).to(rb.device)
        while index.dim() > 1:  # [B, 1] as TorchRL accepts
            index = index[..., 0]
        index = index.to(rb.device, torch.int64)
        generations = data.get(GENERATION_KEY, None)
        if generations is None:
            rb.update_priorities(index, priority)
            return
        batch = gper.SampledBatch(rb.rows.layout, _NONE, index, _NONE, generations.to(rb.device, torch.int32))
        state = data.get_non_tensor(STATE_KEY, None) if STATE_KEY in data.keys() else None
        # of this state: this state's stamp; otherwise none, which gper counts as stale as a whole
        batch.source = self._source if state == self._token else None
        rb.update_priorities(batch, priority)
