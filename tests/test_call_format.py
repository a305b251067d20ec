"""Tool calls in the model's own format: the call schema, the parser (fuzzed), the turn
constraint driven token by token over a real tokenizer, and the text rendering for templates
that know nothing of tools."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.decode.call_format import (
    CALL_CLOSE,
    CALL_OPEN,
    call_schema,
    call_spans,
    checked_calls,
    cut_at_stop,
    grounded_calls,
    normalized_messages,
    parse_tool_calls,
    textual_messages,
)
from nexus_mlx.decode.turn_constraint import (
    CallsOrResponse,
    ResponseConstraint,
    TurnConstraint,
    response_schema,
    turn_constraint,
)
from nexus_mlx.errors import ArgumentError, ToolError

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in an IANA timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
LOG = {"type": "function", "function": {
    "name": "git_log", "description": "Recent commits",
    "parameters": {"type": "object", "properties": {"max_count": {"type": "integer"}}}}}


def test_call_schema_has_one_alternative_per_tool():
    one = call_schema([TIME])
    assert one["properties"]["name"] == {"const": "get_time"} and one["required"] == ["name", "arguments"]
    both = call_schema([TIME, LOG])
    assert [a["properties"]["name"]["const"] for a in both["anyOf"]] == ["get_time", "git_log"]
    with pytest.raises(ToolError):
        call_schema([])
    with pytest.raises(ToolError, match="non-empty name"):
        call_schema([{"type": "function", "function": {"name": ""}}])


def test_parse_calls_and_prose():
    text = (f"Let me check.\n{CALL_OPEN}\n" + '{"name": "get_time", "arguments": {"timezone": "UTC"}}'
            + f"\n{CALL_CLOSE}\n{CALL_OPEN}\n" + '{"name": "git_log", "arguments": "{\\"max_count\\": 2}"}'
            + f"\n{CALL_CLOSE}")
    turn = parse_tool_calls(text)
    assert turn.content == "Let me check."
    assert [(c.name, c.arguments) for c in turn.calls] == [("get_time", {"timezone": "UTC"}),
                                                           ("git_log", {"max_count": 2})]
    broken = parse_tool_calls(f"{CALL_OPEN}\n{{\"name\": 3}}\n{CALL_CLOSE}{CALL_OPEN}{{oops")
    assert broken.calls == [] and len(broken.errors) == 2
    unclosed = parse_tool_calls(f'{CALL_OPEN}\n{{"name": "git_log", "arguments": {{}}}}')
    assert [c.name for c in unclosed.calls] == ["git_log"]


def test_bare_json_calls_count_only_for_offered_tools():
    fenced = 'Here:\n```json\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n```'
    turn = parse_tool_calls(fenced, ["get_time"])
    assert [(c.name, c.arguments) for c in turn.calls] == [("get_time", {"timezone": "UTC"})]
    assert turn.content == "Here:"
    assert parse_tool_calls(fenced).calls == []  # without names, tags are required
    assert parse_tool_calls('{"name": "rm", "arguments": {}}', ["get_time"]).calls == []
    bare = parse_tool_calls('{"name": "get_time", "arguments": {}}', ["get_time"])
    assert [c.name for c in bare.calls] == ["get_time"] and bare.content == ""
    checked = checked_calls(bare, [TIME])  # the required timezone is missing
    assert checked.calls == [] and "timezone" in checked.errors[0]
    good = checked_calls(parse_tool_calls(fenced, ["get_time"]), [TIME, LOG])
    assert [c.name for c in good.calls] == ["get_time"] and good.errors == []
    assert checked_calls(good, [LOG]).errors == ["'get_time' is not an offered tool"]


def test_grounded_calls_drop_optional_arguments_the_conversation_does_not_support():
    text = (f"{CALL_OPEN}\n" + '{"name": "git_log", "arguments": {"max_count": 10}}' + f"\n{CALL_CLOSE}"
            f"\n{CALL_OPEN}\n" + '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'
            + f"\n{CALL_CLOSE}")
    turn = checked_calls(parse_tool_calls(text), [TIME, LOG])
    grounded = grounded_calls(turn, [TIME, LOG], "the three latest commits, and the time")
    assert [(c.name, c.arguments, c.dropped) for c in grounded.calls] == [
        ("git_log", {}, {"max_count": 10}),                   # optional and invented: dropped
        ("get_time", {"timezone": "Asia/Tokyo"}, {})]          # required: never judged
    said = grounded_calls(turn, [TIME, LOG], "show me the last 10 commits")
    assert said.calls[0].arguments == {"max_count": 10} and said.calls[0].dropped == {}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list('<>/{}":, \n1') + ["tool_call", "name", "arguments", CALL_OPEN,
                                                      CALL_CLOSE, "a"]), max_size=40))
def test_parser_never_raises(pieces):
    text = "".join(pieces)
    turn = parse_tool_calls(text)
    assert isinstance(turn.content, str)
    for call in turn.calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)


def _drive(constraint, tokenizer, text: str) -> list[bool]:
    """Feed ``text``'s tokens, recording whether each was allowed by the mask before it."""
    allowed = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        mask = constraint.allowed()
        allowed.append(mask is None or bool(mask[token]))
        constraint.accept(token)
    return allowed


