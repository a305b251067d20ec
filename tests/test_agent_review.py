"""The agent loop's completeness review: the model's split of the request read safely, the
split decoded under its schema by the real default model, and the loop acting on it over the
live mcp-server-time (a call required for each part, the calls not made yet made together, the
review's messages never kept, a run reviewed once)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from nexus_mlx.agent.loop import run_agent
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.review import (
    DEFAULT_SPLIT_PROMPT,
    EVERY_PART_PROMPT,
    MAX_PARTS,
    SPLIT_SCHEMA,
    follow_up_prompt,
    from_request,
    part_key,
    parts_of,
    split_reply,
    with_request,
)
from nexus_mlx.agent.session import Session
from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.errors import ArgumentError
from nexus_mlx.tools.registry import ToolRegistry

REQUEST = "What changed in the last commit, and what time was that in Tokyo?"


@pytest.mark.parametrize("text, parts", [
    ('{"parts": ["What changed in the last commit", " what time was that in Tokyo ", "", 3, '
     '"What time was that in Tokyo?"]}',
     ["What changed in the last commit", "what time was that in Tokyo"]),
    ('{"parts": []}', []),
    ('{"parts": "not a list"}', []),
    ('["parts"]', []),
    ('{"parts": ["What changed in the last commit", "Tokyo', []),  # cut at max_tokens
    ("", []),
    (json.dumps({"parts": [f"the last commit {i}{i}{i}" for i in range(9)]}),
     [f"the last commit {i}{i}{i}" for i in range(MAX_PARTS)]),
])
def test_the_split_is_read_as_its_distinct_parts_of_the_request(text, parts):
    assert parts_of(text, REQUEST) == parts


@pytest.mark.parametrize("remark, asked", [
    ("The tool results above already answer the request.", REQUEST),
    ("Split my request into its parts.", REQUEST),  # the question copied (Qwen 0.5B)
    ("...", REQUEST), ("a", REQUEST), ("The diff of parser.py", REQUEST),
    # a task of the model's own (Qwen 1.5B): two of its six words are not the request's
    ("Get current time in America/New_York",
     "Convert 14:30 in America/New_York to Europe/London time."),
])
def test_text_that_is_not_a_part_of_the_request_is_dropped(remark, asked):
    assert not from_request(remark, asked)
    assert parts_of(json.dumps({"parts": [remark]}), asked) == []


def test_a_part_in_other_words_of_the_request_is_kept():
    assert from_request("Tell me the current time in Tokyo",
                        "Convert 18:30 in Europe/Berlin, and tell me the current time in Tokyo.")
    assert part_key("What time was that in Tokyo?") == part_key("what TIME was that in tokyo")


def test_reading_any_text_never_raises():
    rng = random.Random(7)
    alphabet = '{}[]",: parts\\0a1'
    base = '{"parts": ["x parts", "a1 0a"]}'
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        cut = base[: rng.randint(0, len(base))]
        for candidate in (text, cut):
            parts = parts_of(candidate, "x parts a1 0a")
            assert isinstance(parts, list) and all(isinstance(p, str) and p for p in parts)


def test_the_follow_up_names_the_part():
    assert follow_up_prompt("the time in Tokyo").endswith("this part of my request: the time "
                                                          "in Tokyo")


@pytest.fixture(scope="module")
def time_server():
    spec = installed_server("mcp-server-time", "mcp_server_time", namespace="time",
                            call_timeout=20)
    with McpServer(spec) as server:
        yield ToolRegistry(server.list_tools()), {"time": server}


def test_the_model_splits_under_the_schema(default_model, time_server):
    model, tokenizer = default_model
    registry, _ = time_server
    tools = [{"type": "function", "function": {"name": t.qualified_name,
                                               "description": t.description,
                                               "parameters": dict(t.input_schema)}}
             for t in registry]
    request = "What time is it in UTC, and in Tokyo?"
    reply = split_reply(Session(model, tokenizer), [{"role": "user", "content": "Hi"}], tools,
                        request)
    assert not reply.tool_calls
    assert reply.text.startswith('{"parts": [')  # the schema's grammar, from token one
    if reply.finish_reason == "length":
        assert parts_of(reply.text, request) == []  # a cut split names no part
    else:  # a finished split is one object under the schema
        value = json.loads(reply.text)
        assert set(value) == set(SPLIT_SCHEMA["required"])
        assert all(isinstance(p, str) for p in value["parts"])


UTC = ParsedCall("time.get_current_time", {"timezone": "UTC"})
TOKYO = ParsedCall("time.get_current_time", {"timezone": "Asia/Tokyo"})


class _Scripted(Session):
    """The default model, decoding every reply, with what a small model does with a two-part
    request scripted over it: a call for the first part, then a text answer; split into
    ``parts`` when asked; asked for a part's call, the call made already for the UTC part and
    a new one for the Tokyo part."""

    parts: list[str] = ["the current time in UTC", "the current time in Tokyo"]

    def generate(self, messages, tools=None, **kwargs):
        self.shown = [*getattr(self, "shown", []), ([dict(m) for m in messages], dict(kwargs))]
        reply = super().generate(messages, tools, **{**kwargs, "max_tokens": 4})
        last = str(messages[-1].get("content") or "")
        if kwargs.get("response_format"):
            text = json.dumps({"parts": self.parts})
            return dataclasses.replace(reply, text=text, content=text)
        if last.startswith("Call a tool now for this part"):
            return self._calls([UTC if last.endswith("UTC") else TOKYO], reply)
        if len(self.shown) == 1:
            return self._calls([UTC], reply)
        return dataclasses.replace(reply, text="I cannot tell.", content="I cannot tell.",
                                   tool_calls=[], finish_reason="stop")

    @staticmethod
    def _calls(calls, reply):
        return dataclasses.replace(reply, tool_calls=calls, content="",
                                   finish_reason="tool_calls")


REQUEST_2 = "What is the current time in UTC, and the current time in Tokyo?"


def test_each_part_is_asked_for_its_call_and_the_missing_one_is_made(default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    session = _Scripted(model, tokenizer)
    run = run_agent(session, [], REQUEST_2, registry, servers, max_steps=4)
    assert [(e.name, e.arguments, e.ok) for e in run.executions] == [
        (UTC.name, UTC.arguments, True), (TOKYO.name, TOKYO.arguments, True)]
    assert run.regenerated == ["step 1: review: part 'the current time in Tokyo' needs "
                               "['time.get_current_time'], not called yet"]
    assert run.finish == "answer" and run.answer == "I cannot tell."
    kinds = [("split" if kw.get("response_format") else m[-1]["content"]
              if kw.get("tool_choice") == "required" else "step") for m, kw in session.shown]
    assert kinds == ["step", "step", "split", follow_up_prompt(session.parts[0]),
                     follow_up_prompt(session.parts[1]), "step"]  # split once, each part once
    assert session.shown[2][0][-1]["content"] == with_request(DEFAULT_SPLIT_PROMPT, REQUEST_2)
    after_call = session.shown[5][0]  # the answer step asks for every part of the request
    assert after_call[-1]["content"] == with_request(EVERY_PART_PROMPT, REQUEST_2)
    assert after_call[-2]["role"] == "tool"
    texts = json.dumps(run.messages)
    assert "Split my request" not in texts and "this part of my request" not in texts
    assert [m["role"] for m in run.messages] == ["user", "assistant", "tool", "assistant",
                                                 "tool", "assistant"]


def test_one_part_no_call_or_no_review_keeps_the_answer(default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    one = _Scripted(model, tokenizer)
    one.parts = [REQUEST_2]
    run = run_agent(one, [], REQUEST_2, registry, servers, max_steps=3)
    assert run.answer == "I cannot tell." and len(run.executions) == 1 and not run.regenerated
    assert sum(bool(kw.get("response_format")) for _, kw in one.shown) == 1  # split, no follow-up
    off = _Scripted(model, tokenizer)
    run = run_agent(off, [], REQUEST_2, registry, servers, max_steps=3, review=False)
    assert run.answer == "I cannot tell." and len(off.shown) == 2
    uncalled = _Scripted(model, tokenizer)
    uncalled.shown = [([], {})]  # its first reply is the text answer: no call ran
    run = run_agent(uncalled, [], REQUEST_2, registry, servers, max_steps=3)
    assert run.answer == "I cannot tell." and not run.executions and len(uncalled.shown) == 2


@pytest.mark.parametrize("bad", [-1, 0, 2, "yes", None])
def test_bad_review_switches_are_refused(default_model, bad):
    model, tokenizer = default_model
    with pytest.raises(ArgumentError, match="review must be True or False"):
        run_agent(Session(model, tokenizer), [], "q", ToolRegistry(), {}, review=bad)
