"""SIGINT and SIGTERM as requests to stop at the next consistent point, rather than anywhere.

Inside ``with StopSignals() as stop:`` the first SIGINT or SIGTERM only sets ``stop.requested``;
the loop checks it between steps, writes a checkpoint and raises :meth:`StopSignals.exception`:
``KeyboardInterrupt`` for SIGINT, ``SystemExit(128 + SIGTERM)`` (exit status 143) for SIGTERM, the
status a shell reports for a process ended by SIGTERM. A second signal while the first is being
handled raises at once (a checkpoint being written is then left incomplete, so the previous one
stays the newest), unless it comes within :data:`DUPLICATE_S` of the first: that is the same
request delivered twice (GNU ``timeout`` signals its command, then the command's process group).
The previous handlers come back when the block ends. A signal that was ignored when the block
started stays ignored, and outside the main thread (where Python cannot install handlers) nothing
is installed.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

#: the signals that ask to stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: seconds after the first stop signal within which another is the same request delivered twice,
#: not a second one: GNU ``timeout -s INT`` signals its command and then the command's process
#: group, so the command gets two SIGINTs microseconds apart (which once cut a run's record short)
DUPLICATE_S = 0.25


class StopSignals:
    """Context manager: SIGINT and SIGTERM set :attr:`received` instead of interrupting."""

    def __init__(self) -> None:
        self.received: int | None = None
        """the first stop signal received, or None"""
        self._at = 0.0  # when it came (time.monotonic)
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived."""
        return self.received is not None

    @property
    def name(self) -> str:
        """The received signal's name (``SIGINT``, ``SIGTERM``); empty when none arrived."""
        return signal.Signals(self.received).name if self.received is not None else ""

    def exception(self) -> BaseException:
        """What to raise once the loop has stopped: KeyboardInterrupt for SIGINT, SystemExit(143) for SIGTERM."""
        return _exception(self.received)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue
                self._previous[sig] = previous
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.received is not None and now - self._at >= DUPLICATE_S:  # asked twice: stop now
            raise _exception(signum)
        if self.received is None:
            self.received, self._at = signum, now


def _exception(signum: int | None) -> BaseException:
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    if signum is None:
        raise RuntimeError("no stop signal was received")
    return SystemExit(128 + signum)
