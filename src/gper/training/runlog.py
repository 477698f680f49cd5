"""The run folder's record: ``config.json``, ``metrics.jsonl`` (CleanRL's metric names),
``summary.json``, and TensorBoard event files with the same records (:mod:`gper.training.tensorboard`).

Each line of ``metrics.jsonl`` is one record: ``{"global_step": ..., "<name>": value, ...}``,
with the names CleanRL's ``dqn.py`` logs (``charts/episodic_return``, ``charts/episodic_length``,
``charts/SPS``, ``losses/td_loss``, ``losses/q_values``) plus ``charts/epsilon``, ``charts/beta``,
``eval/<name>`` and ``timing/<phase>_ms``. Records are written in the order of their steps.
:func:`gper.training.plot.plot_run` draws them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gper.training.checkpoints import atomic_write
from gper.training.tensorboard import EventLog, event_files

METRICS = "metrics.jsonl"


class RunLog:
    """Writes the record of one run under ``folder`` (created).

    Args:
        folder: the run folder.
        metrics_bytes: continue a run from a checkpoint: keep the first ``metrics_bytes`` bytes of
            its ``metrics.jsonl`` (the length :meth:`metrics_bytes` returned when the checkpoint was
            written), dropping the records of a run that went on past it, then append. Without it
            the record starts afresh: an earlier ``metrics.jsonl`` and event files in ``folder``
            (of a run that left no checkpoints there) are replaced.
        history: with ``metrics_bytes``, continue the record of another run folder's ``metrics.jsonl``
            (``history``) in ``folder``: its first ``metrics_bytes`` bytes start this one.
    """

    def __init__(
        self, folder: str | Path, metrics_bytes: int | None = None, *, history: str | Path | None = None
    ) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.folder / METRICS
        self.events: EventLog | None = None
        """the TensorBoard event file the records also go to, once :meth:`open_events` opened it"""
        self.continues = metrics_bytes is not None and history is None
        """whether this record continues the one already in ``folder``"""
        if metrics_bytes is None or history is not None:  # a record afresh here: no earlier run's events
            for path in event_files(self.folder):
                path.unlink()
        if metrics_bytes is None:
            self.metrics_path.unlink(missing_ok=True)
        elif history is not None:
            with Path(history).open("rb") as src, self.metrics_path.open("wb") as dst:
                shutil.copyfileobj(_Prefix(src, metrics_bytes), dst)
        elif self.metrics_path.exists() and self.metrics_path.stat().st_size > metrics_bytes:
            with self.metrics_path.open("r+b") as f:
                f.truncate(metrics_bytes)
        self._file = self.metrics_path.open("a", encoding="utf-8")

    def open_events(self, text: Mapping[str, str] | None = None) -> Path:
        """Write the records to a TensorBoard event file in the run folder too, from now on and the
        ones before: the folder's event files are rewritten from ``metrics.jsonl`` (so a continued
        record shows each step once, with what ``metrics.jsonl`` holds: see
        :mod:`gper.training.tensorboard`). ``text``: entries (tag -> Markdown) written first (the
        settings table). Returns the folder.

        Raises:
            ImportError: the ``tensorboard`` package is not installed (the folder's event files are
                then left as they were).
        """
        self._file.flush()
        rows = read_metrics(self.metrics_path)
        old = event_files(self.folder)
        self.events = EventLog(self.folder)
        for path in old:
            path.unlink()
        for tag, value in (text or {}).items():
            self.events.text(tag, value)
        self.events.records(rows)
        self.events.flush()
        return self.folder

    def write_json(self, name: str, data: Mapping[str, Any]) -> Path:
        """Write ``name`` in the run folder atomically: it holds the old content or the whole new one."""
        text = json.dumps(data, indent=2, default=str) + "\n"
        return atomic_write(self.folder / name, lambda f: f.write(text.encode("utf-8")))

    def metrics_bytes(self) -> int:
        """Flush ``metrics.jsonl`` (and the event file) to disk and return its length in bytes (what a
        checkpoint records: fsynced, so a checkpoint that survives a power loss never points past its end)."""
        self.flush()
        os.fsync(self._file.fileno())
        return os.fstat(self._file.fileno()).st_size

    def log(self, global_step: int, **values: float) -> None:
        """One record; names may contain ``/`` (pass them with ``**{"charts/SPS": ...}``)."""
        row = {"global_step": int(global_step)}
        row.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()})
        self._file.write(json.dumps(row) + "\n")
        if self.events is not None:
            self.events.scalars(row["global_step"], values)

    def log_episodes(self, records: Iterable[tuple[int, str, float, str, int]]) -> None:
        """Records ``(global_step, return name, return, length name, length)``, one line each, what
        :meth:`log` writes for ``log(step, **{return_name: ret, length_name: length})``, formatted
        without a dict and ``json.dumps`` a line (a population can finish 10^5 episodes an epoch)."""
        lines, quoted = [], {}
        for step, ret_name, ret, len_name, length in records:
            if ret_name not in quoted:
                quoted[ret_name], quoted[len_name] = json.dumps(ret_name), json.dumps(len_name)
            value = repr(float(ret)) if math.isfinite(ret) else "null"
            lines.append(
                f'{{"global_step": {int(step)}, {quoted[ret_name]}: {value}, {quoted[len_name]}: {int(length)}}}\n'
            )
            if self.events is not None:
                self.events.scalars(int(step), {ret_name: ret, len_name: length})
        self._file.write("".join(lines))

    def log_agent_episodes(self, steps: list[int], agents: list[int], returns: list[float], lengths: list[int]) -> None:
        """A population's episodes, one record each as :meth:`log_episodes` writes them, with the
        names ``agent_<a>/charts/episodic_return`` and ``agent_<a>/charts/episodic_length``: from
        columns, each name quoted once (a population can finish 10^5 episodes an epoch)."""
        if not steps:
            return
        if self.events is not None or not all(map(math.isfinite, returns)):  # the general path, record by record
            self.log_episodes(
                (s, f"agent_{a}/charts/episodic_return", r, f"agent_{a}/charts/episodic_length", n)
                for s, a, r, n in zip(steps, agents, returns, lengths, strict=True)
            )
            return
        top = max(agents) + 1
        ret = [f", {json.dumps(f'agent_{a}/charts/episodic_return')}: " for a in range(top)]
        length = [f", {json.dumps(f'agent_{a}/charts/episodic_length')}: " for a in range(top)]
        self._file.write(
            "".join(
                [
                    f'{{"global_step": {s}{ret[a]}{r!r}{length[a]}{n}}}\n'
                    for s, a, r, n in zip(steps, agents, returns, lengths, strict=True)
                ]
            )
        )

    def flush(self) -> None:
        self._file.flush()
        if self.events is not None:
            self.events.flush()

    def close(self) -> None:
        self._file.close()
        if self.events is not None:
            self.events.close()


class _Prefix:
    """The first ``n`` bytes of a binary file, for :func:`shutil.copyfileobj`."""

    def __init__(self, f: Any, n: int) -> None:
        self.f, self.left = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.f.read(size)
        self.left -= len(data)
        return data


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (none when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
