"""A server's tool list changes while an agent runs: a real MCP server (the ``mcp`` SDK's own
server, over stdio) adds a tool when called and says so; the loop takes the new list before its
next step, the live session splices the changed tool list, and the Agent's router is built again
over the new registry."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from nexus_mlx.agent.loop import relisted, run_agent
from nexus_mlx.agent.mcp_server import McpServer
from nexus_mlx.agent.mcp_spec import ServerSpec
from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.agent.session import Session
from nexus_mlx.errors import ArgumentError
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import MarginGate
from nexus_mlx.routing.router import Router, rebuilt_router
from nexus_mlx.routing.slb import SemanticLookasideBuffer
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool

# the notification is sent before the result, and the result waits a moment, so the client has
# surely heard it when the call returns (the SDK delivers notifications on their own task)
GROWING = textwrap.dedent(
    """
    import anyio
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("growing")

    def weather_report(city: str) -> str:
        \"\"\"Today's weather report for a city.\"\"\"
        return f"sunny in {city}"

    @server.tool()
    async def enable_weather(ctx: Context) -> str:
        \"\"\"Enable the weather tools.\"\"\"
        server.add_tool(weather_report)
        await ctx.session.send_tool_list_changed()
        await anyio.sleep(0.3)
        return "weather tools enabled"

    server.run()
    """
)
ENABLE = {"type": "function", "function": {"name": "grow.enable_weather"}}


def _tool(name: str, server: str | None) -> Tool:
    return Tool(name, f"the {name} tool", {"type": "object", "properties": {}}, server=server)


class _Listed:
    """A server stand-in for :func:`relisted`, which reads only these two members."""

    def __init__(self, changed: bool, tools: list[Tool]) -> None:
        self.tools_changed, self._tools = changed, tools

    def list_tools(self) -> ToolRegistry:
        return ToolRegistry(self._tools)


def test_relisted_replaces_a_changed_servers_tools_in_place():
    registry = ToolRegistry([_tool("a", "x"), _tool("b", "y"), _tool("c", "x"), _tool("d", None)])
    quiet = {"x": _Listed(False, []), "y": _Listed(False, [])}
    assert relisted(registry, quiet) is None
    servers = {"x": _Listed(True, [_tool("c", "x"), _tool("e", "x")]), "y": _Listed(False, []),
               "z": _Listed(True, [_tool("f", "z")])}  # z had no tools before
    fresh = relisted(registry, servers)
    assert fresh is not None
    assert fresh.names() == ["x.c", "x.e", "y.b", "d", "z.f"]
    assert registry.names() == ["x.a", "y.b", "x.c", "d"]  # the old registry is left as it was


@pytest.fixture()
def growing(tmp_path: Path):
    path = tmp_path / "growing_server.py"
    path.write_text(GROWING)
    spec = ServerSpec(sys.executable, (str(path),), namespace="grow", call_timeout=20)
    with McpServer(spec) as server:
        yield server


def test_the_loop_takes_a_new_tool_list_before_its_next_step(default_model, growing):
    model, tokenizer = default_model
    registry = growing.list_tools()
    assert registry.names() == ["grow.enable_weather"]
    seen: list[list[str]] = []
    shown: list[list[str]] = []

    def select(request: str) -> list[str]:
        names = seen[-1] if seen else registry.names()
        shown.append(list(names))
        return names

    session = Session(model, tokenizer)
    run = run_agent(session, [], "Enable the weather tools.", registry, {"grow": growing},
                    select_tools=select, tool_choice=ENABLE, max_steps=2, max_tokens=32,
                    on_registry=lambda r: seen.append(r.names()))
    assert [e.output for e in run.executions][:1] == ["weather tools enabled"]
    assert seen == [["grow.enable_weather", "grow.weather_report"]]
    assert shown == [["grow.enable_weather"], ["grow.enable_weather", "grow.weather_report"]]
    # the second step's prompt holds the new tool: the session spliced the changed list
    rendered = tokenizer.decode([int(t) for t in session.tokens])
    assert "weather_report" in rendered and len(run.steps) == 2
    assert registry.names() == ["grow.enable_weather"]  # the caller's registry is not modified


def test_the_agent_rebuilds_its_router_over_the_new_tools(default_model, growing):
    model, tokenizer = default_model
    registry = growing.list_tools()
    embedder = Embedder.load()
    slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="minilm")
    router = Router(registry, embedder, slb, MarginGate(0.0), k=4)
    agent = Agent(model, tokenizer, registry, router, {"grow": growing})
    assert agent.refresh_tools() is False  # nothing changed yet
    run = agent.run("Enable the weather tools.", tool_choice=ENABLE, max_steps=2, max_tokens=32)
    assert run.executions and run.executions[0].ok
    assert agent.registry.names() == ["grow.enable_weather", "grow.weather_report"]
    assert agent.routed_tools("What is the weather in Paris today?", 1) == ["grow.weather_report"]
    rebuilt = agent.router
    assert rebuilt is not router and rebuilt.registry is agent.registry
    assert (rebuilt.k, rebuilt.embedder, rebuilt.reranker) == (4, embedder, None)
    assert rebuilt.slb.embedder_id == "minilm" and len(rebuilt.slb.names) == 2
    assert agent.current_router() is rebuilt  # built once per registry, not per route


def test_a_router_is_not_rebuilt_over_an_empty_registry():
    embedder = Embedder.load()
    registry = ToolRegistry([_tool("a", None), _tool("b", None)])
    slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="minilm")
    router = Router(registry, embedder, slb, MarginGate(0.0))
    with pytest.raises(ArgumentError, match="empty tool registry"):
        rebuilt_router(router, ToolRegistry())
