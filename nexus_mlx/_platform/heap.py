"""Hand the C heap's free pages back to the operating system (glibc's ``malloc_trim``).

Contract: :func:`trim_heap` calls ``malloc_trim(0)`` and returns True when it released memory,
False when there was none to release, and None where the C library has no such call (macOS,
musl, Windows), doing nothing there. :class:`HeapTrimmer` ``(interval_s)`` calls it at most once
per ``interval_s`` seconds: :meth:`HeapTrimmer.claim` answers True to one caller once
``interval_s`` has passed since the last claim (and to the first), and :meth:`HeapTrimmer.trim`
runs a trim and records its count and time (``stats()``). Thread-safe.

Why: a long-running process that frees memory in many sizes (a server's requests) leaves free
pages inside glibc's heaps that it does not return on its own (``bench/server_memory.py``: 200
turns of agent traffic took an untrimmed server from 2,713 to 3,263 MiB; trimmed every 10 s it
stayed within 2,708-3,228 MiB). It frees nothing that is in use; MLX's own buffer cache is
memory in use as far as the C heap knows, and stays.

It imports only the standard library and knows nothing of servers or MLX.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
import time
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim`` (looked up once), or None where it has none."""
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


def trim_heap() -> bool | None:
    """``malloc_trim(0)``: True if memory went back to the OS, None if the libc has no trim."""
    fn = _malloc_trim()
    return None if fn is None else bool(fn(0))


class HeapTrimmer:
    """Trims at most once per ``interval_s`` seconds (see the module docstring)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) \
                or not interval_s >= 0:
            raise ValueError(f"interval_s must be a number >= 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self.trims = 0
        self.seconds = 0.0

    def claim(self) -> bool:
        """True when ``interval_s`` has passed since the last claim (or there was none): the
        caller should trim. Of callers racing, one gets True."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self.interval_s:
                return False
            self._last = now
            return True

    def trim(self) -> bool | None:
        """Trim now (:func:`trim_heap`'s answer) and count it."""
        start = time.perf_counter()
        released = trim_heap()
        with self._lock:
            if released is not None:
                self.trims += 1
                self.seconds += time.perf_counter() - start
        return released

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {"heap_trims": self.trims, "heap_trim_ms": round(self.seconds * 1e3, 1)}
