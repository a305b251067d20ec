"""The agent loop over a live session, on real parts: the live mcp-server-time, the default LLM
with constrained calls in the model's own format; pruning of old tool results; failures that
become tool results instead of exceptions."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nexus_mlx.agent.loop import (
    DEFAULT_ANSWER_PROMPT,
    execute_call,
    last_exchanges,
    openai_tool,
    pruned,
    run_agent,
    server_for,
)
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.session import Session
from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.errors import ArgumentError, RunError
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool


def test_pruning_replaces_only_old_bulky_results():
    msgs = [{"role": "user", "content": "q"},
            {"role": "tool", "name": "git_log", "content": "x" * 1000},
            {"role": "tool", "name": "git_log", "content": "short"},
            {"role": "tool", "name": "git_log", "content": "y" * 1000}]
    out = pruned(msgs, keep_from=3, payload_chars=100)
    assert out[1]["content"].startswith("[result of git_log") and len(out[1]["content"]) < 200
    assert out[2]["content"] == "short" and out[3]["content"] == "y" * 1000
    assert msgs[1]["content"] == "x" * 1000  # the caller's messages are not modified


def test_unknown_tools_and_missing_servers_become_error_results():
    registry = ToolRegistry([Tool("now", "the time", {"type": "object", "properties": {}},
                                  server="time")])
    unknown = execute_call(ParsedCall("time.rm", {}), registry, {})
    assert not unknown.ok and unknown.output.startswith("error: unknown tool 'time.rm'")
    orphan = execute_call(ParsedCall("time.now", {}), registry, {})
    assert not orphan.ok and "no running server" in orphan.output
    assert openai_tool(registry.get("time.now"))["function"]["name"] == "time.now"


def test_a_tool_is_owned_by_its_namespace_even_when_its_name_has_dots():
    registry = ToolRegistry([Tool("files.read", "read a file", {"type": "object", "properties": {}}),
                             Tool("now", "the time", {"type": "object", "properties": {}},
                                  server="time")])
    plain, timed = object(), object()  # the registry decides the owner; nothing is called
    servers = {"": plain, "time": timed}
    assert server_for(servers, registry, "files.read") is plain
    assert server_for(servers, registry, "time.now") is timed
    assert server_for(servers, registry, "time.later") is None  # not a registry tool
    assert server_for({"time": timed}, registry, "files.read") is None


def test_a_call_cut_at_max_tokens_is_not_reported_as_the_answer(default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    run = run_agent(Session(model, tokenizer), [], "What is the current time in UTC?", registry,
                    servers, tool_choice="required", max_steps=1, max_tokens=3)
    assert not run.executions and run.replies[-1].finish_reason == "length"
    assert run.finish in ("length", "call_error"), run.finish


def test_empty_requests_are_refused(default_model):
    model, tokenizer = default_model
    with pytest.raises(ArgumentError, match="empty"):
        run_agent(Session(model, tokenizer), [], "  ", ToolRegistry(), {})
    for bad in ("", "   ", 3):
        with pytest.raises(ArgumentError, match="answer_prompt"):
            run_agent(Session(model, tokenizer), [], "q", ToolRegistry(), {}, answer_prompt=bad)
    for bad in (0, -1, float("nan"), True, "5"):
        with pytest.raises(ArgumentError, match="call_timeout"):
            run_agent(Session(model, tokenizer), [], "q", ToolRegistry(), {}, call_timeout=bad)


@pytest.fixture(scope="module")
def time_server():
    """The live mcp-server-time: its registry and the servers mapping ``run_agent`` takes."""
    spec = installed_server("mcp-server-time", "mcp_server_time", namespace="time",
                            call_timeout=20)
    with McpServer(spec) as server:
        yield server.list_tools(), {"time": server}


def test_the_loop_calls_a_live_server_and_reuses_the_cache(default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    run = run_agent(Session(model, tokenizer), [], "What is the current time in the UTC timezone?",
                    registry, servers, tool_choice="required", max_steps=2, max_tokens=64)
    assert run.executions, "the first step is forced to call a tool"
    first = run.executions[0]
    assert first.name in registry.names()
    tool_turns = [m for m in run.messages if m["role"] == "tool"]
    assert tool_turns and tool_turns[0]["content"] == first.output
    call = next(m for m in run.messages if m.get("tool_calls"))["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == first.arguments
    if first.ok:  # the server accepted the call: its answer is real JSON from the server
        assert "datetime" in json.loads(first.output) or "time" in first.output
    # the second step keeps the whole first prompt; only the re-rendered call (its tokens may
    # differ from the sampled ones) and the tool result are computed
    assert len(run.steps) >= 2 and run.steps[1].reused >= run.steps[0].prompt_tokens
    assert run.steps[1].computed < run.steps[1].prompt_tokens - run.steps[0].prompt_tokens + 64
    assert run.finish in ("answer", "step_limit")


class _DescribesItsFirstCall(Session):
    """A session whose model, left free on its first turn, writes the call as JSON in prose (as
    Qwen2.5-Coder-0.5B does) instead of in the call format; every other turn is the model's."""

    written_name = "time.get_current_time"

    @property
    def prose(self) -> str:
        return ('To get the time, use `time.get_current_time`. Here is the JSON object for that:\n'
                f'{{"name": "{self.written_name}", "arguments": {{"timezone": "UTC"}}}}')

    def generate(self, messages, tools=None, **kwargs):
        reply = super().generate(messages, tools, **kwargs)
        if kwargs.get("tool_choice", "auto") == "auto" and not getattr(self, "_described", False):
            self._described = True
            return dataclasses.replace(reply, text=self.prose, content=self.prose, tool_calls=[])
        return reply


