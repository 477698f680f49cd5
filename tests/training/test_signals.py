"""StopSignals: SIGINT and SIGTERM become a request to stop, the previous handlers come back."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from gper.training.signals import DUPLICATE_S, StopSignals


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)])
def test_a_signal_becomes_a_request_and_the_handlers_come_back(sig, expected):
    before = signal.getsignal(sig)
    with StopSignals() as stop:
        assert not stop.requested
        signal.raise_signal(sig)
        assert stop.requested and stop.name == sig.name
        error = stop.exception()
    assert signal.getsignal(sig) is before
    assert isinstance(error, expected)
    if expected is SystemExit:
        assert error.code == 128 + signal.SIGTERM  # 143, what a shell reports for SIGTERM


def test_a_second_signal_stops_at_once():
    with StopSignals() as stop, pytest.raises(SystemExit):
        signal.raise_signal(signal.SIGTERM)
        time.sleep(DUPLICATE_S + 0.05)
        signal.raise_signal(signal.SIGTERM)
    assert stop.received == signal.SIGTERM


def test_the_same_signal_twice_at_once_is_one_request():
    """GNU ``timeout -s INT`` signals its command, then the command's process group: two SIGINTs
    microseconds apart are one request to stop, which must still write its checkpoint."""
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # handled on its own here, as a busy process may handle it
        assert stop.requested and stop.name == "SIGINT"


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            signal.raise_signal(signal.SIGTERM)
            assert not stop.requested and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_outside_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def run():
        with StopSignals() as stop:
            seen.append((signal.getsignal(signal.SIGTERM), stop.requested))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [(before, False)]
