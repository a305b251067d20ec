"""Run a release once the server has been idle for a while (MLX's buffer cache, the C heap).

Contract: ``IdleRelease(idle_s, release, busy)``; :meth:`IdleRelease.activity` is called when a
request ends. Once ``idle_s`` seconds have passed since the last call and ``busy()`` (requests
in flight) is false, ``release()`` runs once (on a short-lived watcher thread, which calls it
and ends; ``release`` itself decides where its work runs) and ``releases`` counts it. A request
that ends while the watcher waits moves the deadline; one that ends after a release starts a new
watcher, so every idle period after activity gets one release and an idle server none more. A
failing ``release`` is logged and counted in ``failures``, never raised. :meth:`close` stops a
waiting watcher (no release) and waits for it; later activity starts nothing.

Why: an idle server holds what its last requests left: MLX's cache of freed buffers (up to
2 GiB on the Linux CPU, :mod:`nexus_mlx._platform.cpu_cache`; on Metal, GPU memory in the
unified memory the rest of the machine uses) and free pages in the C heap. Keeping them between
requests in a burst saves re-allocation; keeping them for an idle hour helps nobody.

It knows nothing about MLX, HTTP or requests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
MIN_WAIT_S = 0.05


class IdleRelease:
    """See the module docstring."""

    def __init__(self, idle_s: float, release: Callable[[], None], busy: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(idle_s, bool) or not isinstance(idle_s, int | float) or not idle_s >= 0 \
                or idle_s == float("inf"):
            raise ValueError(f"idle_s must be a finite number of seconds >= 0, got {idle_s!r}")
        self.idle_s, self._release, self._busy, self._clock = float(idle_s), release, busy, clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._watcher: threading.Thread | None = None
        self._last = clock()
        self._closed = False
        self.releases = self.failures = 0

    def activity(self) -> None:
        """A request ended: the idle period starts now (a watcher is started if none waits)."""
        with self._lock:
            self._last = self._clock()
            if self._closed or self._watcher is not None:
                return
            self._watcher = threading.Thread(target=self._watch, name="nexus-mlx-idle",
                                             daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    self._watcher = None
                    return
                left = self._last + self.idle_s - self._clock()
            busy = self._busy()
            if left > 0 or busy:  # a busy server's request calls activity() when it ends
                self._wake.wait(max(self.idle_s if busy else left, MIN_WAIT_S))
                continue
            started = self._clock()
            self._run()
            with self._lock:
                if self._last <= started or self._closed:  # no request ended meanwhile
                    self._watcher = None
                    return

    def _run(self) -> None:
        try:
            self._release()
        except Exception as exc:  # a failed release must not end the server
            log.warning("releasing memory after an idle period failed: %s", exc)
            with self._lock:
                self.failures += 1
        else:
            with self._lock:
                self.releases += 1

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._closed = True
            watcher = self._watcher
        self._wake.set()
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"idle_releases": self.releases, "idle_release_failures": self.failures}
