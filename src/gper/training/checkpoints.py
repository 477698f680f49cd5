"""Checkpoints that survive crashes: written under a temporary name, flushed to disk, renamed into place.

A checkpoint is a directory ``<folder>/step-<env step:012d>/`` of files. :func:`write_checkpoint`
builds it as ``.tmp-step-<env step:012d>/``, fsyncs every file and the directory, renames it into
place with :func:`os.replace` and fsyncs ``<folder>``: a directory with a ``step-`` name is
complete, whenever the process was killed (or the machine lost power). Names that start with
``.tmp-`` are what a killed writer left behind: :func:`list_checkpoints` ignores them,
:func:`remove_temporaries` deletes them. Old checkpoints are deleted (:func:`prune`) only once a
newer one is complete. :func:`atomic_write` does the same for a single file.

Setting the environment variable ``GPER_CHECKPOINT_PAUSE`` to a number of seconds makes the writer
sleep that long after each file of a checkpoint, the last one included (so before the rename):
tests use it to kill a process at exactly those moments.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from gper._files import TEMP_PREFIX, atomic_file, fsync_path

#: seconds to sleep after each file of a checkpoint (for crash tests; unset: no pause)
PAUSE_ENV = "GPER_CHECKPOINT_PAUSE"

_NAME = re.compile(r"step-(\d{12})(\.replaced)?")
#: suffix of a complete checkpoint moved aside while the same step is written again
REPLACED = ".replaced"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message (one line) names the file and what is wrong."""


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint at env step ``step``: ``step-<step:012d>``."""
    if step < 0:
        raise ValueError(f"a checkpoint's step must be >= 0, got {step}")
    return f"step-{step:012d}"


def step_of(path: str | Path) -> int | None:
    """The env step in a complete checkpoint's directory name, or None for any other name."""
    match = _NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(folder: str | Path) -> list[Path]:
    """The complete checkpoints in ``folder``, oldest first (none when it does not exist).

    A ``step-N.replaced`` directory (a complete checkpoint moved aside while step N was written
    again) counts when no ``step-N`` exists: the writer died between its two renames."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    by_step: dict[int, Path] = {}
    for p in sorted(folder.iterdir(), key=lambda p: p.name.endswith(REPLACED)):  # step-N before step-N.replaced
        step = step_of(p)
        if p.is_dir() and step is not None:
            by_step.setdefault(step, p)
    return [by_step[k] for k in sorted(by_step)]


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete what killed writers left in ``folder`` (names starting ``.tmp-``); return their paths."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = sorted(p for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX))
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return removed


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Write the file ``path`` so that it holds either its old content or the whole new one:
    ``write`` gets an open binary file (under a unique temporary name in the same folder), which
    is then fsynced and renamed over ``path`` (:func:`gper._files.atomic_file`). If ``write``
    raises, the temporary file is deleted and ``path`` is untouched."""
    with atomic_file(path) as f:
        write(f)
    return Path(path)


def write_checkpoint(
    folder: str | Path, step: int, files: Mapping[str, Callable[[Path], object]], keep: int | None = None
) -> Path:
    """Write the checkpoint ``<folder>/step-<step:012d>/``, one file per entry of ``files``.

    Each writer is called with its file's path inside the temporary directory and writes it there;
    every file and the directory are fsynced before the directory is renamed into place. If a
    writer raises, the temporary directory is deleted and the checkpoints already in ``folder``
    are untouched. Then, with ``keep``, :func:`prune` keeps the newest ``keep``.

    Returns:
        The complete checkpoint's directory.
    """
    tmp = start_checkpoint(folder, step)
    try:
        write_files(tmp, files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return finish_checkpoint(tmp, keep)


def write_files(tmp: str | Path, files: Mapping[str, Callable[[Path], object]]) -> None:
    """Write one file per entry of ``files`` into the temporary checkpoint directory ``tmp``, each
    writer called with its file's path, each file fsynced once written."""
    for name, write in files.items():
        path = Path(tmp) / name
        write(path)
        fsync_path(path)
        _pause()


def start_checkpoint(folder: str | Path, step: int) -> Path:
    """The empty temporary directory of the checkpoint at ``step`` in ``folder`` (what a killed
    writer left there is deleted first). Write its files, each fsynced, then :func:`finish_checkpoint`;
    :func:`write_checkpoint` does both. Several processes may write their own files into it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{TEMP_PREFIX}{checkpoint_name(step)}"
    if tmp.exists():  # left by a writer that was killed
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def finish_checkpoint(tmp: str | Path, keep: int | None = None) -> Path:
    """Put the temporary directory ``tmp`` of :func:`start_checkpoint`, its files written and fsynced,
    into place as a complete checkpoint (deleted if that fails); then, with ``keep``, :func:`prune`.

    Returns:
        The complete checkpoint's directory.
    """
    tmp = Path(tmp)
    final = tmp.with_name(tmp.name[len(TEMP_PREFIX) :])
    try:
        fsync_path(tmp)
        _rename_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(final.parent)
    if keep is not None:
        prune(final.parent, keep, final)
    return final


def prune(folder: str | Path, keep: int, current: str | Path) -> list[Path]:
    """Delete checkpoints of ``folder`` beyond the newest ``keep`` up to ``current`` (which counts as one).

    Checkpoints of later steps than ``current`` are deleted too: they were left by a run that has
    since been resumed from an earlier checkpoint, and this run is writing their steps again.
    Returns the deleted directories.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    newest = step_of(current)
    if newest is None:
        raise ValueError(f"{current} is not a complete checkpoint's directory")
    found = list_checkpoints(folder)
    later = [p for p in found if step_of(p) > newest]
    older = [p for p in found if step_of(p) <= newest][:-keep]
    kept = {step_of(p) for p in found} - {step_of(p) for p in later + older}
    # copies moved aside whose step has its own directory again, or whose step is pruned
    stale = [p for p in Path(folder).glob(f"step-*{REPLACED}") if p not in found or step_of(p) not in kept]
    for path in later + older + stale:
        shutil.rmtree(path, ignore_errors=path in stale)
    return later + older


def _rename_into_place(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.replace(tmp, final)
        return
    # the same step written again (a finished run resumed): a directory cannot be renamed over
    # another one, so the old one moves aside first, under a name list_checkpoints still counts
    # (step-N.replaced): a crash between the two renames leaves it as step N's checkpoint
    old = final.with_name(final.name + REPLACED)
    if old.exists():
        shutil.rmtree(old)
    os.replace(final, old)
    fsync_path(final.parent)
    os.replace(tmp, final)
    fsync_path(final.parent)
    shutil.rmtree(old)


def _pause() -> None:
    seconds = os.environ.get(PAUSE_ENV)
    if seconds:
        time.sleep(float(seconds))
