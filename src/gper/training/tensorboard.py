"""TensorBoard event files beside ``metrics.jsonl``: the same records, under the same names, at the same steps.

:class:`EventLog` writes through ``torch.utils.tensorboard.SummaryWriter`` into the run folder
itself (``tensorboard --logdir runs`` then lists each run folder as one run). Each record of
:class:`~gper.training.runlog.RunLog` becomes one event holding all its finite values as scalars
(TensorBoard stores them as float32); non-finite values, which ``metrics.jsonl`` writes as
``null``, are left out.

A record continued from a checkpoint rewrites its folder's event files from ``metrics.jsonl``,
the record's own truth (:meth:`~gper.training.runlog.RunLog.open_events`): no step appears twice
(the records a run wrote past its checkpoint before it died are gone from both), the records of a
stretch run with event files off are there too, and nothing depends on the order TensorBoard
reads several files of a folder in (by name, which starts with the second a file was made).

Needs the ``tensorboard`` package (``pip install ".[tensorboard]"``); without it, opening an
:class:`EventLog` raises ``ImportError``, and :func:`installed` (the trainer's default for writing
event files) is False.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: the names TensorBoard's writers give event files
EVENTS_PREFIX = "events.out.tfevents."


def installed() -> bool:
    """Whether the ``tensorboard`` package can be imported (found without importing it)."""
    if "tensorboard" in sys.modules:
        return sys.modules["tensorboard"] is not None
    return importlib.util.find_spec("tensorboard") is not None


def event_files(folder: str | Path) -> list[Path]:
    """The TensorBoard event files directly in ``folder``, in the order TensorBoard reads them."""
    folder = Path(folder)
    return sorted(p for p in folder.glob(f"{EVENTS_PREFIX}*") if p.is_file()) if folder.is_dir() else []


class EventLog:
    """One TensorBoard event file in ``folder`` (created), written with ``SummaryWriter``.

    Args:
        folder: the run folder.

    Raises:
        ImportError: the ``tensorboard`` package is not installed.
    """

    def __init__(self, folder: str | Path) -> None:
        try:
            from tensorboard.compat.proto.summary_pb2 import Summary
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError("TensorBoard event files need the tensorboard package") from err
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._summary = Summary
        self.writer = SummaryWriter(str(self.folder))
        # one event per record, all its values in it: half the cost of one add_scalar per value
        self._file = self.writer._get_file_writer()

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """One event at ``step`` with every finite number of ``values`` as a scalar named by its key."""
        Value = self._summary.Value
        kept = [
            Value(tag=name, simple_value=float(v))
            for name, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        ]
        if kept:
            self._file.add_summary(self._summary(value=kept), int(step))

    def records(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Write records of ``metrics.jsonl`` (``{"global_step": ..., name: value, ...}``), in order."""
        for row in rows:
            self.scalars(row["global_step"], {k: v for k, v in row.items() if k != "global_step"})

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """A text entry (Markdown), shown under TensorBoard's Text tab."""
        self.writer.add_text(tag, text, step)

    def flush(self) -> None:
        """Write what is queued to the event file."""
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
