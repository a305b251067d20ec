"""Tool type, registry and file loaders, on the real GitHub-MCP and Seal-Tools files when present."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.errors import FormatError, ToolError
from nexus_mlx.tools.registry import (
    FILE_FORMAT,
    ToolRegistry,
    load_seal_tools,
    load_tools,
    load_tools_json,
    seal_tool,
    seal_type,
    split_identifier,
    text_for_embedding,
)
from nexus_mlx.tools.tool import MAX_JSON_DEPTH, Tool, sanitize_name

JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


def obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


# -- real data ---------------------------------------------------------------------------------
def test_github_tools_load(github_tools_file) -> None:
    registry = load_tools_json(github_tools_file)
    raw = json.loads(github_tools_file.read_text())["tools"]
    assert len(registry) == 117 == len(raw)
    assert registry.names() == [t["name"] for t in raw]
    tool = registry.get("create_repository")
    assert tool.required == ("name",)
    assert tool.parameter_names == ("autoInit", "description", "name", "organization", "private")
    assert tool.input_schema["properties"]["private"]["default"] is True
    assert tool.annotations["title"] == "Create repository"
    assert all(t.input_schema["type"] == "object" for t in registry)
    assert load_tools(github_tools_file) == registry


def test_seal_tools_load_with_mapped_types(seal_tools_file) -> None:
    start = time.perf_counter()
    registry = load_seal_tools(seal_tools_file)
    assert time.perf_counter() - start < 10
    rows = [json.loads(line) for line in seal_tools_file.read_text().splitlines() if line.strip()]
    assert len(registry) == 4076 == len(rows)
    raw_types = Counter(p["type"] for r in rows for p in r["parameters"].values())
    mapped = Counter(p.get("type") for t in registry for p in t.input_schema["properties"].values())
    expected = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
    assert mapped == Counter({expected[k]: n for k, n in raw_types.items()})
    assert set(mapped) <= JSON_TYPES
    for row, tool in zip(rows, registry, strict=True):
        assert tool.description == row["api_description"]
        assert list(tool.required) == row["required"]
        assert tool.parameter_names == tuple(row["parameters"])
    assert registry.get("validatePassword").input_schema["properties"]["min_length"] == {
        "type": "integer",
        "description": "The minimum length of the password",
        "default": 8,
    }
    movement = registry.get("controlExoskeletonMovements").input_schema["properties"]
    assert movement["movement_type"]["enum"] == ["walk", "run", "lift"]
    velocity = registry.get("calculateConvectiveHeatTransferCoefficient").input_schema
    assert velocity["properties"]["fluid_velocity"]["description"].endswith("(unit: m/s)")
    assert "requestFirst_Aid_Assistance" in registry
    assert load_tools(seal_tools_file).digest() == registry.digest()


def test_seal_names_are_rejected_without_sanitizing(seal_tools_file) -> None:
    with pytest.raises(FormatError, match=r"line \d+: .*'requestFirst Aid Assistance'"):
        load_seal_tools(seal_tools_file, sanitize=False)


def test_text_for_embedding_on_github(github_tools_file) -> None:
    tool = load_tools_json(github_tools_file).get("create_repository")
    assert text_for_embedding(tool) == (
        "create repository: Create a new GitHub repository in your account or specified "
        "organization. Parameters: auto init, description, name, organization, private."
    )
    assert text_for_embedding(tool, split_names=False) == (
        "create_repository: Create a new GitHub repository in your account or specified "
        "organization. Parameters: autoInit, description, name, organization, private."
    )
    assert text_for_embedding(tool, parameters=False).endswith("specified organization")


@pytest.mark.parametrize(("identifier", "words"), [
    ("getHealthWorkforce", "get health workforce"),
    ("list_pull_requests", "list pull requests"),
    ("HTTPServerStatus", "http server status"),
    ("get-file.contents", "get file contents"),
    ("ghsaId", "ghsa id"),
    ("v2Name", "v2 name"),
    ("", ""),
])
def test_split_identifier(identifier: str, words: str) -> None:
    assert split_identifier(identifier) == words


# -- seal type mapping -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "schema"),
    [
        ("str", {"type": "string"}),
        ("int", {"type": "integer"}),
        ("float", {"type": "number"}),
        ("bool", {"type": "boolean"}),
        ("list", {"type": "array"}),
        ("dict", {"type": "object"}),
        ("Dict", {"type": "object"}),
        ("List[str]", {"type": "array", "items": {"type": "string"}}),
        ("dict[str, int]", {"type": "object"}),
        ("datetime", {"x-original-type": "datetime"}),
        (7, {"x-original-type": "7"}),
        (None, {}),
    ],
)
def test_seal_type(name: object, schema: dict) -> None:
    assert seal_type(name) == schema


def test_seal_tool_fallbacks_and_errors() -> None:
    row = {
        "api_name": "f",
        "api_description": "d",
        "parameters": {"a": {"type": "Callable", "description": "x"}, "b": {"type": "int"}},
        "required": ["a"],
        "field": "Math",
    }
    tool = seal_tool(row)
    assert tool.input_schema["properties"]["a"] == {
        "x-original-type": "Callable",
        "description": "x",
    }
    assert tool.annotations == {"field": "Math"}
    with pytest.raises(ToolError, match="parameter 'a' must be an object"):
        seal_tool({**row, "parameters": {"a": "str"}})
    with pytest.raises(ToolError, match="'parameters' must be an object"):
        seal_tool({**row, "parameters": ["a"]})
    with pytest.raises(ToolError, match="non-empty string"):
        seal_tool({"parameters": {}})


# -- registry operations -------------------------------------------------------------------------
def small(prefix: str = "") -> ToolRegistry:
    return ToolRegistry(
        [
            Tool(f"{prefix}status", "Show status", obj(repo_path={"type": "string"})),
            Tool(f"{prefix}log", "Show log", obj(max_count={"type": "integer", "default": 10})),
        ]
    )


def test_registry_basics() -> None:
    registry = small()
    assert len(registry) == 2 and registry.names() == ["status", "log"]
    assert [t.name for t in registry] == ["status", "log"]
    assert "log" in registry and "nope" not in registry
    with pytest.raises(ToolError, match=r"no tool named 'stauts' .*close matches: status"):
        registry.get("stauts")
    removed = registry.remove("status")
    assert removed.name == "status" and registry.names() == ["log"]
    with pytest.raises(ToolError, match="'status'"):
        registry.remove("status")
    registry.add(removed)
    assert registry.names() == ["log", "status"]


def test_duplicates_are_rejected_atomically() -> None:
    registry = small()
    digest = registry.digest()
    with pytest.raises(ToolError, match="duplicate tool name 'log'"):
        registry.extend([Tool("new"), Tool("log")])
    assert registry.digest() == digest and "new" not in registry
    with pytest.raises(ToolError, match="duplicate tool name 'x'"):
        ToolRegistry([Tool("x"), Tool("x", "other")])
    with pytest.raises(ToolError, match="holds Tool objects"):
        registry.add({"name": "dict"})  # type: ignore[arg-type]


def test_merge_namespacing() -> None:
    a, b = small(), small()
    with pytest.raises(ToolError, match="duplicate tool name 'status'"):
        a.merge(b)
    merged = a.merge(b, namespace="git").merge(small(), namespace="hg")
    assert merged.names() == ["status", "log", "git.status", "git.log", "hg.status", "hg.log"]
    tool = merged.get("git.status")
    assert (tool.name, tool.server, tool.qualified_name) == ("status", "git", "git.status")
    assert a.names() == ["status", "log"] and b.names() == ["status", "log"]
    with pytest.raises(ToolError, match="already has namespace 'git'"):
        merged.namespaced("vcs")
    with pytest.raises(ToolError, match="namespace 'a.b' is invalid"):
        a.merge(b, namespace="a.b")
    assert ToolRegistry().merge(a, namespace="x").names() == ["x.status", "x.log"]


def test_save_load_round_trip(tmp_path: Path) -> None:
    registry = small().merge(small(), namespace="git")
    registry.add(Tool("unicode_text", "描述\nline two", obj(), {"readOnlyHint": True}))
    path = tmp_path / "tools.json"
    registry.save(path)
    data = json.loads(path.read_text("utf-8"))
    assert data["format"] == FILE_FORMAT and data["version"] == 1
    loaded = ToolRegistry.load(path)
    assert loaded == registry and loaded.digest() == registry.digest()
    assert loaded.get("git.log").server == "git"
    empty = ToolRegistry()
    empty.save(path)
    assert len(ToolRegistry.load(path)) == 0 and ToolRegistry.load(path) == empty


def test_digest_tracks_contents_and_order() -> None:
    base = small()
    assert small().digest() == base.digest() and len(base.digest()) == 64
    assert ToolRegistry(reversed(list(base))).digest() != base.digest()
    changed = ToolRegistry([Tool("status", "Show status!", obj(repo_path={"type": "string"}))])
    assert changed.digest() != ToolRegistry([base.get("status")]).digest()
    assert ToolRegistry().digest() == ToolRegistry().digest()


# -- Tool validation -----------------------------------------------------------------------------
def test_tool_from_dict_accepts_both_spellings_and_ignores_unknown_keys() -> None:
    camel = Tool.from_dict({"name": "t", "inputSchema": obj(a={}), "icons": [], "_meta": {}})
    snake = Tool.from_dict({"name": "t", "input_schema": obj(a={}), "annotations": None})
    assert camel == snake and hash(camel) == hash(snake) and len({camel, snake}) == 1
    assert Tool.from_dict({"name": "bare"}).input_schema == {"type": "object", "properties": {}}
    assert Tool.from_dict(camel.to_dict()) == camel
    with pytest.raises(ToolError, match="both inputSchema and input_schema"):
        Tool.from_dict({"name": "t", "inputSchema": obj(), "input_schema": obj()})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "non-empty string"),
        ({"name": None}, "non-empty string"),
        ({"name": "has space"}, "'has space' is invalid"),
        ({"name": "-dash"}, "invalid"),
        ({"name": "x" * 129}, "invalid"),
        ({"name": "t", "input_schema": {"type": "string"}}, "object schema .*'string'"),
        ({"name": "t", "input_schema": {"properties": {}}}, "object schema .*None"),
        ({"name": "t", "input_schema": [1]}, "must be a JSON object"),
        (
            {"name": "t", "input_schema": {"type": "object", "properties": [1]}},
            "'properties' must be",
        ),
        ({"name": "t", "input_schema": obj(a=3)}, "property 'a' must be a schema"),
        ({"name": "t", "input_schema": {"type": "object", "required": "a"}}, "'required' must be"),
        ({"name": "t", "input_schema": {"type": "object", "x": float("nan")}}, "non-JSON number"),
        ({"name": "t", "input_schema": {"type": "object", 1: "x"}}, "non-string key"),
        ({"name": "t", "input_schema": {"type": "object", "x": {1, 2}}}, "holds a set"),
        ({"name": "t", "description": 5}, "description must be a string"),
        ({"name": "t", "annotations": [1]}, "annotations must be an object"),
        ({"name": "t", "server": "a.b"}, "namespace 'a.b' is invalid"),
    ],
)
def test_tool_rejects_bad_fields(kwargs: dict, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        Tool(**kwargs)


def test_tool_hostile_schemas_are_bounded() -> None:
    cyclic: dict = {"type": "object"}
    cyclic["properties"] = {"self": cyclic}
    with pytest.raises(ToolError, match="deeper than"):
        Tool("t", input_schema=cyclic)
    with pytest.raises(ToolError, match="deeper than"):
        Tool("t", input_schema=obj(a=nested(MAX_JSON_DEPTH + 10_000)))
    start = time.perf_counter()
    huge = Tool("t", input_schema=obj(a={"enum": [f"v{i}" for i in range(100_000)]}))
    assert time.perf_counter() - start < 2
    assert len(huge.input_schema["properties"]["a"]["enum"]) == 100_000
    refs = {
        "type": "object",
        "$defs": {"A": {"$ref": "#/$defs/A"}},
        "properties": {"a": {"$ref": "#/$defs/A"}},
    }
    assert Tool("t", input_schema=refs).input_schema == refs  # kept as is; routing.ir resolves refs
    odd = {"type": "object", "x-unknown": {"deep": [1, None]}, "properties": {"a": True}}
    assert Tool("t", input_schema=odd).input_schema == odd


def test_tool_copies_its_inputs() -> None:
    schema = obj(a={"type": "string"})
    tool = Tool("t", input_schema=schema)
    schema["properties"]["a"]["type"] = "integer"
    assert tool.input_schema["properties"]["a"]["type"] == "string"


def test_sanitize_name() -> None:
    assert sanitize_name("requestFirst Aid Assistance") == "requestFirst_Aid_Assistance"
    assert sanitize_name("..a/b c") == "a_b_c"
    assert len(sanitize_name("x" * 500)) == 128
    with pytest.raises(ToolError, match="no usable characters"):
        sanitize_name(" ... ")


# -- malformed files -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply|not valid JSON"),
        ("42", "expected a list of tools"),
        ('{"other": []}', r"with keys \['other'\]"),
        ('["x"]', "tool #0: a tool definition must be a JSON object"),
        ('[{"name": "ok"}, {"name": "bad name"}]', "tool #1: tool name 'bad name'"),
        ('[{"name": "a"}, {"name": "a"}]', "duplicate tool name 'a'"),
        ('{"tools": [{"name": "t", "inputSchema": {"type": "array"}}]}', "object schema"),
    ],
)
def test_bad_json_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tools.json"
    path.write_text(content)
    with pytest.raises(FormatError, match=message):
        load_tools_json(path)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="cannot read tool file"):
        load_tools_json(tmp_path / "missing.json")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FormatError, match="cannot read tool file"):
        load_tools_json(binary)
    assert len(load_tools_json(_write(tmp_path / "empty.json", "[]"))) == 0


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bad_seal_files(tmp_path: Path) -> None:
    good = {"api_name": "a", "api_description": "d", "parameters": {}, "required": []}
    path = _write(tmp_path / "t.jsonl", json.dumps(good) + "\n\n" + "{oops\n")
    with pytest.raises(FormatError, match="line 3: not valid JSON"):
        load_seal_tools(path)
    _write(path, json.dumps(good) + "\n" + json.dumps({**good, "required": "a"}))
    with pytest.raises(FormatError, match="line 2: .*'required' must be a list"):
        load_seal_tools(path)
    _write(path, json.dumps(good) + "\n" + json.dumps(good))
    with pytest.raises(FormatError, match="duplicate tool name 'a'"):
        load_seal_tools(path)
    _write(path, "")
    assert len(load_seal_tools(path)) == 0


# -- fuzzing: a Tool is valid or raises ToolError, nothing else -----------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=16,
)


@settings(max_examples=150, deadline=None)
@given(name=st.one_of(st.text(max_size=12), JSON), schema=JSON, annotations=JSON)
def test_fuzz_tool_construction(name: object, schema: object, annotations: object) -> None:
    try:
        tool = Tool(name, "d", schema, annotations)  # type: ignore[arg-type]
    except ToolError:
        return
    assert Tool.from_dict(tool.to_dict()) == tool