@pytest.mark.parametrize("written_name", ["time.get_current_time", "get_current_time"])
def test_a_call_written_as_prose_is_made_in_the_format(default_model, time_server, written_name):
    model, tokenizer = default_model
    registry, servers = time_server
    session = _DescribesItsFirstCall(model, tokenizer)
    session.written_name = written_name  # a near name means the one offered tool it fits
    run = run_agent(session, [], "What is the current time in UTC?", registry, servers,
                    max_steps=2, max_tokens=64)
    assert run.regenerated[0] == "step 0: ['time.get_current_time'] written as text, forced"
    first = run.executions[0]
    assert first.name == "time.get_current_time" and first.ok, first.output
    assert "datetime" in json.loads(first.output)
    assert run.messages[1]["tool_calls"][0]["function"]["name"] == "time.get_current_time"


class _Records(Session):
    """A session that keeps the messages each step was shown."""

    def generate(self, messages, tools=None, **kwargs):
        self.shown = [*getattr(self, "shown", []), [dict(m) for m in messages]]
        return super().generate(messages, tools, **kwargs)


@pytest.mark.parametrize("answer_prompt", [DEFAULT_ANSWER_PROMPT, "Answer briefly.",
                                           "Asked: {request} {x}", None])
def test_the_answer_prompt_follows_tool_results_only_and_is_never_kept(
        default_model, time_server, answer_prompt):
    model, tokenizer = default_model
    registry, servers = time_server
    session = _Records(model, tokenizer)
    request = "What is the current time in UTC?"
    run = run_agent(session, [], f" {request}\n", registry, servers, tool_choice="required",
                    max_steps=2, max_tokens=48, answer_prompt=answer_prompt)
    assert run.executions and session.shown[0][-1]["content"] == f" {request}\n"
    after_results = session.shown[1]
    if answer_prompt is None:
        assert after_results[-1]["role"] == "tool"
    else:
        shown = answer_prompt.replace("{request}", request)  # the request's text, stripped
        assert after_results[-1] == {"role": "user", "content": shown}
        assert after_results[-2]["role"] == "tool"
        assert all(m.get("content") != shown for m in run.messages)
    assert [m["role"] for m in run.messages[:3]] == ["user", "assistant", "tool"]


def test_last_exchanges_drops_whole_exchanges_from_the_start():
    msgs = [{"role": "system", "content": "s"},
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "content": "r"}, {"role": "assistant", "content": "B"},
            {"role": "user", "content": "c"}]
    assert last_exchanges(msgs, 5) == msgs
    assert last_exchanges(msgs, 2) == [msgs[0], *msgs[3:]]
    assert last_exchanges(msgs, 1) == [msgs[0], msgs[-1]]
    assert last_exchanges(msgs, 0) == [msgs[0]]
    assert last_exchanges(msgs, 2)[1] is not msgs[3]  # copies: the caller's list is untouched


class _FailsToGenerate(Session):
    def generate(self, messages, tools=None, **kwargs):
        raise RuntimeError("injected model failure")


def test_a_failure_before_any_call_propagates_as_it_is(default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    with pytest.raises(RuntimeError, match="injected model failure") as raised:
        run_agent(_FailsToGenerate(model, tokenizer), [], "What time is it?", registry, servers)
    assert not isinstance(raised.value, RunError)


def test_the_latest_results_are_shown_up_to_result_chars():
    msgs = [{"role": "user", "content": "q"},
            {"role": "tool", "name": "git_log", "content": "x" * 1000},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "name": "git_diff", "content": "y" * 1000}]
    out = pruned(msgs, keep_from=2, payload_chars=100, result_chars=300)
    assert out[1]["content"].startswith("[result of git_log")
    assert out[3]["content"] == "y" * 300 + "\n[... 700 more characters not shown]"
    assert pruned(msgs, 2, 100, None)[3]["content"] == "y" * 1000
    assert pruned(msgs, 2, 100, 1000)[3]["content"] == "y" * 1000


@pytest.mark.parametrize("option, bad", [("payload_chars", 0), ("payload_chars", None),
                                         ("result_chars", -5), ("result_chars", True)])
def test_bad_result_limits_are_refused(default_model, option, bad):
    model, tokenizer = default_model
    with pytest.raises(ArgumentError, match=option):
        run_agent(Session(model, tokenizer), [], "q", ToolRegistry(), {}, **{option: bad})
