"""Catching stop signals: a signal sent to the process ends the wait whichever thread the kernel
hands it to, one that came before the wait is not lost, the previous handlers come back, and the
wait ends when the server does."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from nexus_mlx.cli.signals import StopSignals
from nexus_mlx.errors import ArgumentError


def _send_later(signum: int, delay: float = 0.2) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), os.kill(os.getpid(), signum)))
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_ends_the_wait_and_the_handlers_come_back(signum):
    before = signal.getsignal(signum)
    busy = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(busy.is_set, True)])
    spinner.start()  # another thread running Python code, as uvicorn's loop does
    try:
        with StopSignals() as stop:
            sender = _send_later(signum)
            start = time.monotonic()
            assert stop.wait(lambda: True) == signum
            assert time.monotonic() - start < 5
            sender.join()
    finally:
        busy.set()
        spinner.join()
    assert signal.getsignal(signum) is before
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was restored (none was set)


def test_a_signal_before_the_wait_is_not_lost():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # e.g. Ctrl-C while the server was starting
        time.sleep(0.05)
        assert stop.wait(lambda: False) == signal.SIGINT  # even though the server has ended


def test_the_wait_ends_when_the_server_does():
    deadline = time.monotonic() + 0.3
    with StopSignals() as stop:
        assert stop.wait(lambda: time.monotonic() < deadline) is None


def test_other_signals_do_not_end_the_wait():
    deadline = time.monotonic() + 1.0
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        with StopSignals() as stop:
            sender = _send_later(signal.SIGUSR1)
            assert stop.wait(lambda: time.monotonic() < deadline) is None
            sender.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_only_the_main_thread_may_catch_them():
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with StopSignals():
                pass
        except ArgumentError as exc:
            errors.append(exc)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])
