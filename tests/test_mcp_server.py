"""Live MCP servers over stdio: the real mcp-server-time and mcp-server-git from PyPI, plus a small
server built with the SDK's own ``MCPServer`` for the failure modes (slow tool, dying process)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from nexus_mlx.agent.mcp_server import (
    AsyncMcpServer,
    McpServer,
    ServerSpec,
    StderrTail,
    list_server_tools,
)
from nexus_mlx.errors import ServerError, ToolError

STUB = textwrap.dedent(
    """
    import os, time
    from mcp import types
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("stub")

    @server.tool()
    def sleep(seconds: float) -> str:
        \"\"\"Sleep, then answer.\"\"\"
        time.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def die() -> str:
        \"\"\"Exit the server process at once.\"\"\"
        os._exit(3)

    @server.tool()
    def media() -> types.CallToolResult:
        \"\"\"Answer with an image, a binary resource and a link: no text.\"\"\"
        return types.CallToolResult(content=[
            types.ImageContent(type="image", data="AAAA", mime_type="image/png"),
            types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
                uri="file:///tmp/a.bin", mime_type="application/octet-stream", blob="AAAA")),
            types.ResourceLink(type="resource_link", name="log", uri="file:///tmp/log.txt",
                               mime_type="text/plain")])

    @server.tool()
    def counted() -> types.CallToolResult:
        \"\"\"Answer with structured data only.\"\"\"
        return types.CallToolResult(content=[], structured_content={"count": 3})

    server.run()
    """
)


def console_spec(package: str, module: str, *args: str, **kwargs: object) -> ServerSpec:
    """The package's console script next to this Python, else ``python -m module``."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{package} is not installed (pip install {package})")
    script = Path(sys.executable).with_name(package)
    if script.is_file():
        return ServerSpec(str(script), args, **kwargs)  # type: ignore[arg-type]
    return ServerSpec(sys.executable, ("-m", module, *args), **kwargs)  # type: ignore[arg-type]


def children() -> set[int]:
    """Live or zombie child processes of this process (via /proc)."""
    if not os.path.isdir("/proc"):
        return set()
    found = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry))
    return found


@pytest.fixture(scope="module")
def time_server() -> Iterator[McpServer]:
    spec = console_spec("mcp-server-time", "mcp_server_time", namespace="time", call_timeout=20)
    with McpServer(spec) as server:
        yield server


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "stub_server.py"
    path.write_text(STUB)
    return path


