"""The settings of a replay buffer, checked once, and their checkpoint form."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import torch

from gper.ops import BACKENDS
from gper.ops.layout import DEFAULT_ARITY, TreeLayout
from gper.ops.state import P_MAX, P_MIN
from gper.replay.checks import check_unit
from gper.replay.samplers import SAMPLING, WEIGHT_NORMS, SamplingPolicy
from gper.replay.storage import RowLayout, RowStorage
from gper.replay.tree import PriorityTree

if TYPE_CHECKING:
    from gper.replay.core import ReplayCore


class CommonSettings(TypedDict, total=False):
    """The keyword-only settings every buffer takes, the sharded one's too. Each is documented,
    with its default (:data:`DEFAULTS`), in :class:`~gper.PrioritizedReplayBuffer`; the other
    buffers' docstrings say where theirs differ."""

    alpha: float
    beta: float
    eps: float
    sampling: str
    weight_norm: str
    device: str | torch.device | None
    backend: str | ModuleType
    seed: int
    strict: bool
    arity: int
    cuda_graphs: bool


class ReplaySettings(CommonSettings, total=False):
    """The keyword-only settings of a buffer on one device: :class:`CommonSettings` and these."""

    cpu_fallback: bool
    rank_refresh_interval: int
    instances: int | None


#: the default of every setting (the one place they are written)
DEFAULTS: ReplaySettings = {
    "alpha": 0.6,
    "beta": 0.4,
    "eps": 1e-6,
    "sampling": "proportional",
    "weight_norm": "global",
    "device": None,
    "backend": "auto",
    "seed": 0,
    "strict": False,
    "arity": DEFAULT_ARITY,
    "cuda_graphs": True,
    "cpu_fallback": True,
    "rank_refresh_interval": 100,
    "instances": None,
}


def with_defaults(owner: str, given: Mapping[str, Any], accepted: type = ReplaySettings) -> dict[str, Any]:
    """Every setting ``accepted`` (a settings TypedDict) declares: ``given``'s, else its default.
    A keyword it does not declare raises the TypeError Python raises for an unknown keyword of
    ``owner``'s ``__init__``."""
    names = accepted.__annotations__
    for name in given:
        if name not in names:
            raise TypeError(f"{owner}.__init__() got an unexpected keyword argument {name!r}")
    return {name: given.get(name, DEFAULTS[name]) for name in names}


def _hints(accepted: type) -> dict[str, object]:
    """``accepted``'s annotations as written (a TypedDict keeps them as forward references)."""
    return {name: getattr(hint, "__forward_arg__", hint) for name, hint in accepted.__annotations__.items()}


_Init = TypeVar("_Init", bound=Callable[..., None])


def takes_settings(accepted: type) -> Callable[[_Init], _Init]:
    """Gives an ``__init__(..., **settings: Unpack[accepted])`` the signature it accepts: its own
    parameters, then each setting as keyword-only with its default, which ``help()``,
    ``inspect.signature`` and editors then show."""

    def mark(init: _Init) -> _Init:
        own = inspect.signature(init)
        params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        params += [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=DEFAULTS[name], annotation=hint)
            for name, hint in _hints(accepted).items()
        ]
        init.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        return init

    return mark


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_eps(value: object) -> float:
    """``eps`` as a float in ``[2^-126, 2^64]``: positive and normal in float32, where the kernels
    compute with it, and no larger than the largest priority (``P_MAX``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"eps must be a float, got {type(value).__name__}")
    if not P_MIN <= float(value) <= P_MAX:  # False for NaN too
        raise ValueError(
            f"eps must be in [2**-126, 2**64]: positive, finite and normal as a float32, and at most "
            f"the largest priority; got {value!r}"
        )
    return float(value)


def check_seed(value: object) -> int:
    if not _is_int(value) or not 0 <= value < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63), got {value!r}")
    return value


def check_weight_norm(value: object) -> str:
    if value not in WEIGHT_NORMS:
        raise ValueError(f"weight_norm must be one of {WEIGHT_NORMS}, got {value!r}")
    return value


def check_refresh_interval(value: object) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"rank_refresh_interval must be an int >= 1, got {value!r}")
    return value


#: the settings a buffer lets you change after construction, each with its check
MUTABLE = {
    "alpha": lambda v: check_unit("alpha", v),
    "beta": lambda v: check_unit("beta", v),
    "eps": check_eps,
    "weight_norm": check_weight_norm,
    "rank_refresh_interval": check_refresh_interval,
}


class Setting:
    """A buffer attribute that reads its :class:`ReplayConfig` (``obj._cfg``); settings in
    :data:`MUTABLE` can be assigned (checked, then ``obj._settings_changed(name)``), the others are
    fixed at construction."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj._cfg, self.name)

    def __set__(self, obj: object, value: object) -> None:
        check = MUTABLE.get(self.name)
        if check is None:
            raise AttributeError(f"{self.name} is fixed when the buffer is built")
        obj._cfg = replace(obj._cfg, **{self.name: check(value)})
        obj._settings_changed(self.name)


