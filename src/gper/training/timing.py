"""Per-phase timing of repeated steps: CUDA events on the work's stream, read once an epoch.

On CUDA each timed step records one event at the start of every phase and one at its end, on
the stream the work runs on, so timing adds no synchronisation: the events are read after the
epoch's single sync. On the CPU the same calls take ``time.perf_counter`` readings (host time).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class PhaseTimer:
    """Collects the durations of named phases over many steps; :meth:`summary` averages them."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._records: list[list[tuple[str, object]]] = []
        self._current: list[tuple[str, object]] | None = None
        self._pool: list[torch.cuda.Event] = []

    def _stamp(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self) -> None:
        self._current = []

    def mark(self, name: str) -> None:
        """The phase ``name`` starts now (and the previous one ends)."""
        self._current.append((name, self._stamp()))

    def end(self) -> None:
        self._current.append(("", self._stamp()))
        self._records.append(self._current)
        self._current = None

    def summary(self) -> dict[str, tuple[float, int]]:
        """``{phase: (mean ms, steps timed)}`` since the last call; CUDA events must have completed
        (call after the epoch's synchronisation)."""
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for record in self._records:
            for (name, start), (_, stop) in zip(record, record[1:], strict=False):
                if self.cuda:
                    ms = start.elapsed_time(stop)
                else:
                    ms = (stop - start) * 1e3
                total[name] += ms
                count[name] += 1
            if self.cuda:
                self._pool.extend(stamp for _, stamp in record)
        self._records = []
        return {name: (total[name] / count[name], count[name]) for name in total}
