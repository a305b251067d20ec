"""Grounding of optional call arguments (nexus_mlx.decode.grounding): what the request supports,
and what was invented (generate_tool_call's use of it: tests/test_tool_call.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.decode.grounding import Evidence, grounded_arguments, ungrounded_optional, words

SCHEMA = {"type": "object", "required": ["owner", "repo"], "properties": {
    "owner": {"type": "string"}, "repo": {"type": "string"},
    "state": {"type": "string", "enum": ["open", "closed", "all"], "default": "open"},
    "perPage": {"type": "number"}, "labels": {"type": "array", "items": {"type": "string"}},
    "recursive": {"type": "boolean"}, "since": {"type": "string"}, "body": {"type": "string"}}}


@pytest.mark.parametrize("text, value, name", [
    ("star pallets/flask", "pallets", "owner"),            # a substring
    ("Star Pallets/Flask", "pallets/flask", "repo"),       # case and blanks do not matter
    ("list 50 per page", 50, "perPage"),
    ("list fifty... no, twelve per page", 12, "perPage"),  # a number word
    ("a budget of $50,000", 50000, "budget"),              # a thousands separator
    ("the third floor", 3, "floor"),                       # an ordinal
    ("from March 1, 2016", "2016-03-01", "since"),         # a date from a month and numbers
    ("print the tree recursively", True, "recursive"),     # a boolean by its name's stem
    ("fetch only the failed jobs", True, "failed_only"),
    ("label it bug and ui", ["bug", "ui"], "labels"),
    ("the crash on the login page", "Login page crash", "title"),  # every word, any order
    ("reset it", None, "anything"),                        # an explicit null is kept
    ("photos by Nan Goldin", "Goldin Nan", "artist"),  # "nan" is a word, not a number
])
def test_supported_values(text, value, name):
    assert Evidence(text).supports(value, name)


@pytest.mark.parametrize("text, value, name", [
    ("list the issues of octo/demo", 100, "perPage"),
    ("list the issues of octo/demo", "2021-01-01T00:00:00Z", "since"),
    ("list the issues of octo/demo", "English", "language"),
    ("fetch the logs of the jobs that failed", True, "failed_only"),  # "only" is not said
    ("list the files", True, "recursive"),
    ("label it", [], "labels"),                                       # an empty filler
    ("label it", {}, "filter"),
    ("budget of 50", 500, "budget"),                                  # numbers by value
    ("rooms from January 7", 1, "guests"),  # a month is not a number of guests
    ("the crash on the login page", "Fix the broken authentication flow", "title"),
])
def test_invented_values(text, value, name):
    assert not Evidence(text).supports(value, name)


def test_long_prose_needs_half_its_content_words():
    evidence = Evidence("open an issue: the login page crashes when the password field is empty")
    assert evidence.supports("The login page crashes if the password field is left empty", "body")
    assert not evidence.supports("Please note this course is for educational purposes only", "x")


def test_only_optional_arguments_are_dropped_and_defaults_go_too():
    arguments = {"owner": "zzz", "repo": "yyy", "state": "open", "perPage": 100,
                 "labels": ["bug"], "body": "crash"}
    dropped = ungrounded_optional(arguments, SCHEMA, "octo/demo: issues labelled bug, open ones")
    # owner/repo are required (never judged); state equals its default; perPage is invented
    assert dropped == {"state": "open", "perPage": 100, "body": "crash"}
    assert ungrounded_optional({"state": "closed"}, SCHEMA, "the closed issues") == {}


def test_grounded_arguments_never_make_valid_arguments_invalid():
    schema = {**SCHEMA, "minProperties": 3}
    arguments = {"owner": "octo", "repo": "demo", "perPage": 100}
    assert grounded_arguments(arguments, schema, "octo/demo") == (arguments, {})
    assert grounded_arguments(arguments, SCHEMA, "octo/demo") == (
        {"owner": "octo", "repo": "demo"}, {"perPage": 100})


def test_words_split_letters_from_digits_and_keep_numbers_whole():
    assert words("Q3 budget: 50,000.5 in 1,2 step-by-step") == [
        "q", "3", "budget", "50,000.5", "in", "1", "2", "step", "by", "step"]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60), arguments=st.dictionaries(st.text(max_size=6), _json,
                                                            max_size=5))
def test_fuzz_drops_a_subset_of_the_optional_arguments(text, arguments):
    schema = {"type": "object", "required": list(arguments)[:1]}
    dropped = ungrounded_optional(arguments, schema, text)
    assert set(dropped) <= set(arguments) - set(schema["required"])
    assert all(arguments[k] is v for k, v in dropped.items())
    # the text itself always supports a string that occurs in it
    assert Evidence(text).supports(text[: len(text) // 2], "x")

