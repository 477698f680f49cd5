"""A trajectory buffer's checkpoint: its state's form (:class:`TrajectoryCheckpoint`, the
buffer's ``state_dict`` / ``load_state_dict`` / ``save`` / ``load``), and the checks a state
passes before it is loaded.

On top of the flat buffer's (:func:`gper.replay.checkpoint.check_contents`: counters, priorities,
trees), the stream state must agree with the rows: counts and episode starts in range, the
episode in progress starting after the last end row, and exactly the drawable starts that the
rows' flags and the counts imply carrying a priority (so a state cannot make a start drawable
whose window runs past what was written).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import C_CURSOR, C_SIZE
from gper.ops.trajectory.reference import END_ROW, N_TCOUNTERS, T_STEPS, expected_drawable
from gper.replay.checkpoint import check_contents, check_state
from gper.replay.files import TensorFile, write_tensors


def stream_checks(flags: torch.Tensor, streams: torch.Tensor, rows_per_env: int) -> dict[str, torch.Tensor]:
    """Named failed-checks (0-d bool) of the stream counts against the rows' flags words."""
    t = rows_per_env
    count, ep = streams[:, 0], streams[:, 1]
    held = count.clamp(min=0, max=t)
    i = torch.arange(t, device=flags.device, dtype=torch.int64)
    q = (count - held)[:, None] + i[None, :]
    present = i[None, :] < held[:, None]
    base = torch.arange(streams.shape[0], device=flags.device, dtype=torch.int64)[:, None] * t
    f = flags[base + torch.remainder(q, t)]
    last_end = torch.where(present & ((f & END_ROW) != 0), q, -1).amax(dim=1)
    want = torch.where(last_end >= 0, last_end + 1, ep)  # no end row stored: any start before the oldest row
    return {
        "a stream's row count is negative": (count < 0).any(),
        "an episode start is outside [0, rows written]": ((ep < 0) | (ep > count)).any(),
        "an episode in progress does not start after its stream's last end row": (
            (ep != want) | ((last_end < 0) & (ep > count - held))
        ).any(),
    }


def written_slots(streams: torch.Tensor, rows_per_env: int) -> torch.Tensor:
    """[E * T] bool: the slots ever written (ring position below the stream's row count)."""
    t = rows_per_env
    pos = torch.arange(t, device=streams.device, dtype=torch.int64)
    return (pos[None, :] < streams[:, :1]).reshape(-1)


def check_trajectory_contents(
    state: Mapping[str, torch.Tensor],
    flags: torch.Tensor,
    layout: TreeLayout,
    host_size: int,
    host_steps: int,
    rows_per_env: int,
    window: int,
    device: torch.device,
    more: Mapping[str, torch.Tensor] | None = None,
) -> tuple[int, int]:
    """Check a trajectory buffer's ``state`` (its rows' flags words ``flags`` [capacity] int32)
    whole, in one host sync; return (the dropped update entries it counts, the steps it added:
    the device's count, which adds replayed from a caller's graph count in too). ``more``: further
    named failed-checks (0-d bool) to read in the same sync (the episode index's).

    Raises:
        ValueError: naming every check that failed.
    """
    streams = state["streams"].detach().to(device)
    flags = flags.to(device)
    counters = state["counters"].detach().to(device)
    tcounters = state["tcounters"].detach().to(device)
    extra = stream_checks(flags, streams, rows_per_env)
    extra["the tree's size and cursor are not (capacity, 0)"] = (counters[C_SIZE] != layout.capacity) | (
        counters[C_CURSOR] != 0
    )
    extra["a trajectory count (steps, discontinuities) is negative"] = (tcounters[:N_TCOUNTERS] < 0).any()
    steps = tcounters[T_STEPS]
    count = streams[:, 0]
    # every add writes one or two rows a stream, and the host counts no more adds than the device
    extra["a stream's rows are not between the steps added and twice that"] = (
        (count < steps) | (count > 2 * steps)
    ).any()
    extra["the host counts more steps than the device"] = steps < host_steps
    extra |= dict(more or {})
    carries = expected_drawable(flags=flags, streams=streams.clamp(min=0), rows_per_env=rows_per_env, window=window)
    written = written_slots(streams, rows_per_env)
    _, invalid = check_contents(state, layout, host_size, device, carries=carries, written=written, extra=extra)
    return invalid, int(steps)  # a second read, after the checks passed


def check_host_steps(host: Mapping[str, Any], flags: torch.Tensor | None) -> int:
    """A state's host step count (an int >= 0), once its rows were found (``flags`` not None)."""
    steps = host.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"load_state_dict(): host['steps'] must be an int >= 0, got {steps!r}")
    if flags is None:
        raise ValueError("load_state_dict(): 'rows' missing or of the wrong shape/dtype")
    return steps


