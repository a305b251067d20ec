"""Live MCP servers over stdio, through the official ``mcp`` SDK, with a synchronous facade.

Contract: :class:`McpServer` (synchronous; the agent turn is synchronous) starts the server
command of a :class:`~nexus_mlx.agent.mcp_spec.ServerSpec` (re-exported here, with
``installed_server``) as a child process, speaks MCP to it over stdin/stdout with the
SDK's ``stdio_client`` + ``ClientSession`` on a private event loop running in a background thread,
and offers ``list_tools() -> ToolRegistry`` and ``call_tool(name, arguments) -> McpCallResult``.
:class:`AsyncMcpServer` is the same thing for ``async`` callers (one event loop, no thread).

Every wait is bounded:
- start (spawn + ``initialize``) within ``spec.start_timeout`` seconds, every request (``tools/list``
  pages, ``tools/call``) within ``spec.call_timeout`` (or the call's ``timeout``); running out raises
  :class:`ServerError`;
- a command that does not exist, a server that exits or closes its stdout (before or during a
  request), or a protocol error raises :class:`ServerError` naming the server, the request and
  the tail of the server's stderr (only the last bytes are kept: :class:`StderrTail`), at the
  latest when the timeout runs out; never a hang;
- ``close()`` (also the context managers' exit) follows the SDK's shutdown: close stdin, wait 2 s,
  SIGTERM the process group, SIGKILL after 2 s, and reap it; no zombie processes are left.
A tool that fails is not an exception: its result has ``is_error=True`` (MCP's own rule, so a model
can read the error and retry). After the server has died every call raises :class:`ServerError`.

Tools are listed into a :class:`~nexus_mlx.tools.registry.ToolRegistry` under ``spec.namespace``
(if set); ``call_tool`` accepts the plain or the namespaced name. A server's
``notifications/tools/list_changed`` sets ``tools_changed`` until the next listing, and
:attr:`McpServer.tools` lists again then. A listed tool that breaks the
``Tool`` rules raises :class:`ServerError` naming it. This module does not route, retry,
restart servers, or validate arguments against the schema (the server does that).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio

from nexus_mlx.agent.mcp_spec import ServerSpec, check_timeout
from nexus_mlx.agent.mcp_spec import installed_server as installed_server  # re-exported
from nexus_mlx.errors import ServerError, ToolError
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import NAMESPACE_SEP, Tool, check_json_data

try:
    from mcp import ClientSession, StdioServerParameters, stdio_client, types
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover  (exercised only without the dependency)
    raise ModuleNotFoundError(
        "nexus_mlx.agent.mcp_server needs the official MCP SDK: pip install 'mcp>=2.3,<3'"
    ) from exc

_GRACE_S = 10.0  # extra wait of the synchronous side beyond the async timeouts (covers shutdown)
_STDERR_TAIL = 400
_MAX_PAGES = 1000


@dataclass(frozen=True)
class McpCallResult:
    """A ``tools/call`` result: its text blocks joined by newlines, the error flag, structured data.

    Non-text blocks appear in ``text`` as ``[image image/png]``-style placeholders (with the URI
    of a resource); a result with structured data and no text shows that data as JSON.
    """

    text: str
    is_error: bool = False
    structured: Any = None


class StderrTail:
    """A child's stderr as a pipe that a daemon thread drains, keeping only the last ``keep``
    bytes: what a long-lived, chatty server writes costs no disk and bounded memory. Pass
    ``writer`` as the child's stderr, then close it (the thread ends when the child's copy
    closes)."""

    def __init__(self, keep: int = 4 * _STDERR_TAIL) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        self._keep, self._tail, self._lock = keep, bytearray(), threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(read_fd,), daemon=True,
                                        name="mcp-stderr")
        self._thread.start()

    def _drain(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                with self._lock:
                    self._tail += chunk
                    del self._tail[: -self._keep]

    def settle(self, timeout: float = 0.5) -> None:
        """Wait up to ``timeout`` s for the pipe's end (a child that just died has written
        its last words)."""
        if self.writer.closed:
            self._thread.join(timeout)

    def text(self) -> str:
        with self._lock:
            return bytes(self._tail).decode("utf-8", errors="replace")


def _leaf(exc: BaseException) -> BaseException:
    """The first innermost exception of (nested) exception groups, cancellations last."""
    while getattr(exc, "exceptions", None):
        group: Sequence[BaseException] = exc.exceptions  # type: ignore[attr-defined]
        real = [e for e in group if not isinstance(e, asyncio.CancelledError)]
        exc = (real or list(group))[0]
    return exc


def _tool_from_mcp(tool: types.Tool, namespace: str | None) -> Tool:
    annotations = (
        tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
        if tool.annotations
        else {}
    )
    return Tool(tool.name, tool.description or "", dict(tool.input_schema), annotations, namespace)


def _block_text(block: Any) -> str:
    """A content block as text: its text (an embedded resource's too), else a placeholder naming
    its type, URI and MIME type, e.g. ``[resource file:///a.png image/png]``."""
    if isinstance(block, types.TextContent):
        return block.text
    resource = block.resource if isinstance(block, types.EmbeddedResource) else None
    text = getattr(resource, "text", None)
    if isinstance(text, str):
        return text
    source = resource if resource is not None else block
    labels = [str(v) for v in (getattr(source, "uri", None), getattr(source, "mime_type", None))
              if v]
    return "[" + " ".join([str(block.type), *labels]) + "]"


def _result(result: types.CallToolResult) -> McpCallResult:
    text = "\n".join(_block_text(b) for b in result.content)
    structured = result.structured_content
    if not text.strip() and structured is not None:  # structured data alone: show it as JSON
        text = json.dumps(structured, ensure_ascii=False)
    return McpCallResult(text=text, is_error=bool(result.is_error), structured=structured)


class AsyncMcpServer:
    """One live stdio MCP server for ``async`` code: ``async with AsyncMcpServer(spec) as s: ...``."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.server_info: dict[str, Any] = {}
        self._stack: AsyncExitStack | None = None
        self._session: ClientSession | None = None
        self._errlog: StderrTail | None = None
        self.tools_changed = threading.Event()  # set by notifications/tools/list_changed

    def _stderr_tail(self) -> str:
        """The end of what the server wrote to stderr, for an error message."""
        if self._errlog is None:
            return ""
        self._errlog.settle()
        tail = " ".join(self._errlog.text().split())[-_STDERR_TAIL:]
        return f"; stderr: ...{tail}" if tail else ""

    def _error(self, exc: BaseException, during: str, timeout: float) -> ServerError:
        """Translate an SDK/OS failure into our error, naming server, request and stderr."""
        leaf = _leaf(exc)
        where = f"MCP server {self.spec.label!r} ({self.spec.command})"
        if isinstance(leaf, ServerError):
            return leaf
        if isinstance(leaf, TimeoutError) or (
            isinstance(leaf, MCPError) and leaf.code == types.REQUEST_TIMEOUT
        ):
            return ServerError(f"{where} did not answer {during} within {timeout:g} s")
        if isinstance(leaf, FileNotFoundError):
            return ServerError(f"cannot start {where}: command {self.spec.command!r} not found")
        if isinstance(leaf, MCPError) and leaf.code == types.CONNECTION_CLOSED:
            return ServerError(
                f"{where} closed the connection during {during}{self._stderr_tail()}"
            )
        if isinstance(leaf, MCPError):
            return ServerError(f"{where} refused {during}: {leaf.message} (code {leaf.code})")
        detail = f"{type(leaf).__name__}: {leaf}"
        return ServerError(f"{where} failed during {during}: {detail}{self._stderr_tail()}")

    async def __aenter__(self) -> AsyncMcpServer:
        params = StdioServerParameters(
            command=self.spec.command,
            args=list(self.spec.args),
            env=dict(self.spec.env) or None,
            cwd=self.spec.cwd,
        )
        stack = AsyncExitStack()
        try:
            self._errlog = errlog = StderrTail()
            stack.callback(errlog.writer.close)
            # Spawning does not wait on the server; only the handshake needs the timeout (a cancel
            # scope around entering the SDK's task groups would be exited out of order).
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog.writer))
            errlog.writer.close()  # the child holds its own copy: its exit ends the pipe
            session = await stack.enter_async_context(
                ClientSession(read, write, message_handler=self._on_message)
            )
            with anyio.fail_after(self.spec.start_timeout):
                init = await session.initialize()
        except BaseException as exc:
            error = self._error(exc, "initialize", self.spec.start_timeout)
            await self._close_stack(stack)
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
                raise
            raise error from exc
        self.server_info = init.server_info.model_dump(mode="json", exclude_none=True)
        self._stack, self._session = stack, session
        return self

    async def _on_message(self, message: Any) -> None:
        """The server's notifications: a changed tool list marks the last listing stale."""
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed.set()

    @staticmethod
    async def _close_stack(stack: AsyncExitStack) -> None:
        try:
            await stack.aclose()
        except Exception:  # the server is being torn down; its own errors were reported already
            pass

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Shut the server down (idempotent); see the module docstring for the sequence."""
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            await self._close_stack(stack)

    def _live_session(self) -> ClientSession:
        if self._session is None:
            raise ServerError(f"MCP server {self.spec.label!r} is not running")
        return self._session

    async def list_tools(self) -> ToolRegistry:
        """``tools/list`` (all pages) as a registry under ``spec.namespace``."""
        session = self._live_session()
        self.tools_changed.clear()  # a change notified while listing calls for another listing
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._request(
                session.list_tools(params=params), "tools/list", self.spec.call_timeout
            )
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        try:
            return ToolRegistry(_tool_from_mcp(t, self.spec.namespace) for t in listed)
        except (ToolError, ValueError) as exc:
            raise ServerError(
                f"MCP server {self.spec.label!r} listed an invalid tool: {exc}"
            ) from exc

    def plain_name(self, name: str) -> str:
        """``name`` without this server's namespace prefix (if it carries it)."""
        prefix = f"{self.spec.namespace}{NAMESPACE_SEP}" if self.spec.namespace else None
        return name[len(prefix) :] if prefix and name.startswith(prefix) else name

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> McpCallResult:
        """``tools/call`` with a bounded wait; see the module docstring for errors."""
        session = self._live_session()
        limit = self.spec.call_timeout if timeout is None else check_timeout("timeout", timeout)
        if not isinstance(name, str) or not name:
            raise ServerError(f"tool name must be a non-empty string, got {name!r}")
        args = dict(arguments or {})
        check_json_data(args, f"arguments of tool {name!r}")
        plain = self.plain_name(name)
        request = session.call_tool(plain, args, read_timeout_seconds=limit)
        return _result(await self._request(request, f"tools/call {plain!r}", limit))

    async def _request(self, awaitable: Any, during: str, timeout: float) -> Any:
        # The SDK's per-request timeout cancels the request on the server; fail_after is a backstop.
        try:
            with anyio.fail_after(timeout + 1.0):
                return await awaitable
        except Exception as exc:
            raise self._error(exc, during, timeout) from exc


class McpServer:
    """A live stdio MCP server for synchronous code (see the module docstring).

    ``with McpServer(spec) as server: server.call_tool("get_current_time", {"timezone": "UTC"})``.
    The server runs on a private event loop in a daemon thread; calls may come from any thread.
    """

    def __init__(self, spec: ServerSpec) -> None:
        if not isinstance(spec, ServerSpec):
            raise ServerError(f"McpServer needs a ServerSpec, got {type(spec).__name__}")
        self.spec = spec
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._owner: concurrent.futures.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._server: AsyncMcpServer | None = None
        self._tools: ToolRegistry | None = None

    def __enter__(self) -> McpServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's ``serverInfo`` (name, version, ...) from ``initialize``."""
        return dict(self._server.server_info) if self._server is not None else {}

    def start(self) -> McpServer:
        """Start the server and initialize the session; raises if it cannot within the timeout."""
        with self._lock:
            if self._loop is not None:
                raise ServerError(f"MCP server {self.spec.label!r} is already started")
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name=f"mcp-{self.spec.label}", daemon=True
            )
            thread.start()
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._loop, self._thread = loop, thread
            self._owner = asyncio.run_coroutine_threadsafe(self._own(ready), loop)
        try:
            ready.result(timeout=self.spec.start_timeout + _GRACE_S)
        except BaseException as exc:
            self.close()
            if isinstance(exc, concurrent.futures.TimeoutError) and not isinstance(
                exc, ServerError
            ):
                raise ServerError(
                    f"MCP server {self.spec.label!r} did not start within {self.spec.start_timeout:g} s"
                ) from None
            raise
        return self

    async def _own(self, ready: concurrent.futures.Future[None]) -> None:
        """The task that owns the server's async context for its whole life."""
        self._stop = asyncio.Event()
        try:
            async with AsyncMcpServer(self.spec) as server:
                self._server = server
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(
                    exc if isinstance(exc, Exception) else ServerError(repr(exc))
                )
            raise
        finally:
            self._server = None

    def _running(self) -> tuple[asyncio.AbstractEventLoop, AsyncMcpServer]:
        loop, owner, server = self._loop, self._owner, self._server
        if loop is None or owner is None or server is None or owner.done():
            raise ServerError(
                f"MCP server {self.spec.label!r} is not running (never started, closed or died)"
            )
        return loop, server

    def _wait(self, coroutine: Any, during: str, timeout: float) -> Any:
        loop, _ = self._running()
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout=timeout + _GRACE_S)
        except ServerError:
            raise
        except concurrent.futures.TimeoutError:  # (the builtin TimeoutError since Python 3.11)
            future.cancel()
            raise ServerError(
                f"MCP server {self.spec.label!r}: {during} hung past {timeout:g} s"
            ) from None
        except concurrent.futures.CancelledError:
            raise ServerError(
                f"MCP server {self.spec.label!r} was closed during {during}"
            ) from None

    def list_tools(self) -> ToolRegistry:
        """``tools/list`` as a registry (fresh from the server; also cached as :attr:`tools`)."""
        _, server = self._running()
        self._tools = self._wait(server.list_tools(), "tools/list", self.spec.call_timeout)
        return self._tools

    @property
    def tools(self) -> ToolRegistry:
        """The registry of the last ``list_tools()``, listed again on first access and after
        the server said its tool list changed (:attr:`tools_changed`)."""
        if self._tools is None or self.tools_changed:
            return self.list_tools()
        return self._tools

    @property
    def tools_changed(self) -> bool:
        """Whether the server sent ``notifications/tools/list_changed`` since the last listing."""
        server = self._server
        return server is not None and server.tools_changed.is_set()

    def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> McpCallResult:
        """Call a tool (plain or namespaced name) and wait at most ``timeout`` (or ``call_timeout``)."""
        _, server = self._running()
        limit = self.spec.call_timeout if timeout is None else check_timeout("timeout", timeout)
        return self._wait(
            server.call_tool(name, arguments, timeout=limit), f"tools/call {name!r}", limit
        )

    def close(self) -> None:
        """Shut the server down and stop the loop thread (idempotent, bounded)."""
        with self._lock:
            loop, thread, owner, stop = self._loop, self._thread, self._owner, self._stop
            self._loop = self._thread = self._owner = None
        if loop is None or thread is None:
            return
        if owner is not None and not owner.done():
            if stop is not None:
                loop.call_soon_threadsafe(stop.set)
            try:
                owner.result(timeout=_GRACE_S)
            except concurrent.futures.TimeoutError:
                owner.cancel()
            except BaseException:  # a failed start or a dead server: already reported
                pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_GRACE_S)
        if not thread.is_alive():
            loop.close()


def list_server_tools(spec: ServerSpec) -> ToolRegistry:
    """Start a server, list its tools, shut it down: the registry loader for live servers."""
    with McpServer(spec) as server:
        return server.list_tools()


def start_servers(specs: Sequence[ServerSpec]) -> list[McpServer]:
    """Start several servers (all or none: a failure closes those already started)."""
    started: list[McpServer] = []
    try:
        for spec in specs:
            started.append(McpServer(spec).start())
    except BaseException:
        for server in reversed(started):
            server.close()
        raise
    return started

