"""The agent loop's completeness review: the review's JSON read safely, the review decoded
under its schema by the real default model, and the loop acting on it over the live
mcp-server-time (a call required for the parts named unanswered, the review's messages never
kept, the review budget spent and respected)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from nexus_mlx.agent.loop import run_agent
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.review import (
    EVERY_PART_PROMPT,
    MAX_PARTS,
    REVIEW_SCHEMA,
    follow_up_prompt,
    from_request,
    part_key,
    parts_of,
    review_reply,
    worth_asking,
)
from nexus_mlx.agent.session import Session
from nexus_mlx.errors import ArgumentError
from nexus_mlx.tools.registry import ToolRegistry

REQUEST = "What changed in the last commit, and what time was that in Tokyo?"


@pytest.mark.parametrize("text, parts", [
    ('{"answered_parts": ["a"], "unanswered_parts": ["what time was that in Tokyo", '
     '" What time was that in Tokyo ", "", 3, "Tokyo time"]}',
     ["what time was that in Tokyo", "What time was that in Tokyo", "Tokyo time"]),
    ('{"answered_parts": [], "unanswered_parts": []}', []),
    ('{"unanswered_parts": "not a list"}', []),
    ('["unanswered_parts"]', []),
    ('{"answered_parts": ["a"], "unanswered_parts": ["Tokyo"', []),  # cut at max_tokens
    ("", []),
    (json.dumps({"unanswered_parts": [f"the last commit {i}" for i in range(9)]}),
     [f"the last commit {i}" for i in range(MAX_PARTS)]),
])
def test_the_review_is_read_as_its_distinct_parts_of_the_request(text, parts):
    assert parts_of(text, REQUEST) == parts


@pytest.mark.parametrize("remark", [
    "The tool results above already answer the request.",
    "There are no other parts to answer.",
    "...", "a", "The diff of parser.py",
])
def test_remarks_that_are_not_parts_of_the_request_are_dropped(remark):
    assert not from_request(remark, REQUEST)
    assert parts_of(json.dumps({"unanswered_parts": [remark]}), REQUEST) == []


def test_reading_any_text_never_raises():
    rng = random.Random(7)
    alphabet = '{}[]",: unanswered_parts\\0a1'
    base = '{"answered_parts": [], "unanswered_parts": ["x"]}'
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        cut = base[: rng.randint(0, len(base))]
        for candidate in (text, cut):
            parts = parts_of(candidate, "x unanswered_parts a1 0a")
            assert isinstance(parts, list) and all(isinstance(p, str) and p for p in parts)


def test_a_part_is_asked_for_once_and_the_whole_request_only_before_any_call():
    asked: set[frozenset[str]] = set()
    part = "What time was that in Tokyo"
    assert worth_asking(part, REQUEST, asked, called=True)
    asked.add(part_key(part))
    assert not worth_asking("what time was that in Tokyo?", REQUEST, asked, called=True)
    assert worth_asking(REQUEST, REQUEST, asked, called=False)  # nothing ran yet
    assert not worth_asking(REQUEST.upper(), REQUEST, asked, called=True)
    assert worth_asking("What changed in the last commit", REQUEST, asked, called=True)


def test_the_follow_up_names_the_part():
    assert follow_up_prompt("the time in Tokyo").endswith("not answered yet: the time in Tokyo")


@pytest.fixture(scope="module")
def time_server():
    spec = installed_server("mcp-server-time", "mcp_server_time", namespace="time",
                            call_timeout=20)
    with McpServer(spec) as server:
        yield ToolRegistry(server.list_tools()), {"time": server}


def test_the_model_reviews_under_the_schema(default_model, time_server):
    model, tokenizer = default_model
    registry, _ = time_server
    tools = [{"type": "function", "function": {"name": t.qualified_name,
                                               "description": t.description,
                                               "parameters": dict(t.input_schema)}}
             for t in registry]
    request = "What time is it in UTC, and in Tokyo?"
    reply = review_reply(Session(model, tokenizer), [{"role": "user", "content": "Hi"}], tools,
                         request)
    assert not reply.tool_calls
    assert reply.text.startswith('{"answered_parts": [')  # the schema's grammar, from token one
    if reply.finish_reason == "length":  # SmolLM2 lists tool names until the budget ends
        assert parts_of(reply.text, request) == []  # a cut review names no part
    else:  # a finished review is one object under the schema
        value = json.loads(reply.text)
        assert set(value) == set(REVIEW_SCHEMA["required"])
        assert all(isinstance(p, str) for key in value for p in value[key])


class _Scripted(Session):
    """The default model, except that its first free reply is a text answer with no call and
    every review names ``unanswered``: what a small model does with a two-part request."""

    unanswered: list[str] = ["the current time in UTC"]

    def generate(self, messages, tools=None, **kwargs):
        self.shown = [*getattr(self, "shown", []), ([dict(m) for m in messages], dict(kwargs))]
        if kwargs.get("response_format"):
            text = json.dumps({"answered_parts": [], "unanswered_parts": self.unanswered})
            reply = super().generate(messages, tools, **{**kwargs, "max_tokens": 1})
            return dataclasses.replace(reply, text=text, content=text)
        reply = super().generate(messages, tools, **kwargs)
        if kwargs.get("tool_choice", "auto") == "auto" and len(self.shown) == 1:
            return dataclasses.replace(reply, text="I cannot tell.", content="I cannot tell.",
                                       tool_calls=[], finish_reason="stop")
        return reply


def test_an_unanswered_part_gets_a_required_call_on_the_live_server(default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    session = _Scripted(model, tokenizer)
    run = run_agent(session, [], "What is the current time in UTC?", registry, servers,
                    max_steps=2, max_tokens=48, review=2)
    assert run.regenerated[0] == ("step 0: review found 'the current time in UTC' "
                                  "unanswered; a call required")
    assert run.executions and run.executions[0].name in registry.names()
    review, follow_up = session.shown[1], session.shown[2]
    assert review[0][-1]["content"].startswith('My request was: "What is the current time')
    assert follow_up[0][-1]["content"] == follow_up_prompt("the current time in UTC")
    assert follow_up[1]["tool_choice"] == "required"
    after_call = session.shown[3][0]  # the answer step asks for every part of the request
    assert after_call[-1]["content"] == EVERY_PART_PROMPT.replace(
        "{request}", "What is the current time in UTC?")
    assert after_call[-2]["role"] == "tool"
    assert [m["role"] for m in run.messages[:3]] == ["user", "assistant", "tool"]
    texts = json.dumps(run.messages)
    assert "My request was" not in texts and "not answered yet" not in texts
    reviews = sum(bool(kw.get("response_format")) for _, kw in session.shown)
    assert reviews in (1, 2)  # a second one where the step after the call answered in text
    # the same part named again is not asked for again
    assert sum(kw.get("tool_choice") == "required" for _, kw in session.shown) == 1
    if reviews == 2:
        assert run.regenerated[-1].endswith("asked before or the whole request, no call asked")


def test_no_unanswered_part_keeps_the_answer_and_zero_turns_the_review_off(
        default_model, time_server):
    model, tokenizer = default_model
    registry, servers = time_server
    for review, unanswered in ((1, []), (0, ["the current time in UTC"])):
        session = _Scripted(model, tokenizer)
        session.unanswered = unanswered
        run = run_agent(session, [], "What is the current time in UTC?", registry, servers,
                        max_steps=2, max_tokens=48, review=review)
        assert run.answer == "I cannot tell." and run.finish == "answer"
        assert not run.executions and not run.regenerated
        assert len(session.shown) == 1 + review


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_bad_review_counts_are_refused(default_model, bad):
    model, tokenizer = default_model
    with pytest.raises(ArgumentError, match="review must be an integer"):
        run_agent(Session(model, tokenizer), [], "q", ToolRegistry(), {}, review=bad)