class TrajectoryCheckpoint:
    """The checkpoint methods of :class:`~gper.TrajectoryReplayBuffer` (its rows, tree, policy,
    stream state and counts; the buffer defines ``_init_args`` and the rest)."""

    def _tensors(self) -> dict[str, torch.Tensor]:
        her = self._relabeler.state_dict() if self._relabeler is not None else {}
        return self._core.state_tensors() | self._streams.state_dict() | her

    def _config(self) -> dict[str, Any]:
        # a buffer with hindsight relabelling holds its episode index too (strategy, ratio and the
        # reward are how it samples, not what it holds: a state moves between them)
        her = {"her": True} if self._relabeler is not None else {}
        return (
            self._cfg.checkpoint(self.layout.row)
            | {
                "num_envs": self.num_envs,
                "window": self.window,
                "obs_keys": list(self.obs_keys),
                "autoreset": self.autoreset,
                "kind": "trajectory",
            }
            | her
        )

    def _host_counts(self) -> dict[str, int]:
        return {"size": self._size, "updates_since_refresh": self.policy.updates_since_refresh, "steps": self._steps}

    def state_dict(self) -> dict[str, Any]:
        """Everything that defines the buffer (the tensors are its own, not copies)."""
        return {"config": self._config(), "seed": self.seed} | self._tensors() | {"host": self._host_counts()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` in place, checked whole first (one host sync); batches
        drawn before it count as stale afterwards.

        Raises:
            ValueError: the state comes from a buffer of another configuration, is incomplete, or
                is corrupt (naming what is wrong); the buffer is then unchanged.
        """
        flags = None
        rows = state.get("rows") if isinstance(state, Mapping) else None
        if isinstance(rows, torch.Tensor) and rows.shape == self._all_rows().shape and rows.dtype == torch.uint8:
            flags = self._flags_of(rows)
        self._restore(state, flags, lambda dst: dst.copy_(state["rows"]))

    def save(self, path: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> int:
        """Write the buffer's state to a safetensors file at ``path``, atomically and a chunk at a
        time (as the flat buffer's :meth:`~gper.PrioritizedReplayBuffer.save`; every row is written).

        Returns:
            bytes written.
        """
        meta = {"config": self._config(), "seed": self.seed, "host": self._host_counts()}
        tensors = self._tensors() | {"flags": self._flags_of(self._all_rows()).contiguous()}
        return write_tensors(path, tensors, meta, progress)

    def load(self, path: str | os.PathLike) -> None:
        """Restore a file written by :meth:`save`, in place, with the checks of :meth:`load_state_dict`.

        Raises:
            ValueError: the file is missing, damaged, not a buffer file, from a buffer of other
                settings, or corrupt; the buffer is then unchanged.
            RuntimeError: the file changed while its rows were being read (the buffer then holds part of it).
        """
        with TensorFile(path) as f:
            meta = f.metadata
            state: dict[str, Any] = {"config": meta.get("config"), "seed": meta.get("seed"), "host": meta.get("host")}
            wanted = self._tensors() | {"flags": self._flags_of(self._all_rows())}
            for name, mine in wanted.items():
                if name not in f.keys():
                    raise ValueError(f"load(): {path} has no tensor {name!r}")
                shape, dtype = f.meta(name)
                if name == "rows" or (shape, dtype) != (mine.shape, mine.dtype):
                    state[name] = torch.empty(shape, dtype=dtype, device="meta")  # refused by the checks, or read last
                else:
                    state[name] = torch.empty(shape, dtype=dtype, device=self.device)
                    try:
                        f.copy_into(name, state[name])
                    except (OSError, ValueError) as err:
                        raise ValueError(f"load(): {err}") from err
            flags = state.pop("flags")
            if flags.device.type == "meta":
                raise ValueError(f"load(): {path} has a 'flags' tensor of the wrong shape/dtype")
            self._restore(state, flags, lambda dst: self._read_rows(f, dst, flags, path), json_config=True)

    def _read_rows(self, f: TensorFile, rows: torch.Tensor, flags: torch.Tensor, path: str | os.PathLike) -> None:
        try:
            f.copy_into("rows", rows)
            same = bool((self._flags_of(rows) == flags).all())
        except OSError as err:
            same, why = False, f"({err})"
        else:
            why = "(its rows disagree with its flags)"
        if not same:
            raise RuntimeError(
                f"load(): {path} could not be read consistently after its checks passed {why}; the buffer now "
                "holds part of it: load a complete file into it, or build a new one"
            )

    def _all_rows(self) -> torch.Tensor:
        """The stored rows a state holds whole (a buffer of several instances': all of theirs)."""
        return self.rows.rows

    def _flags_of(self, rows: torch.Tensor) -> torch.Tensor:
        """The flags words of packed uint8 rows ``[..., slots, row_bytes]``: ``[..., slots]`` int32."""
        return rows.view(torch.int32)[..., self.layout.flags_col]

    def _restore(
        self,
        state: Mapping[str, Any],
        flags: torch.Tensor | None,
        copy_rows: Callable[[torch.Tensor], object],
        json_config: bool = False,
    ) -> None:
        config = json.loads(json.dumps(self._config())) if json_config else self._config()
        seed, host = check_state(state, config, self._tensors())
        steps = check_host_steps(host, flags)
        invalid, steps = self._check_contents(state, flags, host["size"], steps)
        self._load_checked(state, copy_rows, seed, host, invalid, steps)

    def _check_contents(
        self, state: Mapping[str, Any], flags: torch.Tensor, host_size: int, host_steps: int
    ) -> tuple[int, int]:
        """Check what a state whose form passed holds (:func:`check_trajectory_contents`, and the
        episode index's); return (the dropped update entries it counts, the device's step count)."""
        more = None
        if self._relabeler is not None:
            streams = state["streams"].detach().to(self.device)
            more = self._relabeler.checks(state, flags.to(self.device), streams)
        rows_per_env, window = self.rows_per_env, self.window
        return check_trajectory_contents(
            state, flags, self.tree.layout, host_size, host_steps, rows_per_env, window, self.device, more
        )

    def _load_checked(
        self,
        state: Mapping[str, Any],
        copy_rows: Callable[[torch.Tensor], object],
        seed: int,
        host: Mapping[str, Any],
        invalid: int,
        steps: int,
    ) -> None:
        """Copy a checked state into place and take its counts (``steps``: the device's)."""
        with torch.no_grad():
            self._core.load_tensors(state, copy_rows)
            self._streams.load_state_dict(state)
            if self._relabeler is not None:
                self._relabeler.load_state_dict(state)
        self._steps, self._size = steps, int(host["size"])  # the device's step count
        self._core.restored(seed, invalid, int(host["updates_since_refresh"]))
        self._gamma.forget()
