"""Catch Ctrl-C (SIGINT) and SIGTERM for a long-running command, reliably while other threads run.

Why not ``KeyboardInterrupt``: CPython runs Python-level signal handlers only in the main thread,
and when the kernel delivers the signal to another thread (uvicorn's event loop, MLX's or
OpenBLAS's workers) the main thread can miss it while it blocks in ``Thread.join``: a
faulthandler dump of the ``serve`` test caught a child whose main thread sat in ``join`` 60 s
after SIGINT. The C-level handler writes the signal number to the wakeup fd
(:func:`signal.set_wakeup_fd`) whichever thread it runs on, so waiting on that fd cannot miss it;
and the Python-level handler installed here records the signal too, so one that arrived while
the handlers were being installed is not lost either.

Contract: ``with StopSignals() as stop: ...; stop.wait(running)``. Entering installs the
handlers and the wakeup fd (install them before telling anyone the process is ready, e.g.
before printing a server's URL); ``wait(running)`` blocks until one of the signals arrives
(returns its number, also when it came before ``wait``) or ``running()`` turns false (returns
None). Leaving restores the previous handlers and wakeup fd. Only the main thread may enter
(:class:`~nexus_mlx.errors.ArgumentError` otherwise). It stops nothing itself.
"""

from __future__ import annotations

import select
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

from nexus_mlx.errors import ArgumentError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
POLL_S = 0.5  # how often ``running()`` is checked


class StopSignals:
    """The stop signals of one command (see the module docstring)."""

    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received: list[int] = []
        self._previous: dict[signal.Signals, Any] = {}
        self._old_fd = -1
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            raise ArgumentError("StopSignals must be entered in the main thread (signals arrive "
                                "there)")
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._previous = {s: signal.signal(s, self._record) for s in self.signals}
        return self

    def wait(self, running: Callable[[], bool]) -> int | None:
        """The signal that asked to stop, or None when ``running()`` ended first."""
        assert self._reader is not None, "wait() outside the with block"
        wanted = {int(s) for s in self.signals}
        while True:
            if self.received:
                return self.received[0]
            if not running():
                return None
            ready, _, _ = select.select([self._reader], [], [], POLL_S)
            if ready:
                for number in self._reader.recv(64):
                    if number in wanted:
                        return number

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        for sock in (self._reader, self._writer):
            if sock is not None:
                sock.close()
        self._reader = self._writer = None
