"""The agent turn end to end on real parts: the live mcp-server-time, the MiniLM embedder and
INT8 SLB, the default LLM with constrained decoding; the sidecar window; the turn lock."""

from __future__ import annotations

import threading

import pytest

from nexus_mlx.agent.mcp_server import McpCallResult, McpServer, installed_server
from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.agent.sidecar import sidecar_messages
from nexus_mlx.errors import ArgumentError, ToolError
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import MarginGate
from nexus_mlx.routing.router import Router
from nexus_mlx.routing.slb import SemanticLookasideBuffer

CONVERSATION = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "Create a repository called demo."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"name": "create_repository", "arguments": {"name": "demo", "private": True}}]},
    {"role": "tool", "name": "create_repository", "content": "x" * 5000},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "Thanks. What time is it?"},
    {"role": "assistant", "content": "Which city?"},
    {"role": "user", "content": "What time is it in Tokyo right now?"},
]


def test_sidecar_prunes_payloads_and_keeps_references():
    window = sidecar_messages(CONVERSATION, window=5, payload_chars=100)
    text = "\n".join(m["content"] for m in window)
    assert "x" * 200 not in text and "result of create_repository" in text
    assert window[-1] == {"role": "user", "content": "What time is it in Tokyo right now?"}
    assert all(m["role"] != "system" for m in window)
    short = sidecar_messages(CONVERSATION, window=2)
    assert 'create_repository({"name": "demo", "private": true})' in short[0]["content"]
    roles = [m["role"] for m in short]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


@pytest.mark.parametrize("messages", [[], [{"role": "assistant", "content": "hi"}]])
def test_sidecar_needs_a_final_user_message(messages):
    with pytest.raises(ArgumentError):
        sidecar_messages(messages)


@pytest.fixture(scope="module")
def agent(default_model):
    model, tokenizer = default_model
    spec = installed_server("mcp-server-time", "mcp_server_time", namespace="time", call_timeout=20)
    with McpServer(spec) as server:
        registry = server.list_tools()
        embedder = Embedder.load()
        slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="minilm")
        router = Router(registry, embedder, slb, MarginGate(0.0))
        yield Agent(model, tokenizer, registry, router, {"time": server}, max_argument_tokens=24)


def test_turn_routes_generates_and_executes(agent):
    turn = agent.turn(CONVERSATION)
    assert turn.route.chosen == "time.get_current_time"
    assert turn.call.name == "time.get_current_time" and turn.call.valid
    assert set(turn.call.arguments) == {"timezone"}
    result = agent.execute(turn)
    assert isinstance(result, McpCallResult) and result.text  # the server answered (or refused)
    assert {"route", "arguments"} <= set(turn.timings)


def test_concurrent_turns_are_bit_identical(agent):
    outputs: list[str] = []

    def run() -> None:
        outputs.append(agent.turn(CONVERSATION).call.text)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(outputs) == 4 and len(set(outputs)) == 1


def test_unknown_server_is_a_clear_error(agent):
    with pytest.raises(ToolError, match="no running MCP server"):
        agent.server_for("git.git_status")
