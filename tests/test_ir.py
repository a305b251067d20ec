"""Compressed IR: golden signatures, hostile schemas, and hypothesis fuzzing of the renderer."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_mlx.errors import ToolError
from nexus_mlx.tools.ir import IROptions, ir_length_stats, signature, tool_signature
from nexus_mlx.tools.tool import Tool


def obj(required: list[str] | None = None, /, **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return schema


STR, INT, BOOL, NULL = ({"type": t} for t in ("string", "integer", "boolean", "null"))

GOLDEN = [
    (obj(["name"], private=BOOL, name=STR), "f(name: string, private?: boolean)"),
    (obj(["b"], a={"type": "integer", "default": 3}, b=STR), "f(b: string, a?: integer = 3)"),
    (obj(x={"type": "array", "items": STR}), "f(x?: string[])"),
    (obj(x={"type": "array", "items": {"anyOf": [STR, NULL]}}), "f(x?: (string|null)[])"),
    (obj(x={"type": "array"}), "f(x?: any[])"),
    (obj(x={"type": "array", "prefixItems": [STR, INT]}), "f(x?: [string, integer])"),
    (obj(x={"type": ["string", "null"]}), "f(x?: string|null)"),
    (obj(x={"type": "string", "nullable": True}), "f(x?: string|null)"),
    (obj(x={"enum": ["a", "b", 3, None]}), 'f(x?: "a"|"b"|3|null)'),
    (obj(x={"const": "only"}), 'f(x?: "only")'),
    (obj(x={"oneOf": [STR, INT, STR]}), "f(x?: string|integer)"),
    (obj(x={"anyOf": [STR, {}]}), "f(x?: any)"),
    (
        obj(x={"allOf": [{"anyOf": [STR, INT]}, {"type": "string"}]}),
        "f(x?: (string|integer)&string)",
    ),
    (obj(x={"type": "object"}), "f(x?: object)"),
    (obj(x={"type": "object", "additionalProperties": INT}), "f(x?: {*: integer})"),
    (obj(x=obj(["k"], v=INT, k=STR)), "f(x?: {k: string, v?: integer})"),
    (obj(x=obj(y=obj(z=obj(w=STR)))), "f(x?: {y?: {z?: object}})"),
    (obj(x=True, y=False, z={}), "f(x?: any, y?: never, z?: any)"),
    (obj(x={"enum": []}), "f(x?: never)"),
    (obj(["ghost"], a=STR), "f(ghost: any, a?: string)"),
    (obj(**{"a b": STR, "ok.name-1": INT}), 'f("a b"?: string, ok.name-1?: integer)'),
    (obj(x={"type": "string", "format": "date-time", "minLength": 3}),
     "f(x?: string /* date-time */)"),
    (obj(x={"type": "frobnicate"}), "f(x?: any)"),
    ({"type": "object"}, "f()"),
    (True, "f()"),
    ({"type": "string"}, "f()"),
]


@pytest.mark.parametrize(("schema", "expected"), GOLDEN)
def test_golden(schema: Any, expected: str) -> None:
    assert signature("f", schema) == expected


CREATE_REPOSITORY = (
    "create_repository(name: string, autoInit?: boolean, description?: string, "
    "organization?: string, private?: boolean = true)"
)


def test_github_create_repository(github_tools_file) -> None:
    tools = json.loads(github_tools_file.read_text())["tools"]
    raw = next(t for t in tools if t["name"] == "create_repository")
    assert signature(raw["name"], raw["inputSchema"]) == CREATE_REPOSITORY
    tool = Tool.from_dict(raw)
    assert tool_signature(tool) == CREATE_REPOSITORY
    assert tool_signature(tool.with_server("github")) == "github." + CREATE_REPOSITORY
    schema_order = signature(
        raw["name"], raw["inputSchema"], options=IROptions(required_first=False)
    )
    assert schema_order.startswith(
        "create_repository(autoInit?: boolean, description?: string, name: string"
    )
    described = tool_signature(tool, IROptions(max_desc_chars=16))
    assert "name: string /* Repository name */" in described
    assert "organization?: string /* Organization to… */" in described
    assert described.endswith(" // Create a new Gi…")


def test_github_all_tools_render_and_stats(github_tools_file) -> None:
    tools = [Tool.from_dict(t) for t in json.loads(github_tools_file.read_text())["tools"]]
    lines = [tool_signature(t) for t in tools]
    assert all("\n" not in line and line.endswith(")") for line in lines)
    chars = ir_length_stats(tools)
    assert chars.n == 117 and chars.unit == "chars" and 60 < chars.median < 250
    words = ir_length_stats(tools, encode=lambda text: text.split())
    assert words.unit == "tokens" and words.median <= words.p99 <= words.max
    compact = ir_length_stats(tools, options=IROptions(max_enum=0))
    assert compact.median < chars.median


def test_enum_truncation_and_literals() -> None:
    big = obj(x={"enum": [f"v{i}" for i in range(1000)]})
    assert signature("f", big, options=IROptions(max_enum=2)) == 'f(x?: "v0"|"v1"|…+998)'
    assert signature("f", big, options=IROptions(max_enum=0)) == "f(x?: string)"
    typed = obj(x={"type": "integer", "enum": [1, 2]})
    assert signature("f", typed, options=IROptions(max_enum=0)) == "f(x?: integer)"
    long_value = obj(x={"enum": ["y" * 100], "default": list(range(50))})
    out = signature("f", long_value, options=IROptions(max_literal_chars=8))
    assert out == 'f(x?: "yyyyy…" = [0,1,2,…)'
    many = obj(x={"anyOf": [{"const": i} for i in range(20)]})
    assert signature("f", many, options=IROptions(max_union=3)) == "f(x?: 0|1|2|…+17)"
    wide = obj(x=obj(**{f"p{i}": INT for i in range(5)}))
    assert (
        signature("f", wide, options=IROptions(max_props=2))
        == "f(x?: {p0?: integer, p1?: integer, …+3})"
    )


def test_refs_resolve_with_cycle_protection() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "Point": obj(["x", "y"], x={"type": "number"}, y={"type": "number"}),
            "Node": obj(["value"], value=INT, next={"$ref": "#/$defs/Node"}),
            "A": {"$ref": "#/$defs/B"},
            "B": {"$ref": "#/$defs/A"},
        },
        "properties": {
            "p": {"$ref": "#/$defs/Point"},
            "head": {"$ref": "#/$defs/Node"},
            "loop": {"$ref": "#/$defs/A"},
            "gone": {"$ref": "#/$defs/Missing"},
            "far": {"$ref": "https://example.com/schemas/user.json"},
            "self": {"$ref": "#"},
            "bad": {"$ref": 5},
        },
    }
    out = signature("f", schema, options=IROptions(max_depth=3))
    assert out == (
        "f(p?: {x: number, y: number}, head?: {value: integer, next?: Node}, loop?: A, "
        "gone?: Missing, far?: user.json, self?: {p?: {x: number, y: number}, "
        "head?: {value: integer, next?: Node}, loop?: A, gone?: Missing, far?: user.json, "
        "self?: any, bad?: any}, bad?: any)"
    )
    top = {"$ref": "#/definitions/T", "definitions": {"T": obj(["a"], a=STR)}}
    assert signature("f", top) == "f(a: string)"
    looping = {"$ref": "#/definitions/T", "definitions": {"T": {"$ref": "#/definitions/T"}}}
    assert signature("f", looping) == "f()"
    escaped = {
        "type": "object",
        "$defs": {"a/b": STR},
        "properties": {"x": {"$ref": "#/$defs/a~1b"}},
    }
    assert signature("f", escaped) == "f(x?: string)"


def test_descriptions_are_single_line_and_cut() -> None:
    schema = obj(x={"type": "string", "description": "first line\nsecond\u2028third */ end"})
    out = signature(
        "f", schema, description="Tool\r\ndoes things", options=IROptions(max_desc_chars=40)
    )
    assert out == "f(x?: string /* first line second third * / end */) // Tool does things"
    assert signature("f", schema, options=IROptions(max_desc_chars=0)) == "f(x?: string)"
    hostile = obj(**{"a\nb": {"enum": ["x\u2028y", "z\x85"]}})
    out = signature("f", hostile)
    assert len(out.splitlines()) == 1 and "\\u2028" in out and "\\u0085" in out and '"a\\nb"' in out


def test_documented_errors() -> None:
    for bad in ("", "two words", "tab\t", None, 3):
        with pytest.raises(ToolError, match="tool name"):
            signature(bad, {})  # type: ignore[arg-type]
    bad_schemas: list[Any] = [[], "object", 3, None]
    for schema in bad_schemas:
        with pytest.raises(ToolError, match="input schema must be"):
            signature("f", schema)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="max_enum"):
        IROptions(max_enum=-1)
    with pytest.raises(ToolError, match="max_literal_chars"):
        IROptions(max_literal_chars=2)
    with pytest.raises(ToolError, match="required_first"):
        IROptions(required_first=1)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="at least one tool"):
        ir_length_stats([])
    assert IROptions.from_dict({"max_enum": 3, "unknown": 1}) == IROptions(max_enum=3)


def test_hostile_sizes_terminate_quickly() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(20_000):
        deep = {"anyOf": [{"type": "array", "items": deep}]}
    deep_value: list[Any] = []
    for _ in range(5000):
        deep_value = [deep_value]
    cyclic: dict[str, Any] = {"type": "object", "properties": {}}
    cyclic["properties"]["me"] = cyclic
    cyclic["properties"]["arr"] = {"type": "array", "items": cyclic}
    cases = [
        obj(x={"enum": list(range(100_000))}),
        obj(x={"anyOf": [{"type": "string"}] * 100_000}),
        obj(x=deep),
        cyclic,
        obj(
            **{
                f"p{i}": obj(
                    **{f"q{j}": obj(**{f"r{k}": INT for k in range(30)}) for j in range(30)}
                )
                for i in range(30)
            }
        ),
        obj(x={"default": deep_value, "enum": [deep_value]}),
    ]
    for schema in cases:
        start = time.perf_counter()
        out = signature("f", schema)
        assert time.perf_counter() - start < 2.0
        assert len(out.splitlines()) == 1 and out == signature("f", schema)
    budget = signature("f", cases[4], options=IROptions(max_nodes=10, max_props=1000))
    assert "…" in budget


# -- fuzzing ---------------------------------------------------------------------------------
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
JSON = st.recursive(
    JSON_SCALARS,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=8,
)
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array", "x"])
REFS = st.sampled_from(
    [
        "#",
        "#/",
        "#/$defs/A",
        "#/$defs/B",
        "#/definitions/C",
        "#/properties/a",
        "#/$defs/A/items",
        "#/nope",
        "#/$defs/0",
        "http://x/y",
        "",
        "#/%24defs/A",
        "#/$defs/~0~1",
    ]
) | st.text(max_size=6)
NAMES = st.sampled_from(["a", "b", "c"]) | st.text(max_size=5)


def schema_nodes(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keyword = {
        "type": TYPES | st.lists(TYPES, max_size=3) | JSON,
        "properties": st.dictionaries(NAMES, children, max_size=4) | JSON,
        "required": st.lists(NAMES, max_size=4) | JSON,
        "items": children | st.lists(children, max_size=3),
        "prefixItems": st.lists(children, max_size=3),
        "anyOf": st.lists(children, max_size=4) | JSON,
        "oneOf": st.lists(children, max_size=4),
        "allOf": st.lists(children, max_size=3),
        "additionalProperties": children,
        "patternProperties": st.dictionaries(NAMES, children, max_size=2),
        "$ref": REFS | JSON,
        "$defs": st.dictionaries(st.sampled_from(["A", "B", "~/", "0"]), children, max_size=3),
        "definitions": st.dictionaries(st.just("C"), children, max_size=1),
        "enum": st.lists(JSON, max_size=12) | JSON,
        "const": JSON,
        "default": JSON,
        "description": st.text(max_size=20) | JSON,
        "nullable": st.booleans() | JSON,
        "x-unknown": JSON,
    }
    return st.fixed_dictionaries({}, optional=keyword) | children


SCHEMAS = st.recursive(
    st.booleans() | st.fixed_dictionaries({}) | JSON, schema_nodes, max_leaves=30
)
OPTIONS = st.builds(
    IROptions,
    max_depth=st.integers(0, 4),
    max_enum=st.integers(0, 5),
    max_union=st.integers(0, 5),
    max_props=st.integers(0, 5),
    max_literal_chars=st.integers(4, 40),
    max_desc_chars=st.none() | st.integers(0, 30),
    max_nodes=st.integers(0, 200),
    required_first=st.booleans(),
)


@settings(max_examples=200, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, options=OPTIONS, description=st.none() | st.text(max_size=30))
def test_fuzz_signature(schema: Any, options: IROptions, description: str | None) -> None:
    try:
        out = signature("tool_1", schema, description=description, options=options)
    except ToolError:
        assert not isinstance(schema, (dict, bool))
        return
    assert isinstance(out, str) and out.startswith("tool_1(")
    assert len(out.splitlines()) == 1 and "\n" not in out
    assert out == signature(
        "tool_1", copy.deepcopy(schema), description=description, options=options
    )


@settings(max_examples=50, deadline=1000)
@given(schema=SCHEMAS)
def test_fuzz_object_schemas_with_defs(schema: Any) -> None:
    root = {
        "type": "object",
        "$defs": {"A": schema, "B": {"$ref": "#/$defs/A"}},
        "properties": {"a": schema},
    }
    out = signature("f", root)
    assert len(out.splitlines()) == 1 and out == signature("f", copy.deepcopy(root))
