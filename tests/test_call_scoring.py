"""The function-calling scorer (bench/tasks/call_scoring.py) and its gold files: value rules
(numbers by value, booleans apart from numbers, trimmed case-sensitive strings, nested values),
acceptable lists with ``""`` for omission, unknown and missing-required arguments, gold-file
parsing and schema checks; the Seal-Tools converter; and the committed GitHub MCP gold, which
must agree with the real tool schemas. Pure Python, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tasks.call_scoring import (
    GoldCall,
    gold_row,
    parse_gold,
    read_gold,
    same_value,
    schema_problems,
    score_call,
)
from tasks.seal_queries import converted, seal_gold_calls

from nexus_mlx.tools.registry import load_seal_tools, load_tools

STAR = GoldCall("q1", "Star pallets/flask", "star_repository",
                {"owner": "pallets", "repo": "flask"},
                {"owner": ["pallets"], "repo": ["flask"], "note": ["", "none"]})
REQUIRED = ("owner", "repo")


# -- whole calls -------------------------------------------------------------------------------

def test_exact_call_is_right():
    score = score_call(STAR, "star_repository", {"owner": "pallets", "repo": "flask"}, REQUIRED)
    assert score.tool_right and score.call_right
    assert score.arguments == {"owner": True, "repo": True, "note": True}


def test_wrong_value_or_wrong_tool_is_wrong():
    score = score_call(STAR, "star_repository", {"owner": "pallets", "repo": "django"}, REQUIRED)
    assert not score.call_right and score.arguments == {"owner": True, "repo": False, "note": True}
    other = score_call(STAR, "unstar_repository", {"owner": "pallets", "repo": "flask"}, REQUIRED)
    assert not other.tool_right and not other.call_right
    assert not any(other.arguments.values())  # another tool's arguments are not this call's


def test_acceptable_alternatives_and_omission():
    assert score_call(STAR, "star_repository", {"owner": "pallets", "repo": "flask",
                                                "note": "none"}, REQUIRED).call_right
    wrong_note = score_call(STAR, "star_repository", {"owner": "pallets", "repo": "flask",
                                                      "note": "urgent"}, REQUIRED)
    assert not wrong_note.call_right and wrong_note.arguments["note"] is False
    # an argument without "" in its list may not be omitted (here also required)
    gold = GoldCall("q", "q", "t", {"a": 1}, {"a": [1, 2], "b": ["", True]})
    assert score_call(gold, "t", {"a": 2}).call_right
    assert not score_call(gold, "t", {"b": True}).call_right
    assert score_call(gold, "t", {"b": True}).arguments == {"a": False, "b": True}


def test_blank_string_for_an_omittable_argument_matches_the_listed_blank():
    assert score_call(STAR, "star_repository", {"owner": "pallets", "repo": "flask",
                                                "note": "  "}, REQUIRED).call_right


def test_unknown_argument_makes_the_call_wrong():
    score = score_call(STAR, "star_repository", {"owner": "pallets", "repo": "flask",
                                                 "private": True}, REQUIRED)
    assert score.unknown == ("private",) and all(score.arguments.values())
    assert not score.call_right


def test_missing_required_makes_the_call_wrong_even_if_marked_omittable():
    gold = GoldCall("q", "q", "t", {}, {"owner": ["", "x"]})
    score = score_call(gold, "t", {}, required=("owner",))
    assert score.arguments == {"owner": True} and score.missing_required == ("owner",)
    assert not score.call_right
    assert score_call(gold, "t", {"owner": "x"}, required=("owner",)).call_right


def test_non_mapping_arguments_count_as_none_given():
    score = score_call(STAR, "star_repository", None, REQUIRED)  # type: ignore[arg-type]
    assert score.missing_required == REQUIRED and not score.call_right


# -- values ------------------------------------------------------------------------------------

@pytest.mark.parametrize("gold, got, equal", [
    (3, 3.0, True), (3.0, 3, True), (3, 3.5, False), (10**20, 10**20 + 1, False),
    ("3", 3, False), (3, "3", False),
    (True, 1, False), (1, True, False), (False, 0, False), (0.0, False, False),
    (True, True, True), (False, True, False),
    (" flask ", "flask", True), ("flask", "\tflask\n", True), ("Flask", "flask", False),
    ("OPEN", "open", False), ("a b", "a  b", False),
    (None, None, True), (None, "", False), ("", None, False), (None, 0, False),
    ([1, 2], [1.0, 2.0], True), ([1, 2], [2, 1], False), ([1], [1, 1], False),
    ({"a": 1, "b": " x"}, {"b": "x", "a": 1.0}, True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ([{"n": [True, 2]}], [{"n": [True, 2.0]}], True), ([{"n": [True]}], [{"n": [1]}], False),
    ({"a": [1]}, {"a": 1}, False), ([], {}, False),
])
def test_same_value(gold, got, equal):
    assert same_value(gold, got) is equal


def test_fold_case_is_a_separate_lenient_mode():
    assert not same_value("Facebook", "facebook")
    assert same_value("Facebook", " facebook ", fold_case=True)
    assert same_value(["New  York"], ["new york"], fold_case=True)
    assert not same_value("3", 3, fold_case=True) and not same_value(True, 1, fold_case=True)
    gold = GoldCall("q", "q", "t", {"p": "Facebook"}, {"p": ["Facebook"]})
    assert not score_call(gold, "t", {"p": "facebook"}).call_right
    assert score_call(gold, "t", {"p": "facebook"}, fold_case=True).call_right


def test_numbers_by_value_inside_a_scored_call():
    gold = GoldCall("q", "q", "t", {"n": 3, "tags": ["x"]}, {"n": [3], "tags": [["x"]]})
    assert score_call(gold, "t", {"n": 3.0, "tags": [" x"]}).call_right
    assert not score_call(gold, "t", {"n": True, "tags": ["x"]}).call_right


# -- gold files --------------------------------------------------------------------------------

def test_parse_gold_defaults_and_rejects_contradictions():
    call = parse_gold({"query": "q", "tool": "t", "arguments": {"a": 1}}, "row")
    assert call.acceptable == {"a": [1]} and call.id == "row"
    assert parse_gold(gold_row(call)) == call
    with pytest.raises(ValueError, match="not among its acceptable"):
        parse_gold({"query": "q", "tool": "t", "arguments": {"a": 1}, "acceptable": {"a": [2]}})
    with pytest.raises(ValueError, match="non-empty list"):
        parse_gold({"query": "q", "tool": "t", "acceptable": {"a": []}})
    with pytest.raises(ValueError, match="'tool'"):
        parse_gold({"query": "q", "tool": " "})


def test_read_gold_names_the_line_and_rejects_duplicate_ids(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"id": "a", "query": "q", "tool": "t"}\n\n{"id": "a", "query": "r", '
                    '"tool": "t"}\n')
    with pytest.raises(ValueError, match="duplicate ids"):
        read_gold(path)
    path.write_text('{"id": "a", "query": "q", "tool": "t"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        read_gold(path)


SCHEMA = {"type": "object", "required": ["owner"],
          "properties": {"owner": {"type": "string"}, "n": {"type": "integer"},
                         "state": {"type": "string", "enum": ["open", "closed"]}}}


def test_schema_problems_finds_each_kind_of_mistake():
    good = GoldCall("g", "q", "t", {"owner": "o"}, {"owner": ["o"], "n": ["", 2],
                                                    "state": ["", "open"]})
    assert schema_problems(good, SCHEMA) == []
    cases = {
        "not a parameter": GoldCall("g", "q", "t", {"owner": "o"}, {"owner": ["o"], "x": [""]}),
        "has no acceptable": GoldCall("g", "q", "t", {}, {"n": [1]}),
        "marked omittable": GoldCall("g", "q", "t", {"owner": "o"}, {"owner": ["o", ""]}),
        "acceptable n=": GoldCall("g", "q", "t", {"owner": "o"}, {"owner": ["o"], "n": ["2"]}),
        "acceptable state=": GoldCall("g", "q", "t", {"owner": "o"},
                                      {"owner": ["o"], "state": ["Open"]}),
        "canonical": GoldCall("g", "q", "t", {"owner": 5}, {"owner": [5]}),
    }
    for expected, call in cases.items():
        problems = schema_problems(call, SCHEMA)
        assert any(expected in p for p in problems), (expected, problems)


# -- Seal-Tools conversion ---------------------------------------------------------------------

@pytest.mark.parametrize("value, kind, out", [
    ("63", "integer", 63), ("19.0", "integer", 19), ("19.5", "integer", "19.5"),
    ("37.5", "number", 37.5), ("7", "number", 7), (" 2e3 ", "number", 2000.0),
    ("12 km", "number", "12 km"), ("True", "boolean", True), ("false", "boolean", False),
    ("yes", "boolean", "yes"), ("63", "string", "63"), (0.5, "number", 0.5), ("5", None, "5"),
])
def test_seal_values_are_converted_to_the_schema_type(value, kind, out):
    got = converted(value, {"type": kind} if kind else {})
    assert got == out and type(got) is type(out)


def test_seal_gold_calls_skip_and_fill_optional_arguments():
    schemas = {"getX": {"type": "object", "required": ["a"],
                        "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                       "c": {"type": "string", "default": "en"}}}}
    rows = [
        {"id": "dev-easy-0", "query": "x of 3", "calling": [{"api": "getX",
                                                           "parameters": {"a": "3"}}]},
        {"id": "dev-hard-0", "query": "two", "calling": [{"api": "getX"}, {"api": "getX"}]},
        {"id": "dev-easy-1", "query": "y", "calling": [{"api": "getY", "parameters": {}}]},
    ]
    calls, skipped = seal_gold_calls(rows, schemas)
    assert [c.id for c in calls] == ["dev-easy-0"] and set(skipped) == {"dev-hard-0", "dev-easy-1"}
    assert calls[0].arguments == {"a": 3}
    assert calls[0].acceptable == {"a": [3], "b": [""], "c": ["", "en"]}
    assert schema_problems(calls[0], schemas["getX"]) == []


def test_seal_dev_gold_agrees_with_its_registry(shared_data):
    registry = load_seal_tools(shared_data / "seal-tools" / "tool.jsonl")
    schemas = {t.qualified_name: t.input_schema for t in registry}
    rows = [json.loads(line) for line in
            (shared_data / "seal-tools" / "dev.jsonl").read_text("utf-8").splitlines()]
    calls, skipped = seal_gold_calls(rows, schemas)
    assert len(calls) == 200 and all(c.id.startswith("dev-easy") for c in calls)
    assert all("calls" in why for why in skipped.values())
    assert {c.id: schema_problems(c, schemas[c.tool]) for c in calls
            if schema_problems(c, schemas[c.tool])} == {}


# -- the committed GitHub MCP gold -------------------------------------------------------------

def test_github_gold_agrees_with_the_tool_schemas(shared_data):
    calls = read_gold(Path(__file__).resolve().parents[1] / "bench" / "github_queries.jsonl")
    registry = load_tools(shared_data / "github-mcp" / "tools.json")
    assert len(calls) == 78 and all(c.tool in registry for c in calls)
    problems = {c.id: schema_problems(c, registry.get(c.tool).input_schema) for c in calls}
    assert {k: v for k, v in problems.items() if v} == {}
    for call in calls:  # every parameter is judged, and the gold call itself scores right
        schema = registry.get(call.tool).input_schema
        assert set(call.acceptable) == set(schema.get("properties") or {}), call.id
        assert score_call(call, call.tool, call.arguments, schema.get("required") or ()).call_right


# -- the benchmark's summary (bench/function_calling.py, no model run) --------------------------

def _row(routed_ok, call_right, slots, specified=(), **extra):
    row = {"routed_ok": routed_ok, "call_right": call_right, "argument_right": slots,
           "specified": list(specified), "schema_valid": True, "valid": True,
           "complete": True, "missing_required": [], "unknown": [], "escalated": False,
           "gold": "t", "ms": {"route": 10.0, "arguments": 20.0, "total": 30.0}}
    return {**row, "call_right_fold_case": row["call_right"], "id": f"q{len(slots)}{call_right}",
            "call_right_ungrounded": row["call_right"], **extra}


def test_summary_counts_arguments_on_routed_queries_only():
    import function_calling as fc

    rows = [
        _row(True, True, {"a": True, "b": True}, specified=["a"]),
        _row(True, False, {"a": False, "b": True}, specified=["a"]),
        _row(False, False, {"a": False, "b": False}, specified=["a"]),
        _row(True, False, {"a": True}, unknown=["x"], schema_valid=False, valid=False),
    ]
    out = fc.summarize(rows)
    assert out["n"] == 4 and out["routing_accuracy"] == 0.75 and out["call_accuracy"] == 0.25
    assert out["argument_accuracy_count"] == [4, 5]  # 2 + 1 + 1 right of 5 routed slots
    assert out["argument_accuracy_e2e_count"] == [4, 7]
    assert out["specified_argument_accuracy_count"] == [1, 2]
    assert out["call_accuracy_routed_count"] == [1, 3] and out["schema_valid"] == 0.75
    assert out["failures"] == {"wrong_value": 1, "misrouted": 1, "unknown_argument": 1}
    assert out["per_argument"]["a"] == {"n": 3, "right": 2, "accuracy": 2 / 3}
    lo, hi = out["routing_accuracy_ci"]
    assert 0 < lo < 0.75 < hi < 1
    assert out["latency_ms"]["total"]["median"] == 30.0
    assert out["call_accuracy_ungrounded"] == 0.25
    assert out["grounding_fixed"] == out["grounding_broke"] == []


def test_summary_scores_the_calls_with_and_without_grounding():
    import function_calling as fc

    rows = [_row(True, True, {"a": True}, id="fixed", call_right_ungrounded=False),
            _row(True, False, {"a": False}, id="broke", call_right_ungrounded=True),
            _row(True, True, {"a": True}, id="same")]
    out = fc.summarize(rows)
    assert out["call_accuracy_count"] == [2, 3] and out["call_accuracy_ungrounded_count"] == [2, 3]
    assert out["grounding_fixed"] == ["fixed"] and out["grounding_broke"] == ["broke"]


def test_load_gold_converts_seal_rows_and_skips_unscorable_ones(tmp_path):
    import function_calling as fc

    from nexus_mlx.tools.registry import ToolRegistry
    from nexus_mlx.tools.tool import Tool

    registry = ToolRegistry([Tool("getX", "x", {"type": "object", "required": ["a"],
                                                "properties": {"a": {"type": "integer"}}})])
    seal = tmp_path / "dev.jsonl"
    seal.write_text("\n".join(json.dumps(r) for r in [
        {"id": "e0", "query": "x 3", "calling": [{"api": "getX", "parameters": {"a": "3"}}]},
        {"id": "e1", "query": "x?", "calling": [{"api": "getX", "parameters": {"a": "many"}}]},
        {"id": "e2", "query": "y", "calling": [{"api": "getY", "parameters": {}}]},
    ]) + "\n")
    calls, skipped = fc.load_gold(seal, registry)
    assert [c.id for c in calls] == ["e0"] and calls[0].arguments == {"a": 3}
    assert set(skipped) == {"e1", "e2"} and "not in the registry" in skipped["e2"]
    ours = tmp_path / "ours.jsonl"
    ours.write_text(json.dumps({"id": "o1", "query": "x", "tool": "getX", "arguments": {"a": 1},
                                "acceptable": {"a": [1, 1.0]}}) + "\n")
    calls, skipped = fc.load_gold(ours, registry)
    assert [c.id for c in calls] == ["o1"] and skipped == {}
