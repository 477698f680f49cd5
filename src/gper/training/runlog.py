"""The run folder: ``config.json``, ``metrics.jsonl`` (CleanRL's metric names), ``summary.json``
and ``plot.png`` (episodic return and per-phase times against env steps).

Each line of ``metrics.jsonl`` is one record: ``{"global_step": ..., "<name>": value, ...}``,
with the names CleanRL's ``dqn.py`` logs (``charts/episodic_return``, ``charts/episodic_length``,
``charts/SPS``, ``losses/td_loss``, ``losses/q_values``) plus ``charts/epsilon``, ``charts/beta``
and ``timing/<phase>_ms``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gper.training.checkpoints import atomic_write


class RunLog:
    """Writes the files of one run under ``folder`` (created).

    Args:
        folder: the run folder.
        metrics_bytes: continue a run from a checkpoint: cut ``metrics.jsonl`` back to the length
            :meth:`metrics_bytes` returned when the checkpoint was written, dropping the records
            of a run that went on past it, then append.
    """

    def __init__(self, folder: str | Path, metrics_bytes: int | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.folder / "metrics.jsonl"
        if metrics_bytes is not None and self.metrics_path.exists():
            if self.metrics_path.stat().st_size > metrics_bytes:
                with self.metrics_path.open("r+b") as f:
                    f.truncate(metrics_bytes)
        self._file = self.metrics_path.open("a", encoding="utf-8")

    def write_json(self, name: str, data: Mapping[str, Any]) -> Path:
        """Write ``name`` in the run folder atomically: it holds the old content or the whole new one."""
        text = json.dumps(data, indent=2, default=str) + "\n"
        return atomic_write(self.folder / name, lambda f: f.write(text.encode("utf-8")))

    def metrics_bytes(self) -> int:
        """Flush ``metrics.jsonl`` to disk and return its length in bytes (what a checkpoint
        records: fsynced, so a checkpoint that survives a power loss never points past its end)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return os.fstat(self._file.fileno()).st_size

    def log(self, global_step: int, **values: float) -> None:
        """One record; names may contain ``/`` (pass them with ``**{"charts/SPS": ...}``)."""
        row = {"global_step": int(global_step)}
        row.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()})
        self._file.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_run(metrics_path: str | Path, out: str | Path, title: str = "") -> Path | None:
    """Plot episodic return (and its 100-episode mean) and the per-phase times against env steps.

    Returns the PNG's path, or None when matplotlib cannot be imported.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_metrics(metrics_path)
    episodes = [(r["global_step"], r["charts/episodic_return"]) for r in rows if "charts/episodic_return" in r]
    timing = [r for r in rows if any(k.startswith("timing/") for k in r)]
    fig, (ax_ret, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    if episodes:
        steps, returns = zip(*episodes, strict=True)
        ax_ret.plot(steps, returns, ".", ms=2, alpha=0.3, label="episode")
        window = [
            sum(returns[max(0, i - 99) : i + 1]) / len(returns[max(0, i - 99) : i + 1]) for i in range(len(returns))
        ]
        ax_ret.plot(steps, window, "-", lw=2, label="mean of last 100")
        ax_ret.legend(loc="lower right")
    ax_ret.set_xlabel("env steps")
    ax_ret.set_ylabel("episodic return")
    ax_ret.set_title(f"{title} return" if title else "return")
    names = sorted({k for r in timing for k in r if k.startswith("timing/")})
    for name in names:
        pts = [(r["global_step"], r[name]) for r in timing if r.get(name) is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax_time.plot(xs, ys, "o-", ms=3, label=name.removeprefix("timing/"))
    ax_time.set_xlabel("env steps")
    ax_time.set_ylabel("ms per step (mean over the epoch)")
    ax_time.set_title("phase times")
    if names:
        ax_time.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
