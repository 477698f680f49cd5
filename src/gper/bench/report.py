"""What a benchmark run prints and writes: the header line naming the machine, versions and commit;
aligned tables (rich when installed and printing to a terminal, plain text otherwise); CSV and
Markdown result files. Nothing here knows what was timed: rows are lists of strings.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

import gper

#: where result files go unless ``--out`` says otherwise (relative to the working directory)
DEFAULT_OUT = Path("benchmarks/results")
#: set this to the commit when the tree being run has no ``.git`` (e.g. a copy on another machine)
COMMIT_ENV = "GPER_BENCH_COMMIT"


def git_commit(cwd: Path | None = None) -> str:
    """Short hash of HEAD, with ``-dirty`` if tracked files changed; ``unknown`` without git.

    The environment variable ``GPER_BENCH_COMMIT`` takes precedence, for copies of the tree that
    travel without their ``.git``.
    """
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    cwd = cwd or Path(gper.__file__).resolve().parent
    git = shutil.which("git")
    if git is None:
        return "unknown"
    base = [git, "-c", "safe.directory=*"]
    try:
        head = subprocess.run(
            [*base, "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        status = subprocess.run(
            [*base, "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def environment(device: torch.device) -> dict[str, str]:
    """Machine, versions, commit and date of this run, as strings."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    now = _dt.datetime.now().astimezone()
    env = {
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "gper": gper.__version__,
        "commit": git_commit(),
        "date": now.strftime("%Y-%m-%d %H:%M:%S %Z").strip(),
        "stamp": now.strftime("%Y%m%d-%H%M%S"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device"] = props.name
        env["device_detail"] = (
            f"CUDA {torch.version.cuda}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB"
        )
        env["slug"] = slug(props.name)
    else:
        env["device"] = f"CPU: {cpu_model()}"
        env["device_detail"] = f"{os.cpu_count()} threads; ran on the CPU, not a GPU"
        env["slug"] = "cpu"
    return env


def header_line(env: dict[str, str], what: str = "bench") -> str:
    """One line naming the device, the versions, the commit and the date."""
    return (
        f"gper {env['gper']} {what} | {env['device']} ({env['device_detail']}) | torch {env['torch']} | "
        f"triton {env['triton']} | python {env['python']} | commit {env['commit']} | {env['date']}"
    )


def slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``: safe in a file name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def format_plain(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """An aligned plain-text table; columns flagged in ``right`` are right-aligned (numbers)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_markdown(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A GitHub-flavoured Markdown table."""
    rule = ["---:" if r else "---" for r in right]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [list(headers), rule, *rows])


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool], title: str | None = None
) -> None:
    """Print a table to stdout: with rich on a terminal if it is installed, else as plain text."""
    if sys.stdout.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            pass
        else:
            table = Table(title=title, title_justify="left")
            for h, r in zip(headers, right, strict=True):
                table.add_column(h, justify="right" if r else "left")
            for row in rows:
                table.add_row(*row)
            Console().print(table)
            return
    if title:
        print(title)
    print(format_plain(headers, rows, right))


class ResultFiles:
    """``<prefix>-<device>-<stamp>.csv`` and ``.md`` in ``out``, and other files of the same stem.

    The CSV is written as rows arrive (:meth:`append` adds rows, :meth:`rewrite` writes all of
    them again), so a run cut short keeps what it measured; the Markdown is written at the end.

    Args:
        out: the results directory (created if missing).
        env: :func:`environment` of the run (its ``slug`` and ``stamp`` name the files).
        columns: the CSV's columns; None for a run that writes no CSV.
        prefix: first word of the file names.
    """

    def __init__(self, out: Path, env: dict[str, str], columns: Sequence[str] | None, prefix: str = "bench") -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.stem = f"{prefix}-{env['slug']}-{env['stamp']}"
        self.out = out
        self.csv_path = out / f"{self.stem}.csv" if columns is not None else None
        self.md_path = out / f"{self.stem}.md"
        self.columns = list(columns or ())
        if self.csv_path is not None:
            self._write_header()

    def path(self, suffix: str) -> Path:
        """Another file of this run: ``path(".png")``."""
        return self.out / f"{self.stem}{suffix}"

    def _write_header(self) -> None:
        with open(self.csv_path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerow(self.columns)

    def append(self, rows: Sequence[dict[str, object]]) -> None:
        """Append rows (dicts keyed by column) and flush, so a run cut short keeps what it measured."""
        with open(self.csv_path, "a", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            for row in rows:
                writer.writerow({k: "" if row.get(k) is None else row[k] for k in self.columns})

    def rewrite(self, rows: Sequence[dict[str, object]]) -> None:
        """Write the CSV again with these rows only (for a run whose rows change order as they arrive)."""
        self._write_header()
        self.append(rows)

    def write_markdown(self, text: str) -> None:
        self.md_path.write_text(text, encoding="utf-8")
