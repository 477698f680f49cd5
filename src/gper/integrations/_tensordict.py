"""TensorDict leaves as gper fields: which keys a buffer stores, checked, flattened and nested again.

gper stores flat fields (``{name: (shape, dtype)}``); a TensorDict has nested keys. A
:class:`KeyLayout` fixes the stored keys (each tensor leaf, with its per-item shape and dtype),
names each field by its key joined with dots (``("next", "observation")`` is
``"next.observation"``), checks later TensorDicts against it, and nests sampled fields back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

NestedKey = str | tuple[str, ...]
Key = tuple[str, ...]


def as_key(key: NestedKey) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def show(key: Key) -> str | Key:
    """A key as TensorDict users write it: ``"action"``, ``("next", "observation")``."""
    return key[0] if len(key) == 1 else key


def _is_leaf(cls: type) -> bool:
    """Leaves for ``items(is_leaf=...)``: tensors and non-tensor data (tensordict skips the latter by default)."""
    return not is_tensor_collection(cls) or bool(getattr(cls, "_is_non_tensor", False))


def stored_leaves(td: TensorDictBase, skip: set[Key], what: str) -> dict[Key, torch.Tensor]:
    """Every leaf of ``td`` but the keys in ``skip``, each a tensor [N, ...].

    Raises:
        TypeError: a leaf is not a tensor (non-tensor data: gper stores tensors only).
    """
    out = {}
    for key, value in td.items(include_nested=True, leaves_only=True, is_leaf=_is_leaf):
        key = as_key(key)
        if key in skip:
            continue
        if not isinstance(value, torch.Tensor):
            kind = type(value).__name__
            raise TypeError(f"{what}: {show(key)!r} holds {kind}; gper stores tensors only (exclude it first)")
        out[key] = value
    return out


@dataclass(frozen=True)
class Leaf:
    key: Key
    name: str  # the gper field
    shape: tuple[int, ...]  # per item
    dtype: torch.dtype


@dataclass(frozen=True)
class KeyLayout:
    """The stored keys of a buffer, in the order of the TensorDict they were taken from."""

    leaves: tuple[Leaf, ...]

    @staticmethod
    def of(stored: Mapping[Key, torch.Tensor], what: str) -> KeyLayout:
        """The layout of ``stored`` leaves ([N, *shape] each).

        Raises:
            ValueError: no leaf, or two keys that would name the same field.
        """
        leaves, names = [], {}
        for key, value in stored.items():
            name = ".".join(key)
            if name in names:
                raise ValueError(f"{what}: keys {show(names[name])!r} and {show(key)!r} would both be field {name!r}")
            names[name] = key
            leaves.append(Leaf(key, name, tuple(value.shape[1:]), value.dtype))
        if not leaves:
            raise ValueError(f"{what}: the TensorDict holds no tensor to store")
        return KeyLayout(tuple(leaves))

    @property
    def keys(self) -> list[Key]:
        return [leaf.key for leaf in self.leaves]

    def spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """gper's ``spec``."""
        return {leaf.name: (leaf.shape, leaf.dtype) for leaf in self.leaves}

    def check(self, stored: Mapping[Key, torch.Tensor], what: str) -> None:
        """Raise unless ``stored`` has exactly these keys, each with its shape and dtype per item."""
        missing = [show(leaf.key) for leaf in self.leaves if leaf.key not in stored]
        known = {leaf.key: leaf for leaf in self.leaves}
        extra = [show(k) for k in stored if k not in known]
        if missing or extra:
            raise KeyError(f"{what}: missing keys {missing}, unexpected keys {extra} (the first extend fixed the keys)")
        for key, value in stored.items():
            leaf = known[key]
            if tuple(value.shape[1:]) != leaf.shape or value.dtype != leaf.dtype:
                got = f"{tuple(value.shape[1:])} {value.dtype}"
                raise ValueError(f"{what}: {show(key)!r} is {got} per item, expected {leaf.shape} {leaf.dtype}")

    def flat(self, stored: Mapping[Key, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What gper's ``add`` takes: ``{field: tensor}``."""
        return {leaf.name: stored[leaf.key] for leaf in self.leaves}

    def nest(self, fields: Mapping[str, Any], extra: Mapping[Key, Any] | None = None) -> dict[str, Any]:
        """gper's fields (a sampled batch), and ``extra`` entries by key, as the nested dict a
        TensorDict is built from (one constructor call: cheaper than setting entries one by one)."""
        out: dict[str, Any] = {}
        pairs = [(leaf.key, fields[leaf.name]) for leaf in self.leaves] + list((extra or {}).items())
        for key, value in pairs:
            node = out
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = value
        return out

    def record(self) -> list:
        """JSON-able: ``[[key parts], [shape], dtype name]`` per leaf."""
        return [[list(leaf.key), list(leaf.shape), str(leaf.dtype).removeprefix("torch.")] for leaf in self.leaves]

    @staticmethod
    def parse(record: object, what: str) -> KeyLayout:
        """The layout a :meth:`record` describes.

        Raises:
            ValueError: the record is not one.
        """
        try:
            stored = {}
            for key, shape, dtype in record:
                dtype = getattr(torch, dtype)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"{dtype!r} is not a dtype")
                stored[tuple(key)] = torch.empty((1, *shape), dtype=dtype, device="meta")
        except (TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{what}: the saved keys are corrupt ({err})") from err
        return KeyLayout.of(stored, what)


def reduce_priority(priority: torch.Tensor, how: str) -> torch.Tensor:
    """[B, ...] priorities -> [B], reduced over all but the first dim ("max", "min", "mean", "median"; as TorchRL)."""
    p = priority.detach().reshape(priority.shape[0], -1)
    p = p if p.dtype.is_floating_point else p.float()
    if how == "median":
        return p.median(dim=1).values
    return {"max": p.amax, "min": p.amin, "mean": p.mean}[how](dim=1)
