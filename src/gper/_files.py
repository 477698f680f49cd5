"""Files that a crash cannot leave half-written: write under a temporary name, flush, rename.

Used by the buffer's files (:mod:`gper.replay.files`) and the trainer's checkpoints
(:mod:`gper.training.checkpoints`); one place for the order of fsyncs and renames.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: prefix of the names a writer uses until its file or directory is complete
TEMP_PREFIX = ".tmp-"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """Open a binary file that appears at ``path`` only once it is complete.

    The body writes to a temporary file in ``path``'s folder; on success the file is flushed,
    fsynced and renamed over ``path``, and the folder is fsynced (so the rename survives a power
    loss). If the body raises, the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # some file systems and platforms cannot fsync a folder
        fsync_path(path.parent)


def fsync_path(path: str | os.PathLike) -> None:
    """Flush ``path`` (a file or a folder) to disk: its data, or a folder's entries (a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
