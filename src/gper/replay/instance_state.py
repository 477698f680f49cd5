"""The state of a buffer of several instances: its counters' read-out, state dict, file and copies.

The state of every instance is the stacked tensors of its :class:`~gper.replay.instances.InstanceStack`
(rows, trees, generations, counters, scalars; rank mode's sort keys too), with a leading [N]
dimension; instance ``i``'s part is the state a single buffer of seed ``seed + i`` holds. A
restore checks every instance's part as a single buffer checks its own, all before anything is
copied, so a refused state leaves every instance unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gper.ops.state import COUNTER_STATS, S_MAXP
from gper.replay.checkpoint import check_contents, check_state
from gper.replay.checks import warn_dropped
from gper.replay.files import TensorFile, write_tensors
from gper.replay.instances import check_seed_room


class InstanceCheckpoint:
    """The state half of a buffer of several instances (mixed into
    :class:`~gper.replay.buffer_instances.PrioritizedReplayInstances`)."""

    def stats(self) -> dict[str, list]:
        """Every instance's counters (one host sync for all): the keys of a single buffer's
        ``stats()``, each a list of N values (instance ``i``'s at ``[i]``).

        Warns:
            GperWarning: when an instance dropped invalid indices since the last call.
        """
        tree, lay = self._stack.tree, self._stack.layout
        top = lay.offsets[0]
        host = torch.cat(
            (
                tree["counters"].double(),
                tree["scalars"][:, S_MAXP : S_MAXP + 1].double(),
                tree["tree"][:, top : top + lay.arity].double().sum(1, keepdim=True),
            ),
            dim=1,
        ).tolist()
        out: dict[str, list] = {name: [int(row[i]) for row in host] for name, i in COUNTER_STATS.items()}
        out["max_priority"] = [row[-2] for row in host]
        out["total_priority"] = [row[-1] for row in host]
        for m, invalid in zip(self.members, out["invalid_indices"], strict=True):
            m._core.invalid_reported = warn_dropped(invalid, m._core.invalid_reported)
            m._size = out["size"][0]
        self._size = out["size"][0]
        return out

    # ---------------------------------------------------------------- state dict

    def _tensors(self) -> dict[str, torch.Tensor]:
        return self._stack.state_tensors([m._tensors() for m in self.members])

    def _config(self) -> dict[str, Any]:
        return self._cfg.checkpoint(self._row_layout) | self._per_instance()

    def _host_counts(self) -> dict[str, int]:
        return {"size": self._size, "updates_since_refresh": self.members[0].policy.updates_since_refresh}

    def state_dict(self) -> dict[str, Any]:
        """Everything that defines every instance, as a single buffer's ``state_dict`` with a
        leading [N] on each tensor (the buffer's own, not copies; rank mode's keys are stacked
        copies). ``seed`` is instance 0's: instance ``i`` draws with ``seed + i``."""
        return {"config": self._config(), "seed": self.seed} | self._tensors() | {"host": self._host_counts()}

    def load_state_dict(self, state: Mapping[str, Any], before_copy: Callable[[], object] | None = None) -> None:
        """Restore a :meth:`state_dict` in place, with every instance's part checked as a single
        buffer checks its own (one host sync per instance) before anything is copied.

        Raises:
            ValueError: another configuration, an incomplete or corrupt state (naming what is
                wrong); every instance is then unchanged.
        """
        self._restore(state, lambda rows: rows.copy_(state["rows"]), before_copy=before_copy)

    def save(self, path: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> int:
        """Write every instance's state to a safetensors file at ``path``, atomically and a chunk
        at a time, as :meth:`PrioritizedReplayBuffer.save` does; the file holds every slot's rows
        (of all N instances). Returns bytes written."""
        meta = {"config": self._config(), "seed": self.seed, "host": self._host_counts()}
        return write_tensors(path, self._tensors(), meta, progress)

    def load(self, path: str | os.PathLike, before_copy: Callable[[], object] | None = None) -> None:
        """Restore a file written by :meth:`save`, in place, with the checks of :meth:`load_state_dict`.

        Raises:
            ValueError: the file is missing, damaged, not such a buffer's, from other settings or
                corrupt; every instance is then unchanged.
        """
        with TensorFile(path) as f:
            meta = f.metadata
            state: dict[str, Any] = {"config": meta.get("config"), "seed": meta.get("seed"), "host": meta.get("host")}
            for name, mine in self._tensors().items():
                if name not in f.keys():
                    raise ValueError(f"load(): {path} has no tensor {name!r}")
                shape, dtype = f.meta(name)
                if name == "rows" or (shape, dtype) != (mine.shape, mine.dtype):
                    state[name] = torch.empty(shape, dtype=dtype, device="meta")  # read into place after the checks
                    continue
                state[name] = torch.zeros(shape, dtype=dtype, device=self.device)
                try:
                    f.copy_into(name, state[name])
                except (OSError, ValueError) as err:
                    raise ValueError(f"load(): {err}") from err

            def read(rows: torch.Tensor) -> None:
                try:
                    f.copy_into("rows", rows)
                except OSError as err:
                    raise RuntimeError(
                        f"load(): {path} could not be read to the end after its checks passed ({err}); the "
                        "buffer now holds part of it: load a complete file into it, or build a new one"
                    ) from err

            self._restore(state, read, json_config=True, before_copy=before_copy)

    def _restore(
        self,
        state: Mapping[str, Any],
        copy_rows: Callable[[torch.Tensor], object],
        json_config: bool = False,
        before_copy: Callable[[], object] | None = None,
    ) -> None:
        config = json.loads(json.dumps(self._config())) if json_config else self._config()
        seed, host = check_state(state, config, self._tensors())
        check_seed_room(seed, self.instances)
        layout = self._stack.layout
        checked = [
            check_contents(self._member_state(state, i), layout, host["size"], self.device)
            for i in range(self.instances)
        ]
        sizes = sorted({size for size, _ in checked})
        if len(sizes) != 1:
            raise ValueError(f"load_state_dict(): the instances hold different numbers of filled slots: {sizes}")
        if before_copy is not None:
            before_copy()
        with torch.no_grad():
            self._stack.load(state, copy_rows)
            for i, m in enumerate(self.members):
                m.policy.load_state_dict(self._member_state(state, i))
        for i, (m, (size, invalid)) in enumerate(zip(self.members, checked, strict=True)):
            m._size = size
            m._core.restored(seed + i, invalid, int(host["updates_since_refresh"]))
        self._size = sizes[0]
        self._restored()
