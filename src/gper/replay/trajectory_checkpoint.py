"""The checks a trajectory buffer's state passes before it is loaded.

On top of the flat buffer's (:func:`gper.replay.checkpoint.check_contents`: counters, priorities,
trees), the stream state must agree with the rows: counts and episode starts in range, the
episode in progress starting after the last end row, and exactly the drawable starts that the
rows' flags and the counts imply carrying a priority (so a state cannot make a start drawable
whose window runs past what was written).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import C_CURSOR, C_SIZE
from gper.ops.trajectory_reference import END_ROW, N_TCOUNTERS, T_STEPS, expected_drawable
from gper.replay.checkpoint import check_contents


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
) -> tuple[int, int]:
    """Check a trajectory buffer's ``state`` (its rows' flags words ``flags`` [capacity] int32)
    whole, in one host sync; return (the dropped update entries it counts, the steps it added:
    the device's count, which adds replayed from a caller's graph count in too).

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
    carries = expected_drawable(flags=flags, streams=streams.clamp(min=0), rows_per_env=rows_per_env, window=window)
    written = written_slots(streams, rows_per_env)
    _, invalid = check_contents(state, layout, host_size, device, carries=carries, written=written, extra=extra)
    return invalid, int(steps)  # a second read, after the checks passed