def stub_spec(path: Path, **kwargs: object) -> ServerSpec:
    return ServerSpec(sys.executable, (str(path),), namespace="stub", **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def stub_server(stub_path: Path) -> Iterator[McpServer]:
    with McpServer(stub_spec(stub_path, call_timeout=10)) as server:
        yield server


# -- mcp-server-time -------------------------------------------------------------------------
def test_time_server_lists_tools(time_server: McpServer) -> None:
    registry = time_server.list_tools()
    assert registry.names() == ["time.get_current_time", "time.convert_time"]
    tool = registry.get("time.get_current_time")
    assert (tool.name, tool.server, tool.required) == ("get_current_time", "time", ("timezone",))
    assert tool.input_schema["properties"]["timezone"]["type"] == "string"
    assert tool.annotations.get("readOnlyHint") is True
    assert time_server.server_info["name"] == "mcp-time"
    assert time_server.tools.names() == registry.names()


def test_time_server_calls(time_server: McpServer) -> None:
    result = time_server.call_tool("time.get_current_time", {"timezone": "Europe/Paris"})
    assert not result.is_error
    payload = json.loads(result.text)
    assert payload["timezone"] == "Europe/Paris"
    assert datetime.fromisoformat(payload["datetime"]).utcoffset() is not None
    converted = time_server.call_tool(
        "convert_time",
        {"source_timezone": "Etc/UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
    )
    assert not converted.is_error and "21:00" in converted.text


def test_time_server_tool_errors_are_results(time_server: McpServer) -> None:
    result = time_server.call_tool("get_current_time", {"timezone": "Not/AZone"})
    assert result.is_error and "Not/AZone" in result.text
    with pytest.raises(ToolError, match="arguments of tool"):
        time_server.call_tool("get_current_time", {"timezone": float("nan")})
    with pytest.raises(ServerError, match="positive number of seconds"):
        time_server.call_tool("get_current_time", {"timezone": "UTC"}, timeout=0)


# -- mcp-server-git on a temporary repository ------------------------------------------------
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_server_on_temp_repo(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for command in (["git", "init", "-q"], ["git", "commit", "-q", "--allow-empty", "-m", "first"]):
        subprocess.run(command, cwd=repo, check=True, env=env)
    (repo / "notes.txt").write_text("hello\n")
    before = children()
    spec = console_spec(
        "mcp-server-git", "mcp_server_git", "--repository", str(repo), namespace="git"
    )
    with McpServer(spec) as server:
        names = server.list_tools().names()
        assert {"git.git_status", "git.git_log", "git.git_add"} <= set(names)
        status = server.call_tool("git.git_status", {"repo_path": str(repo)})
        assert not status.is_error and "notes.txt" in status.text
        log = server.call_tool("git_log", {"repo_path": str(repo), "max_count": 1})
        assert "first" in log.text
    assert children() <= before  # the server and anything it spawned are gone and reaped


# -- failure modes ---------------------------------------------------------------------------
def test_missing_command() -> None:
    start = time.perf_counter()
    with pytest.raises(ServerError, match="command '/no/such/mcp-server' not found"):
        McpServer(ServerSpec("/no/such/mcp-server")).start()
    assert time.perf_counter() - start < 5


def test_server_that_exits_immediately() -> None:
    before = children()
    code = "import sys; print('boom: bad config', file=sys.stderr); sys.exit(3)"
    start = time.perf_counter()
    with pytest.raises(
        ServerError, match="closed the connection during initialize.*boom: bad config"
    ):
        McpServer(ServerSpec(sys.executable, ("-c", code), start_timeout=5)).start()
    assert time.perf_counter() - start < 5
    assert children() <= before


def test_stderr_keeps_only_its_tail() -> None:
    tail = StderrTail(keep=1000)
    code = "import sys; sys.stderr.write('x' * 3_000_000 + ' last words'); sys.exit(3)"
    subprocess.run([sys.executable, "-c", code], stderr=tail.writer, check=False)
    tail.writer.close()
    tail.settle(5)
    text = tail.text()
    assert len(text) == 1000 and text.endswith("x last words")
    noisy = "import sys; sys.stderr.write('y' * 2_000_000 + ' config is bad'); sys.exit(3)"
    with pytest.raises(ServerError, match="closed the connection during initialize.*config is bad"):
        McpServer(ServerSpec(sys.executable, ("-c", noisy), start_timeout=5)).start()


@pytest.mark.parametrize(
    "code",
    [
        "import sys; sys.stdin.read()",  # silent, but leaves when its stdin closes
        pytest.param("import time; time.sleep(60)", marks=pytest.mark.slow),  # needs SIGTERM
    ],
)
def test_server_that_never_answers_start(code: str) -> None:
    before = children()
    start = time.perf_counter()
    with pytest.raises(ServerError, match="did not answer initialize within 1 s"):
        McpServer(ServerSpec(sys.executable, ("-c", code), start_timeout=1)).start()
    assert time.perf_counter() - start < 1 + 6  # timeout + the SDK's bounded stdin/SIGTERM shutdown
    assert children() <= before


def test_call_timeout_then_recovery(stub_server: McpServer) -> None:
    start = time.perf_counter()
    with pytest.raises(ServerError, match="did not answer tools/call 'sleep' within 0.5 s"):
        stub_server.call_tool("stub.sleep", {"seconds": 2}, timeout=0.5)
    assert time.perf_counter() - start < 3
    assert stub_server.call_tool("sleep", {"seconds": 0}).text == "slept 0.0"


def test_results_without_text_say_what_they_hold(stub_server: McpServer) -> None:
    media = stub_server.call_tool("media")
    assert media.text.splitlines() == ["[image image/png]",
                                       "[resource file:///tmp/a.bin application/octet-stream]",
                                       "[resource_link file:///tmp/log.txt text/plain]"]
    counted = stub_server.call_tool("counted")
    assert counted.structured == {"count": 3} and json.loads(counted.text) == {"count": 3}


def test_server_dies_mid_call(stub_path: Path) -> None:
    before = children()
    server = McpServer(stub_spec(stub_path, call_timeout=10)).start()
    try:
        start = time.perf_counter()
        with pytest.raises(ServerError, match="closed the connection during tools/call 'die'"):
            server.call_tool("die")
        assert time.perf_counter() - start < 10
        with pytest.raises(ServerError):
            server.call_tool("sleep", {"seconds": 0})
    finally:
        server.close()
    assert children() <= before


def test_facade_lifecycle_and_specs(stub_path: Path) -> None:
    server = McpServer(stub_spec(stub_path))
    with pytest.raises(ServerError, match="'stub' is not running"):
        server.call_tool("sleep", {"seconds": 0})
    server.close()  # closing a server that never started is a no-op
    with pytest.raises(ServerError, match="positive number"):
        ServerSpec("x", start_timeout=float("inf"))
    with pytest.raises(ServerError, match="non-empty string"):
        ServerSpec("")
    with pytest.raises(ServerError, match="sequence of strings"):
        ServerSpec("x", "-v")  # type: ignore[arg-type]
    spec = ServerSpec.from_dict(
        {"command": "uvx", "args": ["a"], "env": {"K": "V"}, "type": "stdio"}
    )
    assert (spec.args, spec.env, spec.label) == (("a",), (("K", "V"),), "uvx")
    assert hash(spec) == hash(ServerSpec("uvx", ("a",), {"K": "V"}))  # type: ignore[arg-type]


GROWING = textwrap.dedent(
    """
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("growing")

    def extra() -> str:
        \"\"\"A tool that appears later.\"\"\"
        return "extra"

    @server.tool()
    async def grow(ctx: Context) -> str:
        \"\"\"Add the tool 'extra' and tell the client its tool list changed.\"\"\"
        server.add_tool(extra)
        await ctx.session.send_tool_list_changed()
        return "grown"

    server.run()
    """
)


def test_a_changed_tool_list_is_listed_again(tmp_path: Path) -> None:
    path = tmp_path / "growing_server.py"
    path.write_text(GROWING)
    with McpServer(ServerSpec(sys.executable, (str(path),), call_timeout=10)) as server:
        assert server.tools.names() == ["grow"] and not server.tools_changed
        assert server.call_tool("grow").text == "grown"
        deadline = time.monotonic() + 5
        while not server.tools_changed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.tools_changed  # the notification arrived
        assert server.tools.names() == ["grow", "extra"] and not server.tools_changed
        assert server.call_tool("extra").text == "extra"


def test_async_server_and_registry_loader(stub_path: Path) -> None:
    async def main() -> tuple[list[str], str]:
        async with AsyncMcpServer(stub_spec(stub_path)) as server:
            names = (await server.list_tools()).names()
            return names, (await server.call_tool("stub.sleep", {"seconds": 0})).text

    before = children()
    names, text = asyncio.run(main())
    assert names == ["stub.sleep", "stub.die", "stub.media", "stub.counted"] and text == "slept 0.0"
    assert list_server_tools(stub_spec(stub_path)).names() == names
    assert children() <= before
