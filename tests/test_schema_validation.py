"""Input schemas are validated when a tool is made: meta-schema of the declared draft, ``$ref``s.

Before this check a tool with ``"type": "nosuchtype"`` or a dangling ``$ref`` loaded and
compiled, and failed only when its arguments were validated.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from nexus_mlx.errors import FormatError, ToolError
from nexus_mlx.tools.registry import load_seal_tools, load_tools_json
from nexus_mlx.tools.schema_check import (
    flat_2020_12_meta_schema,
    json_pointer,
    schema_problem,
)
from nexus_mlx.tools.tool import Tool


def _obj(**properties):
    return {"type": "object", "properties": properties}


def test_an_unknown_type_is_rejected_with_the_tool_and_the_pointer():
    with pytest.raises(ToolError) as info:
        Tool("make_repo", "", _obj(name={"type": "string"}, private={"type": "nosuchtype"}))
    message = str(info.value)
    assert "'make_repo'" in message and "/properties/private/type" in message
    assert "nosuchtype" in message and "2020-12" in message


def test_a_dangling_ref_is_rejected_with_the_tool_and_the_pointer():
    schema = {**_obj(owner={"$ref": "#/$defs/missing"}), "$defs": {"login": {"type": "string"}}}
    with pytest.raises(ToolError) as info:
        Tool("get_user", "", schema)
    message = str(info.value)
    assert "'get_user'" in message and "/properties/owner/$ref" in message
    assert "#/$defs/missing" in message


@pytest.mark.parametrize("ref", ["https://example.com/user.json", "other.json#/x", "#nowhere"])
def test_references_outside_the_schema_are_rejected(ref):
    with pytest.raises(ToolError, match="does not resolve"):
        Tool("t", "", {**_obj(a={"items": {"$ref": ref}}), "$defs": {}})


def test_resolvable_references_are_accepted():
    schema = {
        "$id": "https://tools.example/make",
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/name"},
            "b": {"$ref": "#tag"},
            "c": {"$ref": "https://tools.example/make#/$defs/name"},
            "d": {"anyOf": [{"$ref": "#/$defs/name"}, {"type": "null"}]},
            "e": {"$ref": "https://json-schema.org/draft/2020-12/schema"},
        },
        "$defs": {"name": {"type": "string"}, "tagged": {"$anchor": "tag", "type": "integer"}},
    }
    assert Tool("make", "", schema).input_schema == schema


def test_the_declared_draft_is_the_one_checked():
    """Draft 4's boolean ``exclusiveMinimum`` is a number in later drafts."""
    body = _obj(n={"type": "integer", "minimum": 0, "exclusiveMinimum": True})
    Tool("old", "", {"$schema": "http://json-schema.org/draft-04/schema#", **body})
    with pytest.raises(ToolError, match=r"/properties/n/exclusiveMinimum"):
        Tool("new", "", body)  # no $schema: 2020-12
    with pytest.raises(ToolError, match="draft-07"):
        Tool("seven", "", {"$schema": "http://json-schema.org/draft-07/schema#", **body})


def test_an_unknown_dialect_is_rejected():
    with pytest.raises(ToolError, match=r"'t'.*\$schema 'urn:example:mine'"):
        Tool("t", "", {"$schema": "urn:example:mine", **_obj()})


def test_pointers_escape_slash_and_tilde():
    assert json_pointer(["properties", "a/b~c", 0]) == "/properties/a~1b~0c/0"
    with pytest.raises(ToolError, match=r"/properties/a~1b~0c/minLength"):
        Tool("t", "", _obj(**{"a/b~c": {"type": "string", "minLength": -1}}))


def test_file_loaders_name_the_file_the_tool_and_the_pointer(tmp_path):
    path = tmp_path / "tools.json"
    tools = [{"name": "ok", "inputSchema": _obj()},
             {"name": "bad", "inputSchema": _obj(x={"type": "nosuchtype"})}]
    path.write_text(json.dumps({"tools": tools}))
    with pytest.raises(FormatError) as info:
        load_tools_json(path)
    message = str(info.value)
    assert "tools.json" in message and "tool #1" in message and "'bad'" in message
    assert "/properties/x/type" in message and isinstance(info.value.__cause__, ToolError)

    seal = tmp_path / "tool.jsonl"
    row = {"api_name": "pick", "parameters": {"n": {"type": "int", "default": 1}},
           "required": ["n"]}
    seal.write_text(json.dumps(row) + "\n" + json.dumps({**row, "api_name": "pick2",
                                                         "required": "n"}) + "\n")
    with pytest.raises(FormatError, match=r"line 2.*'pick2'"):
        load_seal_tools(seal)


def test_every_real_tool_still_loads(github_tools_file, seal_tools_file):
    github = load_tools_json(github_tools_file)
    seal = load_seal_tools(seal_tools_file)
    assert len(github) == 117 and len(seal) == 4076
    for tool in [*github, *seal]:
        assert schema_problem(tool.input_schema) is None, tool.name


INVALID = [
    {"type": "nosuchtype"},
    {"type": ["string", "nope"]},
    {"properties": {"a": {"minItems": -1}}},
    {"properties": {"a": {"items": 3}}},
    {"required": "a"},
    {"enum": "a"},
    {"properties": {"a": {"pattern": 5}}},
    {"anyOf": []},
    {"$defs": {"x": {"type": 1}}},
    {"additionalProperties": {"properties": {"b": {"multipleOf": 0}}}},
    {"dependentRequired": {"a": [1]}},
    {"properties": {"a": {"not": {"const": 1, "maxLength": "3"}}}},
    {"if": {"type": "bogus"}, "then": {}},
]


def test_the_flattened_meta_schema_agrees_with_the_official_one(github_tools_file,
                                                                seal_tools_file):
    flat = jsonschema.Draft202012Validator(flat_2020_12_meta_schema())
    official = jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)
    real = [t.input_schema for t in load_tools_json(github_tools_file)]
    real += [t.input_schema for t in load_seal_tools(seal_tools_file)]
    for schema in real + INVALID:
        assert flat.is_valid(schema) == official.is_valid(schema), schema
    assert not any(official.is_valid(s) for s in INVALID)
