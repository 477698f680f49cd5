"""The episode index of a trajectory buffer: for every stored row, where its episode begins and ends.

Hindsight relabelling (:mod:`gper.replay.her`) draws goals from the episode of a drawn start,
which may reach far beyond the ``window`` rows the sampling kernels look at. So a buffer built
with ``her`` keeps, beside its rows and maintained on the device by every ``add``:

* ``ids`` [E * T] int32: per slot, the id (mod ``R``) of its row's episode (an end row carries
  the id of the episode it ends);
* ``current`` [E] int64: per stream, the id (mod ``R``) of the episode in progress;
* ``records`` [E, R, 2] int64: per stream a ring of ``R = T // 2 + 2`` records indexed by id:
  the episode's first row number, and its end row number (-1 while it is in progress).

Ids are consecutive per stream. An episode with at least one step takes at least two rows (its
steps and its end row), so the steps of a ring (``T`` rows) belong to at most ``T // 2 + 1``
episodes counting the one in progress, which may have no row yet (after a next-step reset step):
``R`` records, one spare, never collide. One kind
of episode has no step: an unflagged reset right after a next-step reset step writes an end row
that ends nothing but the reset observation (``docs/trajectory.md``, *How add reads the episode
structure*). It takes no id of its own: the next episode keeps the id, and its record's first row
moves past that end row.

``add`` updates it with one kernel (``episode_index_add`` of :mod:`gper.ops.her.reference` and
:mod:`gper.ops.her.triton`), ``sample`` reads it in another (``her_pick``): ``[E]`` and ``[B]``
lanes, no host reads, no work proportional to the capacity outside the checkpoint's check.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

import torch

from gper.ops.trajectory.reference import END_ROW

#: the index's tensors in a state dict
TENSORS = ("episode_ids", "episode_current", "episode_records")


def ring_records(rows_per_env: int) -> int:
    """``R``: records per stream (see the module docstring for why they never collide)."""
    return rows_per_env // 2 + 2


class EpisodeIndex:
    """The episode bounds of every stored row of ``num_envs`` streams of ``rows_per_env`` rows."""

    def __init__(self, num_envs: int, rows_per_env: int, device: torch.device) -> None:
        self.num_envs, self.rows_per_env = num_envs, rows_per_env
        self.r = ring_records(rows_per_env)
        self.ids = torch.zeros(num_envs * rows_per_env, dtype=torch.int32, device=device)
        self.current = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.records = torch.full((num_envs, self.r, 2), -1, dtype=torch.int64, device=device)
        self.records[:, 0, 0] = 0  # the first episode of every stream starts at row 0

    @staticmethod
    def estimate_bytes(num_envs: int, rows_per_env: int) -> int:
        """Device bytes of the index: 4 a slot and 16 a record (about 12 bytes a slot in all)."""
        return num_envs * (4 * rows_per_env + 16 * ring_records(rows_per_env) + 8)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"episode_ids": self.ids, "episode_current": self.current, "episode_records": self.records}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.ids.copy_(state["episode_ids"])
        self.current.copy_(state["episode_current"])
        self.records.copy_(state["episode_records"])

    # ---------------------------------------------------------------- add

    def after_add(self, kernels: ModuleType, before: torch.Tensor, streams: torch.Tensor) -> None:
        """Index the rows one ``add`` wrote (``kernels.episode_index_add``), from the stream counts
        before it (``before``, a copy of ``streams`` [E, 2] int64) and after."""
        kernels.episode_index_add(
            before=before,
            streams=streams,
            ids=self.ids,
            current=self.current,
            records=self.records,
            rows_per_env=self.rows_per_env,
        )

    # ---------------------------------------------------------------- checkpoint

    def checks(
        self, state: Mapping[str, torch.Tensor], flags: torch.Tensor, streams: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Named failed-checks (0-d bool) of a state's episode index against its rows' flags words
        ``flags`` [E * T] int32 and stream counts ``streams`` [E, 2]: what :meth:`after_add`
        would have built, up to the first row of an episode whose first row was overwritten (any
        row at or before the oldest one stored) and the ids of end rows (never read)."""
        t, r, e_n = self.rows_per_env, self.r, self.num_envs
        device = flags.device
        ids = state["episode_ids"].to(device).long()
        current = state["episode_current"].to(device)
        records = state["episode_records"].to(device)
        count = streams[:, 0].clamp(min=0)
        held = count.clamp(max=t)
        oldest = count - held
        i = torch.arange(t, device=device, dtype=torch.int64)
        q = oldest[:, None] + i[None, :]  # stored row numbers, the oldest first
        present = i[None, :] < held[:, None]
        slot = (torch.arange(e_n, device=device, dtype=torch.int64) * t)[:, None] + torch.remainder(q, t)
        end_row = present & ((flags[slot] & END_ROW) != 0)
        step = present & ~end_row
        big = torch.full_like(q, 2**62)
        # the last end row before each row, the first one after it (among the stored rows)
        upto = torch.cummax(torch.where(end_row, q, -1), dim=1).values
        prev_end = torch.cat((torch.full_like(q[:, :1], -1), upto[:, :-1]), dim=1)
        from_here = torch.flip(torch.cummin(torch.flip(torch.where(end_row, q, big), (1,)), dim=1).values, (1,))
        next_end = torch.cat((from_here[:, 1:], big[:, :1]), dim=1)
        # an end row whose row before is a step ends an episode with an id; ids count them down
        real_end = end_row & torch.cat((torch.zeros_like(step[:, :1]), step[:, :-1]), dim=1)
        later = torch.flip(torch.cumsum(torch.flip(real_end.long(), (1,)), dim=1), (1,)) - real_end.long()
        want_id = torch.remainder(current[:, None] - later, r)
        row_id = ids[slot]
        id_ok = (row_id >= 0) & (row_id < r)
        cur_ok = (current >= 0) & (current < r)
        rec = records.reshape(-1, 2)
        at = (torch.arange(e_n, device=device, dtype=torch.int64) * r)[:, None] + row_id.clamp(0, r - 1)
        first, end = rec[at, 0], rec[at, 1]
        first_ok = torch.where(prev_end >= 0, first == prev_end + 1, (first >= 0) & (first <= oldest[:, None]))
        end_ok = end == torch.where(next_end < big, next_end, -1)
        cur_rec = rec[torch.arange(e_n, device=device) * r + current.clamp(0, r - 1)]
        bad_rows = step & ~(id_ok & (row_id == want_id) & first_ok & end_ok)
        return {
            f"an episode index id is outside [0, {r})": (~id_ok & step).any() | ~cur_ok.all(),
            "the episode index disagrees with the rows' episodes (ids, first or end rows)": bad_rows.any(),
            "the episode index's episode in progress disagrees with its stream": (
                (cur_rec[:, 0] != streams[:, 1]) | (cur_rec[:, 1] != -1)
            ).any(),
        }
