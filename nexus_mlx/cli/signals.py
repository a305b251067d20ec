"""Wait for Ctrl-C (SIGINT) or SIGTERM in the main thread, reliably while other threads run.

Why not ``KeyboardInterrupt``: CPython runs Python-level signal handlers only in the main thread,
and when the kernel delivers the signal to another thread (uvicorn's event loop, MLX's or
OpenBLAS's workers) the main thread can miss it while it blocks in ``Thread.join``: the
committed ``serve`` test caught a child whose main thread sat in ``join`` 60 s after SIGINT. The
C-level handler always writes the signal number to the wakeup fd
(:func:`signal.set_wakeup_fd`), whichever thread it runs on, so waiting on that fd cannot miss it.

Contract: ``wait_for_stop(running)`` blocks until ``running()`` turns false (returns None) or
one of ``signals`` arrives (returns its number). While it waits, those signals' handlers do
nothing but wake it; the previous handlers and wakeup fd are restored before it returns. It must
run in the main thread (:class:`~nexus_mlx.errors.ArgumentError` otherwise). It stops nothing.
"""

from __future__ import annotations

import select
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from nexus_mlx.errors import ArgumentError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
POLL_S = 0.5  # how often ``running()`` is checked


def _wake_only(signum: int, frame: FrameType | None) -> None:
    """A handler that does nothing: the wakeup fd carries the signal."""


def wait_for_stop(running: Callable[[], bool],
                  signals: Sequence[signal.Signals] = STOP_SIGNALS) -> int | None:
    """The signal that asked to stop, or None when ``running()`` ended first."""
    if threading.current_thread() is not threading.main_thread():
        raise ArgumentError("wait_for_stop must run in the main thread (signals arrive there)")
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous = {s: signal.signal(s, _wake_only) for s in signals}
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    wanted = {int(s) for s in signals}
    try:
        while running():
            ready, _, _ = select.select([reader], [], [], POLL_S)
            if not ready:
                continue
            for number in reader.recv(64):
                if number in wanted:
                    return number
        return None
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
        reader.close()
        writer.close()
