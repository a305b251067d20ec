"""The server as a Python object: bind, serve in a background thread, stop by its handle.

Contract: ``Server(model, tokenizer, model_name="default", host="127.0.0.1", port=0, ...)``
builds the engine and the app (:mod:`.engine`, :mod:`.app`) over an already loaded model;
``start()`` binds the socket (``port=0``: a free one; :attr:`port` is the one bound), runs uvicorn
in a daemon thread and returns once it accepts connections; :attr:`url` / :attr:`base_url`
(``.../v1``, what an OpenAI client takes) name it. ``stop()`` cancels in-flight generations (each
stops at its next token), asks uvicorn to finish (open streams get ``shutdown_grace_s``) and
waits for its thread; it is idempotent and the object is a context manager. With ``session_dir``,
the sessions an earlier server saved there are restored before it serves, the changed ones are
saved there whenever it goes idle (a checkpoint) and at ``stop()``, once the requests are done
(:mod:`.session_store`); the Responses API's stored responses go with them, to ``responses.json``,
so ``previous_response_id`` outlives a restart too. ``wait()`` blocks
until the server ends (Ctrl-C raises ``KeyboardInterrupt`` in the caller, who stops it; the
command line waits with :class:`nexus_mlx.cli.signals.StopSignals` instead, which cannot miss
a signal delivered to another thread).
:func:`serve` is ``Server(...).start()``; :func:`bind_socket` binds early (the command line does
so before loading the model, so a busy port fails fast) and raises :class:`ArgumentError` naming
the address. It knows nothing about requests.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn

from nexus_mlx.agent.session import DEFAULT_GUARD, Policy
from nexus_mlx.decode.lookahead import DEFAULT_DRAFT_TOKENS
from nexus_mlx.errors import ArgumentError, FormatError
from nexus_mlx.server.app import build_app
from nexus_mlx.server.engine import (
    DEFAULT_IDLE_RELEASE_S,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TRIM_HEAP_S,
    Engine,
)
from nexus_mlx.server.response_store import DEFAULT_MAX_RESPONSES, ResponseStore

START_TIMEOUT_S = 30.0
MIB = 1 << 20
RESPONSES_FILE = "responses.json"  # the stored responses, beside the saved sessions
log = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when ``host`` holds a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ArgumentError(f"cannot listen on {host}:{port}: {why}; choose another --host / "
                            "--port") from None
    sock.set_inheritable(True)
    return sock


class Server:
    """An OpenAI-compatible server over one loaded model (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, *, model_name: str = "default",
                 host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None,
                 policy: Policy = "repair", budget: float = 5.0, cache_budget_mib: int = 2048,
                 max_sessions: int = 8, max_tokens: int = DEFAULT_MAX_TOKENS,
                 log_level: str = "warning", shutdown_grace_s: int = 2,
                 tool_blocks: bool = True, heal_after_reply: bool = False,
                 guard: float | None = DEFAULT_GUARD,
                 draft_tokens: int = DEFAULT_DRAFT_TOKENS,
                 max_stored_responses: int = DEFAULT_MAX_RESPONSES,
                 trim_heap_s: float | None = DEFAULT_TRIM_HEAP_S,
                 idle_release_s: float | None = DEFAULT_IDLE_RELEASE_S,
                 session_dir: str | os.PathLike[str] | None = None,
                 interleave: bool = True) -> None:
        if isinstance(cache_budget_mib, bool) or not isinstance(cache_budget_mib, int) \
                or cache_budget_mib < 0:
            raise ArgumentError(f"cache_budget_mib must be an integer >= 0, got "
                                f"{cache_budget_mib!r}")
        self.model_name, self.host, self._port, self._sock = model_name, host, port, sock
        self.responses = ResponseStore(max_stored_responses)
        self.engine = Engine(model, tokenizer, policy=policy, budget=budget,
                             max_sessions=max_sessions, cache_budget=cache_budget_mib * MIB,
                             max_tokens=max_tokens, tool_blocks=tool_blocks,
                             heal_after_reply=heal_after_reply, guard=guard,
                             draft_tokens=draft_tokens, trim_heap_s=trim_heap_s,
                             idle_release_s=idle_release_s, session_dir=session_dir,
                             on_idle=self._save_responses, interleave=interleave)
        store = self.engine.store  # the checked session directory, its sessions restored
        self.responses_file = None if store is None else store.directory / RESPONSES_FILE
        self.responses_restored = self._load_responses()
        # workers wait on sessions and on the MLX thread; model work itself is serialised there
        self._executor = ThreadPoolExecutor(max_workers=max(8, 4 * max_sessions),
                                            thread_name_prefix="nexus-mlx-request")
        self.app = build_app(self.engine, [model_name], self._executor, self.responses)
        self._log_level, self._grace = log_level, shutdown_grace_s
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._saved = False  # the sessions were saved (once, at the first stop)

    @property
    def port(self) -> int:
        if self._sock is not None:
            return int(self._sock.getsockname()[1])
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Server:
        if self._thread is not None:
            raise ArgumentError("this server was already started; make a new Server")
        if self._sock is None:
            self._sock = bind_socket(self.host, self._port)
        config = uvicorn.Config(self.app, log_level=self._log_level, access_log=False,
                                lifespan="off", timeout_graceful_shutdown=self._grace)
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self._sock]},
                                        name="nexus-mlx-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def wait(self) -> None:
        """Block until the server ends."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout: float = 15.0) -> None:
        self.engine.cancel_all()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.engine.cancel_all()  # anything that arrived meanwhile
        self._executor.shutdown(wait=False, cancel_futures=True)
        if not self._saved:
            self._saved = True
            self.engine.save_sessions()
            self._save_responses()
        self.engine.close()
        if self._sock is not None:
            self._sock.close()

    def _load_responses(self) -> int:
        """The stored responses an earlier server saved beside its sessions (a file it cannot
        read is logged and left for the next save to replace)."""
        if self.responses_file is None or not self.responses.enabled:
            return 0
        try:
            return self.responses.load(self.responses_file)
        except FormatError as exc:
            log.warning("stored responses not restored: %s", exc)
            return 0

    def _save_responses(self) -> None:
        if self.responses_file is None:
            return
        try:
            self.responses.save(self.responses_file)
        except OSError as exc:  # a full disk: the sessions' save reports its own failures
            log.warning("stored responses not saved: %s", exc)

    def __enter__(self) -> Server:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(model: Any, tokenizer: Any, **options: Any) -> Server:
    """A started :class:`Server` (options as its constructor's)."""
    return Server(model, tokenizer, **options).start()