CALL_TEXT = f'{CALL_OPEN}\n{{"name": "get_time", "arguments": {{"timezone": "UTC"}}}}\n{CALL_CLOSE}'


def test_required_forces_the_opener_and_the_schema(default_tokenizer):
    tc = TurnConstraint(default_tokenizer, [TIME, LOG], "required", parallel=False)
    first = tc.allowed()
    assert first is not None and first.sum() == 1
    assert all(_drive(tc, default_tokenizer, CALL_TEXT))
    assert tc.calls == 1
    end = tc.allowed()
    assert end is not None and set(np.flatnonzero(end)) == set(tc.eos_ids)


def test_after_a_parallel_call_only_another_call_or_the_end(default_tokenizer):
    tc = TurnConstraint(default_tokenizer, [TIME, LOG], "required", parallel=True)
    assert all(_drive(tc, default_tokenizer, CALL_TEXT))
    after = tc.allowed()
    assert after is not None and 2 <= after.sum() <= 2 + len(tc.eos_ids)
    assert all(_drive(tc, default_tokenizer, "\n" + CALL_TEXT.replace("UTC", "Asia/Tokyo")))
    assert tc.calls == 2 and not tc.repeated
    more = tc.allowed()
    assert more is not None and more.sum() > len(tc.eos_ids)  # a third call may follow
    assert all(_drive(tc, default_tokenizer, "\n" + CALL_TEXT))  # the first again, verbatim
    end = tc.allowed()
    assert tc.repeated and end is not None and set(np.flatnonzero(end)) == set(tc.eos_ids)


def test_auto_is_free_until_the_opener_then_refuses_unknown_names(default_tokenizer):
    tc = TurnConstraint(default_tokenizer, [TIME], "auto")
    assert tc.allowed() is None
    _drive(tc, default_tokenizer, f"Sure.{CALL_OPEN}\n")
    mask = tc.allowed()
    assert mask is not None
    wrong = default_tokenizer.encode('{"name": "rm', add_special_tokens=False)
    ok = _drive(tc, default_tokenizer, '{"name": "')
    assert all(ok)
    assert not mask.all()
    bad = default_tokenizer.encode("rm", add_special_tokens=False)[0]
    assert not tc.allowed()[bad], wrong


def test_named_choice_restricts_to_that_tool(default_tokenizer):
    tc = TurnConstraint(default_tokenizer, [TIME, LOG], {"type": "function",
                                                         "function": {"name": "git_log"}})
    text = f'{CALL_OPEN}\n{{"name": "get_time", "arguments": {{"timezone": "UTC"}}}}'
    assert not all(_drive(tc, default_tokenizer, text))
    with pytest.raises(ArgumentError, match="not among"):
        TurnConstraint(default_tokenizer, [TIME], {"type": "function", "function": {"name": "x"}})
    with pytest.raises(ArgumentError):
        TurnConstraint(default_tokenizer, [TIME], 42)  # type: ignore[arg-type]


