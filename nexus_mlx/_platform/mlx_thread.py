"""One thread for the MLX work of objects that several threads share (the "MLX thread").

Contract: :func:`run_on_mlx_thread` ``(fn, *args, **kwargs)`` runs ``fn`` on the process's MLX
thread and returns its result (or raises its exception) in the caller; calls run one at a time,
in arrival order. A call made on the MLX thread itself runs inline, so decorated functions may
call each other. :func:`submit_to_mlx_thread` queues a call the same way without waiting and
returns its ``Future`` (any call queued after it runs after it). :func:`on_mlx_thread` is the same
as a decorator. :func:`drive_on_mlx_thread` ``(steps)`` runs a generator of steps there (a reply
decoded token by token): one step per queued call, each queued again behind the calls that
arrived while it ran, so concurrent drivers take turns step by step instead of one waiting for
the other's whole run; it returns the generator's return value (or raises its exception) in the
caller. On the MLX thread itself, or once the thread is stopping, the steps run inline to the
end; :func:`run_steps` runs them so anywhere, and :func:`blocking` makes a generator function's
blocking twin. The thread is a daemon
started on first use; an ``atexit`` hook stops it after the calls already queued, and it calls
``mx.clear_streams()`` as its last act, so its MLX state is released while the interpreter is
still alive. A call after that hook has run raises ``RuntimeError``. After ``os.fork`` the child
starts a fresh thread on first use.

Why (MLX 0.32, measured on Linux CPU): every thread that evaluates gets its own default stream
(a native worker thread) and its own ``mx.compile`` cache. Those are freed by the thread's
thread-local destructors, which run *after* Python's ``Thread.join()`` has returned and take the
GIL to drop Python objects; if the main thread is finalizing the interpreter by then, the
process aborts with "terminate called without an active exception" (SIGABRT). Separately, one
stream thread per caller means concurrent GEMMs into the threaded OpenBLAS that ``import
nexus_mlx`` installs, which hung the process here. Keeping shared MLX work on one long-lived
thread that cleans up before finalization avoids both.

It knows nothing about models, routers or agents; it does not make arbitrary MLX code
thread-safe (arrays still belong to the thread that built their graph: evaluate them there).
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

import mlx.core as mx

P = ParamSpec("P")
R = TypeVar("R")
THREAD_NAME = "nexus-mlx"

_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_STOP = None  # the queue's end marker


class MlxThread:
    """A single worker thread for MLX calls (see the module docstring)."""

    def __init__(self, name: str = THREAD_NAME) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._closed = False

    def is_current(self) -> bool:
        """True when called on this worker thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` on the worker (inline when already there)."""
        if self.is_current():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Queue ``fn(*args, **kwargs)`` on the worker; its future (already done when called
        on the worker: it runs inline)."""
        future: Future[R] = Future()
        if self.is_current():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)
            return future
        self._put(future, fn, args, kwargs)
        return future

    def drive(self, steps: Generator[Any, None, R]) -> R:
        """Run ``steps`` on the worker one step per queued call, taking turns with the other
        queued calls (module docstring); its return value, or its exception, here."""
        if self.is_current():
            return run_steps(steps)
        done: Future[R] = Future()

        def step() -> None:
            try:
                next(steps)
            except StopIteration as end:
                done.set_result(end.value)
                return
            except BaseException as exc:  # the generator has ended: the caller re-raises it
                done.set_exception(exc)
                return
            if not self._requeue(step):  # the worker is stopping: finish here
                try:
                    done.set_result(run_steps(steps))
                except BaseException as exc:
                    done.set_exception(exc)

        self._put(Future(), step, (), {})
        return done.result()

    def _requeue(self, fn: Callable[[], None]) -> bool:
        """Queue ``fn`` behind the calls already queued, from the worker itself; False when
        the worker is stopping (nothing queued now would run)."""
        with self._lock:
            if self._closed or self._thread is not threading.current_thread():
                return False
            self._queue.put((Future(), fn, (), {}))
            return True

    def _put(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        """Queue one call, starting the worker when there is none."""
        with self._lock:
            if self._closed:
                raise RuntimeError(
                    f"the {self.name} thread has stopped (the interpreter is exiting); "
                    f"cannot run {getattr(fn, '__qualname__', fn)!r}"
                )
            if self._thread is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._queue,), name=self.name, daemon=True
                )
                self._thread.start()
            self._queue.put((future, fn, args, kwargs))

    @staticmethod
    def _serve(tasks: queue.SimpleQueue[_Task | None]) -> None:
        try:
            while (task := tasks.get()) is not _STOP:
                future, fn, args, kwargs = task
                del task
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:  # the caller re-raises it
                        future.set_exception(exc)
                del future, fn, args, kwargs  # drop this thread's references now
        finally:
            mx.clear_streams()  # this thread's streams and compile cache, while Python lives

    def stop(self, *, final: bool = False) -> None:
        """Finish the queued calls, release the worker's MLX state and end it (a later call
        starts a new worker unless ``final``). Waits for the worker unless called on it."""
        with self._lock:
            thread, tasks = self._thread, self._queue
            self._thread = None
            self._closed = self._closed or final
            if thread is not None:
                tasks.put(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._thread = None
        self._queue = queue.SimpleQueue()


_WORKER = MlxThread()
atexit.register(_WORKER.stop, final=True)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER._after_fork)


def mlx_thread() -> MlxThread:
    """The process's MLX thread."""
    return _WORKER


def run_on_mlx_thread(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Run ``fn(*args, **kwargs)`` on the MLX thread and return its result."""
    return _WORKER.run(fn, *args, **kwargs)


def submit_to_mlx_thread(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
    """Queue ``fn(*args, **kwargs)`` on the MLX thread; return its future without waiting."""
    return _WORKER.submit(fn, *args, **kwargs)


def drive_on_mlx_thread(steps: Generator[Any, None, R]) -> R:
    """Run the generator ``steps`` on the MLX thread, a step per turn (module docstring), and
    return its return value."""
    return _WORKER.drive(steps)


def run_steps(steps: Generator[Any, None, R]) -> R:
    """Run the generator ``steps`` to its end here and return its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def blocking(steps: Callable[P, Generator[Any, None, R]], name: str) -> Callable[P, R]:
    """A function named ``name`` that runs the generator ``steps(...)`` returns to its end (same
    arguments and documentation) and returns its return value."""

    @functools.wraps(steps)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return run_steps(steps(*args, **kwargs))

    run.__name__ = name
    run.__qualname__ = f"{steps.__qualname__.rpartition('.')[0]}.{name}".lstrip(".")
    return run


def on_mlx_thread(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: every call of ``fn`` runs on the MLX thread."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return _WORKER.run(fn, *args, **kwargs)

    return wrapper
