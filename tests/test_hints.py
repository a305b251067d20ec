"""Format hints: each extraction rule on real schema wording (the time/git MCP servers, GitHub
MCP, Seal-Tools), the budget, what gives no hint, and the hints inside the compressed IR."""

from __future__ import annotations

import pytest

from nexus_mlx.tools.hints import format_hint
from nexus_mlx.tools.ir import IROptions, signature


def s(description: str, **keywords) -> dict:
    return {"type": "string", "description": description, **keywords}


TIMEZONE = s("IANA timezone name (e.g., 'America/New_York', 'Europe/London'). Use 'Etc/UTC' as "
             "local timezone if no timezone provided by the user.")
GIT_LOG_START = s("Start timestamp for filtering commits. Accepts: ISO 8601 format (e.g., "
                  "'2024-01-15T14:30:25'), relative dates (e.g., '2 weeks ago', 'yesterday'), "
                  "or absolute dates (e.g., '2024-01-15', 'Jan 15 2024')")

CASES = [
    (TIMEZONE, "IANA timezone name"),  # examples only where nothing names the format
    (s("Time to convert in 24-hour format (HH:MM)"), "24-hour; HH:MM"),
    (GIT_LOG_START, "ISO 8601 format"),
    (s("Whether to list local branches ('local'), remote branches ('remote') or all "
       "branches('all')."), "'local'|'remote'|'all'"),
    (s("Only commits after this date (ISO 8601 format: YYYY-MM-DDTHH:MM:SSZ or YYYY-MM-DD)"),
     "YYYY-MM-DDTHH:MM:SSZ; ISO 8601 format"),  # a notation inside another is dropped
    (s("GitHub Security Advisory ID (format: GHSA-xxxx-xxxx-xxxx)."),
     "format GHSA-xxxx-xxxx-xxxx"),
    (s("Label color as 6-character hex code without '#' prefix (e.g., 'f29513')."), "hex code"),
    (s("Tag name (e.g., 'v1.0.0')"), "e.g. 'v1.0.0'"),
    (s("The type of evidence to be analyzed (e.g., DNA, fingerprints, blood, fibers)"),
     "e.g. DNA"),  # an acronym shows how to write it; plain words do not
    (s("The date of admission for the patient (e.g., 2022-05-10)"), "e.g. 2022-05-10"),
    (s("The HTML element (e.g., '#header', '.container')"), "e.g. '#header', '.container'"),
    (s("The altitude of the aircraft (in meters per second)"), "in meters per second"),
    ({"type": "number", "description": "Results per page for pagination (default: 30, max: 100)"},
     "default 30"),
    (s("The owner of the related repository. Defaults to 'owner' when omitted."),
     "default 'owner'"),
    ({"type": "string", "format": "date-time", "pattern": "^[0-9]{4}-.*$"},
     "date-time; pattern ^[0-9]{4}-.*$"),
    ({"type": "string", "examples": ["octocat/hello-world"]}, 'e.g. "octocat/hello-world"'),
    (s("Duration in days for iterations (e.g. 7 for weekly, 14 for bi-weekly)"), "in days"),
    (s("The start date (e.g., YYYY-MM-DD)"), "e.g. YYYY-MM-DD"),  # no notation twice
    (s("The type of hash (e.g., MD5, SHA1)"), "e.g. MD5, SHA1"),  # standards inside examples
]


@pytest.mark.parametrize(("schema", "expected"), CASES)
def test_each_rule(schema: dict, expected: str) -> None:
    assert format_hint(schema, 48) == expected


@pytest.mark.parametrize("schema", [
    s("Repository owner"),
    s("Repository owner (username or organization)"),
    s("Content of the file. Do not base64-encode it; this server does that."),  # negated
    s("The workflow file name (ci.yaml)"),  # a file extension is no format name
    s("The type of fabric used in the design (e.g., silk, cotton, velvet)"),  # words, no format
    {"type": "string", "enum": ["open", "closed"],
     "description": "Whether the state is 'open' or 'closed'"},  # the type lists the choice
    {"type": "integer", "default": 3, "description": "Lines of context (default: 3)"},
    {"type": "string"}, {"description": 17}, True, None, "not a schema",
])
def test_no_hint(schema) -> None:
    assert format_hint(schema, 48) == ""


def test_budget_sheds_examples_then_atoms_then_cuts() -> None:
    examples = s("The start date (e.g., 2022-01-01, 2023-12-31, 2024-06-30)")
    assert format_hint(examples, 48) == "e.g. 2022-01-01, 2023-12-31"
    assert format_hint(examples, 20) == "e.g. 2022-01-01"
    assert format_hint(examples, 10) == "e.g. 2022…"
    two = s("Only commits after this date (ISO 8601 format: YYYY-MM-DDTHH:MM:SSZ)")
    assert format_hint(two, 48) == "YYYY-MM-DDTHH:MM:SSZ; ISO 8601 format"
    assert format_hint(two, 30) == "YYYY-MM-DDTHH:MM:SSZ"  # the second atom no longer fits
    assert format_hint(TIMEZONE, 10) == "IANA time…"
    assert format_hint(TIMEZONE, 0) == ""
    for limit in range(1, 80):
        assert len(format_hint(GIT_LOG_START, limit)) <= limit
        assert len(format_hint(examples, limit)) <= limit


def test_hint_cannot_close_the_comment_or_break_the_line() -> None:
    hint = format_hint(s("Glob such as src/**/*.py\u2028or */tmp"), 48)
    assert "*/" not in hint and "\u2028" not in hint and "\n" not in hint


def test_hints_in_the_ir() -> None:
    schema = {"type": "object", "required": ["timezone"],
              "properties": {"timezone": TIMEZONE, "owner": s("Repository owner")}}
    assert signature("get_current_time", schema) == (
        "get_current_time(timezone: string /* IANA timezone name */, owner?: string)")
    assert signature("get_current_time", schema, options=IROptions(max_hint_chars=0)) == (
        "get_current_time(timezone: string, owner?: string)")
    described = signature("get_current_time", schema, options=IROptions(max_desc_chars=20))
    assert described == ("get_current_time(timezone: string /* IANA timezone name … */, "
                         "owner?: string /* Repository owner */)")  # no hint on top of it
    with pytest.raises(Exception, match="max_hint_chars"):
        IROptions(max_hint_chars=-1)
