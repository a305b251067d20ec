"""The session benchmark's call comparison: which replies hold a call, and what counts as equal."""

import pytest
from agent_session import call_agreement, first_call, unfinished_call

from nexus_mlx.decode.call_format import ParsedCall

NAMES = ["get_current_time", "git_log"]
TIME = ParsedCall("get_current_time", {"timezone": "Asia/Tokyo"})


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}\n'
    '</tool_call>',
    '{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}',
    '```json\n{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}\n```',
    'I will call it: {"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}} now.',
])
def test_a_call_in_tags_bare_fenced_or_in_prose_is_read(text):
    assert first_call(text, NAMES) == TIME
    assert not unfinished_call(text, NAMES)


@pytest.mark.parametrize("text", ['{"name": "get_current_time", "argu',
                                  '```json\n{"name": "git_log", "arguments": {"repo_',
                                  '<tool_call>\n{"name": "git_l'])
def test_a_truncated_call_is_unfinished(text):
    assert first_call(text, NAMES) is None
    assert unfinished_call(text, NAMES)


def test_text_and_calls_to_tools_not_offered_are_no_call():
    assert first_call("The time in Tokyo is 10:02.", NAMES) is None
    assert not unfinished_call("The time in Tokyo is 10:02.", NAMES)
    assert first_call('{"name": "delete_repo", "arguments": {}}', NAMES) is None


def test_arguments_decide_equality():
    other = first_call('{"name": "get_current_time", "arguments": {"timezone": "UTC"}}', NAMES)
    assert other is not None and other != TIME and other.name == TIME.name


def test_agreement_counts_only_compared_requests():
    assert call_agreement([None, None]) == {"calls_identical": None, "calls_compared": 0}
    assert call_agreement([True, None, False, True]) == {"calls_identical": pytest.approx(2 / 3),
                                                         "calls_compared": 3}