class BufferSettings:
    """The settings both buffers expose, read from their checked ``_cfg`` (:class:`ReplayConfig`):
    ``alpha``, ``beta``, ``eps``, ``weight_norm`` and ``rank_refresh_interval`` may be assigned
    (checked again), ``sampling``, ``seed`` and ``capacity`` are fixed. A buffer has ``_cfg``, ``_size`` and
    ``_core`` (its :class:`~gper.replay.core.ReplayCore`), whose parts it shows as ``device``,
    ``backend``, ``rows``, ``tree`` and ``policy``."""

    alpha, beta, eps, sampling = Setting(), Setting(), Setting(), Setting()
    weight_norm, rank_refresh_interval = Setting(), Setting()

    def _settings_changed(self, name: str) -> None:
        self._core.policy.configure(self._cfg.weight_norm, self._cfg.rank_refresh_interval)
        if name in ("alpha", "eps", "weight_norm"):
            # captured graphs froze these (kernel arguments, the normalisation): calls after the
            # change capture new ones. beta is read from a device scalar, so its graphs stay
            self._core.graphs.clear()

    @property
    def seed(self) -> int:
        """The sampler's Philox key (fixed; a restore takes the saved one)."""
        return self._core.seed

    def __len__(self) -> int:
        """Filled slots, as the host knows it (adds replayed from a CUDA graph show after ``stats()``,
        which makes it exact)."""
        return self._size

    @property
    def core(self) -> ReplayCore:
        """The :class:`~gper.replay.core.ReplayCore` the buffer is built on (a sharded buffer
        drives its shard's through it)."""
        return self._core

    @property
    def device(self) -> torch.device:
        """Where the buffer lives (the CPU after a fall-back)."""
        return self._core.device

    @property
    def backend(self) -> str:
        """The back end the kernels run on: "triton" or "torch" (or a kernel module's name)."""
        return self._core.backend

    @property
    def rows(self) -> RowStorage:
        """The packed rows (:class:`~gper.replay.storage.RowStorage`)."""
        return self._core.rows

    @property
    def tree(self) -> PriorityTree:
        """The priority tree (:class:`~gper.replay.tree.PriorityTree`)."""
        return self._core.tree

    @property
    def policy(self) -> SamplingPolicy:
        """The sampler (one of :mod:`gper.replay.samplers`)."""
        return self._core.policy

    @property
    def capacity(self) -> int:
        """Slots in all (the trajectory buffer's: ``num_envs * rows_per_env``)."""
        return self._cfg.capacity


@dataclass(frozen=True)
class ReplayConfig:
    """The settings of a buffer that define its contents (see :class:`~gper.PrioritizedReplayBuffer`'s
    docstring; their defaults are :data:`DEFAULTS`); :meth:`check` validates them before anything
    is allocated."""

    capacity: int
    alpha: float
    beta: float
    eps: float
    sampling: str
    weight_norm: str
    seed: int
    rank_refresh_interval: int
    arity: int

    @staticmethod
    def check(capacity: object, settings: Mapping[str, Any]) -> ReplayConfig:
        """The checked settings (``settings`` as :func:`with_defaults` gives them; ``backend`` is
        checked too), or a TypeError/ValueError naming the first bad one."""
        alpha, beta, eps, sampling = settings["alpha"], settings["beta"], settings["eps"], settings["sampling"]
        weight_norm, backend, seed = settings["weight_norm"], settings["backend"], settings["seed"]
        rank_refresh_interval, arity = settings["rank_refresh_interval"], settings["arity"]
        if not _is_int(capacity):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        alpha, beta, eps = check_unit("alpha", alpha), check_unit("beta", beta), check_eps(eps)
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
        check_weight_norm(weight_norm)
        if isinstance(backend, str) and backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        check_seed(seed)
        check_refresh_interval(rank_refresh_interval)
        if not _is_int(arity):
            raise TypeError(f"arity must be an int (a power of two >= 2), got {arity!r}")
        return ReplayConfig(capacity, alpha, beta, eps, sampling, weight_norm, seed, rank_refresh_interval, arity)

    def estimate_bytes(self, row_bytes: int) -> int:
        """Device bytes of a buffer of these settings with rows of ``row_bytes`` (checks ``arity``)."""
        layout = TreeLayout.build(self.capacity, self.arity)
        tree = PriorityTree.estimate_bytes(layout)
        return self.capacity * row_bytes + tree + SamplingPolicy.estimate_bytes(self.sampling, self.capacity)

    def checkpoint(self, layout: RowLayout) -> dict[str, Any]:
        """What a checkpoint records to refuse loading into a buffer of other settings (or rows)."""
        return {
            "capacity": self.capacity,
            "spec": {n: (list(shape), str(dtype)) for n, (shape, dtype) in layout.spec().items()},
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "sampling": self.sampling,
            "weight_norm": self.weight_norm,
            "arity": self.arity,
            # where each field sits in a storage row: rows saved with another packing (an older
            # gper ordered fields differently) are refused rather than read as scrambled fields
            "row_layout": {f.name: f.offset for f in layout.fields} | {"row_bytes": layout.row_bytes},
        }
