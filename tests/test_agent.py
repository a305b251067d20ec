"""The agent turn end to end on real parts: the live mcp-server-time, the MiniLM embedder and
INT8 SLB, the default LLM with constrained decoding; the sidecar window; the turn lock."""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import datetime, timedelta, timezone

import pytest

from nexus_mlx.agent.mcp_server import McpCallResult, McpServer, installed_server
from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.agent.session import Session
from nexus_mlx.agent.sidecar import sidecar_messages
from nexus_mlx.errors import ArgumentError, RunError, ToolError
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
TIME_REQUEST = [*CONVERSATION[:-1],
                {"role": "user", "content": "What is the current time in the Asia/Tokyo timezone?"}]


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
    # the same call as an OpenAI client (or the agent loop) sends it: arguments as JSON text
    openai_form = [dict(m) for m in CONVERSATION]
    openai_form[2] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {
            "name": "create_repository", "arguments": '{"name": "demo", "private": true}'}}]}
    assert sidecar_messages(openai_form, window=2) == short


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


@pytest.fixture(scope="module")
def time_turn(agent):
    return agent.turn(TIME_REQUEST)


def test_turn_routes_generates_and_executes(agent, time_turn):
    """The request names its IANA zone, so the 135M model's call is one the server accepts:
    the executed result must be the server's answer for that zone, not a refusal."""
    turn = time_turn
    assert turn.route.chosen == "time.get_current_time"
    assert turn.call.name == "time.get_current_time" and turn.call.valid
    assert turn.call.arguments == {"timezone": "Asia/Tokyo"}
    assert {"route", "arguments"} <= set(turn.timings)
    before = datetime.now(timezone.utc)
    result = agent.execute(turn)
    assert isinstance(result, McpCallResult)
    assert not result.is_error, result.text
    answer = json.loads(result.text)
    assert answer["timezone"] == "Asia/Tokyo"
    when = datetime.fromisoformat(answer["datetime"])
    assert when.utcoffset() == timedelta(hours=9)  # Japan has no daylight saving time
    assert abs((when - before).total_seconds()) < 120  # "now", not a made-up time


def test_a_refused_call_comes_back_as_an_error_result(agent, time_turn):
    """A schema-valid call with an argument the server rejects is reported, not raised (so
    ``is_error`` above really separates an answer from a refusal)."""
    call = dataclasses.replace(time_turn.call, arguments={"timezone": "Mars/Olympus_Mons"})
    result = agent.execute(dataclasses.replace(time_turn, call=call))
    assert result.is_error and "Mars/Olympus_Mons" in result.text


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


class _HealFails(Session):
    """A session whose healing (run while the calls execute) fails."""

    def heal(self, max_rows=None):
        raise RuntimeError("injected heal failure")


def _fresh_agent(agent, **options):
    return Agent(agent.model, agent.tokenizer, agent.registry, agent.router, agent.servers,
                 max_argument_tokens=24, **options)


def test_a_run_that_fails_after_a_call_keeps_the_call_in_the_history(agent):
    fresh = _fresh_agent(agent)
    fresh.session = _HealFails(agent.model, agent.tokenizer)
    with pytest.raises(RunError, match="injected heal failure") as raised:
        fresh.run("What is the current time in UTC?", tool_choice="required", max_steps=2,
                  max_tokens=48)
    run = raised.value.run
    assert isinstance(raised.value.__cause__, RuntimeError) and run.finish == "error"
    assert run.executions and run.executions[0].name in agent.registry.names()
    assert fresh.history == run.messages
    assert [m["role"] for m in fresh.history] == ["user", "assistant", "tool"]
    assert fresh.history[-1]["content"] == run.executions[0].output
    fresh.reset()
    assert fresh.history == [] and fresh.session is None


def test_max_requests_keeps_the_last_exchanges_on_the_live_session(agent):
    fresh = _fresh_agent(agent, max_requests=2)
    asked = ["Say hello.", "Name a colour.", "Name a fruit."]
    runs = [fresh.run(q, tool_choice="none", max_steps=1, max_tokens=6) for q in asked]
    users = [m["content"] for m in fresh.history if m["role"] == "user"]
    assert users == asked[1:]
    assert fresh.history[0] == {"role": "user", "content": "Name a colour."}
    # the first exchange was deleted from the live cache, not the conversation re-encoded
    third = runs[2].steps[0]
    assert third.reused > 0 and third.computed < third.prompt_tokens
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ArgumentError, match="max_requests"):
            _fresh_agent(agent, max_requests=bad)