def test_allowed_tools_constrain_calls_to_a_subset(default_tokenizer):
    only_log = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "git_log"}}]}}
    tc = TurnConstraint(default_tokenizer, [TIME, LOG], only_log)
    first = tc.allowed()
    assert first is not None and first.sum() == 1  # required: the opener is forced
    assert not all(_drive(tc, default_tokenizer, CALL_TEXT))  # get_time is not allowed
    auto = TurnConstraint(default_tokenizer, [TIME, LOG], {**only_log, "allowed_tools": {
        **only_log["allowed_tools"], "mode": "auto"}})
    assert auto.allowed() is None  # free text until the model opens a call
    with pytest.raises(ArgumentError, match="not among"):
        TurnConstraint(default_tokenizer, [TIME], only_log)
    for bad in ({"type": "allowed_tools", "allowed_tools": {"mode": "none", "tools": []}},
                {"type": "allowed_tools"}, {"type": "banana", "function": {"name": "git_log"}}):
        with pytest.raises(ArgumentError):
            TurnConstraint(default_tokenizer, [TIME, LOG], bad)


def test_response_format(default_tokenizer):
    assert response_schema({"type": "text"}) is None
    assert response_schema({"type": "json_object"}) == {"type": "object"}
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    assert response_schema({"type": "json_schema", "json_schema": {"schema": schema}}) == schema
    for bad in ({"type": "xml"}, {"type": "json_schema", "json_schema": {}}):
        with pytest.raises(ArgumentError):
            response_schema(bad)
    rc = ResponseConstraint(default_tokenizer, schema)
    assert all(_drive(rc, default_tokenizer, '{"city": "Paris"}'))
    assert set(np.flatnonzero(rc.allowed())) == set(rc.eos_ids)
    forced = turn_constraint(default_tokenizer, [TIME], "required", True, {"type": "json_object"})
    assert isinstance(forced, TurnConstraint)  # a forced turn is calls alone: no content to shape
    assert turn_constraint(default_tokenizer, [], "auto", True, None) is None
    with pytest.raises(ArgumentError, match="needs tools"):
        turn_constraint(default_tokenizer, [], "required", True, {"type": "json_object"})


@pytest.mark.parametrize("reply, calling", [(CALL_TEXT, True), ('{"city": "Paris"}', False)])
def test_auto_with_a_response_format_is_calls_or_the_format(default_tokenizer, reply, calling):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    turn = turn_constraint(default_tokenizer, [TIME, LOG], "auto", False,
                           {"type": "json_schema", "json_schema": {"schema": schema}})
    assert isinstance(turn, CallsOrResponse) and not turn.calling
    first = turn.allowed()
    prose = default_tokenizer.encode("Sure", add_special_tokens=False)[0]
    assert first is not None and not first[prose]  # no prose: a call or the JSON value
    assert all(_drive(turn, default_tokenizer, reply))
    assert turn.calling is calling
    end = turn.allowed()
    assert end is not None and set(np.flatnonzero(end)) == set(turn_constraint(
        default_tokenizer, [TIME], "required", False, None).eos_ids)
    wrong = CallsOrResponse(TurnConstraint(default_tokenizer, [TIME], "required"),
                            ResponseConstraint(default_tokenizer, schema))
    assert not all(_drive(wrong, default_tokenizer, '{"town": "Paris"}'))


def test_stop_strings_end_prose_never_a_call():
    text = f'Checking.\n{CALL_TEXT}\nDone. Bye'
    assert cut_at_stop(text, ["\n"]) == "Checking."
    assert cut_at_stop(text, ["}", "Bye"], calls=True) == text[: text.index("Bye")]
    assert cut_at_stop(text, ["\n"], calls=True) == "Checking."
    after = text[text.index(CALL_OPEN):]
    assert cut_at_stop(after, ["\n", "UTC"], calls=True) == after[: after.index(CALL_CLOSE)
                                                                     + len(CALL_CLOSE)]
    assert cut_at_stop("Hi <tool_c", ["_c"], calls=True) == "Hi <tool_c"  # an opener begun
    assert cut_at_stop("Hi <tool_c", ["_c"]) == "Hi <tool"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "\n", "}", "{", CALL_OPEN, CALL_CLOSE, "<tool", " ", '"x"']),
                max_size=12),
       st.lists(st.sampled_from(["\n", "}", "a", "x", "<", "a\n"]), max_size=3))
