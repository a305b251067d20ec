"""Calls written as prose: the offered tool a written name means (never a guess between two),
the calls found in a reply's prose (fuzzed), and the first-token constraint of a prose answer
over a real tokenizer."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.decode.call_format import CALL_CLOSE, CALL_OPEN, parse_tool_calls
from nexus_mlx.decode.name_fsm import vocab_of
from nexus_mlx.decode.prose_calls import intended_calls, prose_answer, resolved_name

GIT_AND_TIME = ["git.git_diff", "git.git_diff_staged", "git.git_diff_unstaged", "git.git_log",
                "time.get_current_time", "time.convert_time"]


def test_a_written_name_resolves_to_the_one_offered_tool_it_means():
    assert resolved_name("git.git_log", GIT_AND_TIME) == "git.git_log"
    assert resolved_name("git.diff_unstaged", GIT_AND_TIME) == "git.git_diff_unstaged"
    assert resolved_name("get_current_time", GIT_AND_TIME) == "time.get_current_time"
    assert resolved_name("GIT-DIFF", GIT_AND_TIME) == "git.git_diff"
    assert resolved_name("git.log", GIT_AND_TIME) == "git.git_log"


def test_a_written_name_that_fits_none_or_several_resolves_to_nothing():
    assert resolved_name("time", GIT_AND_TIME) is None  # get_current_time and convert_time
    assert resolved_name("staged_diff", GIT_AND_TIME) is None  # words out of order
    assert resolved_name("git_status", GIT_AND_TIME) is None  # not offered at all
    assert resolved_name("log_git", GIT_AND_TIME) is None  # the last word differs
    assert resolved_name("...", GIT_AND_TIME) is None and resolved_name("", GIT_AND_TIME) is None
    assert resolved_name("git_log", []) is None


def test_calls_written_with_a_near_name_are_found_under_the_offered_name():
    prose = ('Here is the call:\n```json\n{"name": "git.diff_unstaged", "arguments": '
             '{"repo_path": "/r"}}\n```\nand {"name": "time", "arguments": {}}')
    found = intended_calls(prose, GIT_AND_TIME)
    assert [(c.name, c.arguments) for c in found] == [("git.git_diff_unstaged", {"repo_path": "/r"})]


def test_calls_written_as_prose_are_found_for_offered_tools_only():
    prose = ("To get the time, use `get_time`. Here's the JSON object for that:\n"
             '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n'
             '{"timezone": "Asia/Tokyo", "datetime": "..."} then {"name": "rm", "arguments": {}}'
             ' or {"name": "git_log", "arguments": "max 3"} {broken {"name": "get_time", '
             '"arguments": {"timezone": "Asia/Tokyo"}}')
    found = intended_calls(prose, ["get_time", "git_log"])
    assert [(c.name, c.arguments) for c in found] == [("get_time", {"timezone": "Asia/Tokyo"}),
                                                      ("git_log", {})]
    assert parse_tool_calls(prose, ["get_time", "git_log"]).calls == []  # prose is not a call
    tagged = f'{CALL_OPEN}{{"name": "get_time", "arguments": {{}}}}{CALL_CLOSE}'
    assert intended_calls(tagged, ["get_time"]) == []  # calls in the format are not prose
    assert intended_calls("no json here {", ["get_time"]) == []


def test_a_prose_answer_opens_with_a_word(default_tokenizer):
    import mlx.core as mx

    process = prose_answer(default_tokenizer)
    width = len(vocab_of(default_tokenizer).token_bytes)
    first = np.asarray(process(mx.array([], dtype=mx.int32), mx.zeros((1, width))))[0]
    for text in ('{"', " {", "[", "```", "(", "<"):
        token = default_tokenizer.encode(text, add_special_tokens=False)[0]
        assert first[token] == -np.inf, text
    for text in ("The", " Here", "Yes", "19"):
        assert first[default_tokenizer.encode(text, add_special_tokens=False)[0]] == 0, text
    assert all(first[i] == -np.inf for i in vocab_of(default_tokenizer).eos_ids)
    later = np.asarray(process(mx.array([5], dtype=mx.int32), mx.zeros((1, width))))[0]
    assert (later == 0).all()  # only the first id is constrained


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list('<>/{}":, \n1') + ["tool_call", "name", "arguments", CALL_OPEN,
                                                      CALL_CLOSE, "a"]), max_size=40))
def test_intended_calls_never_raise(pieces):
    for call in intended_calls("".join(pieces), ["a", "name"]):
        assert call.name in ("a", "name") and isinstance(call.arguments, dict)