def test_cut_at_stop_is_a_prefix_without_the_stop_in_its_prose(pieces, stop):
    text = "".join(pieces)
    for calls in (False, True):
        cut = cut_at_stop(text, stop, calls)
        assert text.startswith(cut)
        spans = call_spans(text) if calls else []
        for s in stop:  # every stop string before the cut starts inside a call
            at = text.find(s)
            while 0 <= at < len(cut):
                assert any(start <= at < end for start, end in spans), (text, s, at)
                at = text.find(s, at + 1)
        if len(cut) < len(text):  # and the cut is at one that does not
            assert any(text.startswith(s, len(cut)) for s in stop)
            assert not any(start <= len(cut) < end for start, end in spans)


def test_a_call_cut_short_leaves_no_tag_in_the_content():
    for n in range(1, len(CALL_OPEN)):
        assert parse_tool_calls("Let me check. " + CALL_OPEN[:n]).content == "Let me check."
    assert parse_tool_calls("a < b").content == "a < b"
    assert parse_tool_calls("Compare: a <", ended=True).content == "Compare: a <"  # its own end
    for n in range(1, len(CALL_CLOSE) + 2):  # its closer (and outer brace) cut: it counts
        turn = parse_tool_calls(CALL_TEXT[:-n])
        assert [(c.name, c.arguments) for c in turn.calls] == [("get_time", {"timezone": "UTC"})]
        assert turn.content == "" and not turn.errors
    cut = parse_tool_calls(CALL_TEXT[: -len(CALL_CLOSE) - 3])  # the arguments unfinished
    assert not cut.calls and cut.errors


def test_messages_for_templates_without_tools():
    msgs = normalized_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_time", "arguments": '{"timezone": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ])
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"timezone": "UTC"}
    text = textual_messages(msgs, [TIME])
    assert text[0]["role"] == "system" and text[0]["content"].startswith("Be brief.")
    assert '"name": "get_time"' in text[0]["content"] and "<tools>" in text[0]["content"]
    call = json.loads(text[2]["content"].split("\n")[1])
    assert call == {"name": "get_time", "arguments": {"timezone": "UTC"}}
    assert text[3] == {"role": "user", "content": "<tool_response>\n12:00\n</tool_response>"}
    with pytest.raises(ArgumentError, match="not JSON"):
        normalized_messages([{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{oops"}}]}])
    with pytest.raises(ArgumentError, match="role"):
        normalized_messages([{"content": "no role"}])


ZONE = {"type": "function", "function": {
    "name": "get_time", "description": "Current time",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"},
                                                    "format": {"type": "string"}},
                   "required": ["timezone"]}}}


def test_restraint_adds_an_optional_argument_only_when_it_wins_by_the_margin(default_tokenizer):
    import mlx.core as mx

    for margin in (5.0, 0.0):
        tc = TurnConstraint(default_tokenizer, [ZONE], "required", optional_margin=margin)
        assert tc.member_choice() is None  # the opener is still forced
        assert all(_drive(tc, default_tokenizer, f'{CALL_OPEN}\n{{"name": "get_time", '
                                                 '"arguments": {"timezone": "UTC'))
        choice = tc.member_choice()
        assert choice is not None
        ends, goes_on = choice
        mask = tc.allowed()
        assert mask[ends].all() and mask[goes_on].all()
        go, end = int(goes_on[0]), int(ends[0])
        row = np.zeros(len(mask), dtype=np.float32)
        row[go] = 3.0  # goes on, but by less than 5 nats
        expected = end if margin else go
        assert tc.restrain(go, mx.array(row)) == expected
        row[go] = 7.0
        assert tc.restrain(go, mx.array(row)) == go
        letter = default_tokenizer.encode("x", add_special_tokens=False)[0]
        assert tc.restrain(letter, mx.array(row)) == letter  # the value goes on: untouched
    with pytest.raises(ArgumentError, match="optional_margin"):
        TurnConstraint(default_tokenizer, [ZONE], "auto", optional_margin=-1.0)


def test_required_arguments_are_never_restrained(default_tokenizer):
    tc = TurnConstraint(default_tokenizer, [ZONE], "required")
    _drive(tc, default_tokenizer, f'{CALL_OPEN}\n{{"name": "get_time", "arguments": {{')
    assert tc.member_choice() is None  # "timezone" is still owed: the object cannot end
