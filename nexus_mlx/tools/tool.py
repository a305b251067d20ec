"""The ``Tool`` type: one callable tool as an MCP server describes it, validated once.

Contract: a :class:`Tool` is a frozen record of ``name``, ``description``, ``input_schema`` (a JSON
Schema whose ``type`` is ``"object"``), ``annotations`` (MCP hints such as ``readOnlyHint``) and an
optional ``server`` namespace. Construction validates every field and raises
:class:`ToolError` naming the tool and the offending value:

- ``name`` follows the MCP naming rule: 1-128 characters from ``A-Z a-z 0-9 _ - .``, not starting
  with ``.`` or ``-`` (:data:`NAME_PATTERN`); :func:`sanitize_name` maps other strings onto it;
- ``server`` (the namespace) is 1-64 characters from ``A-Z a-z 0-9 _ -``: no dot, so the qualified
  name ``server.name`` splits unambiguously at its first :data:`NAMESPACE_SEP`;
- ``input_schema`` and ``annotations`` must be JSON data (str keys, finite numbers, no cycles),
  nested at most :data:`MAX_JSON_DEPTH` levels with at most :data:`MAX_JSON_NODES` values; the
  schema's ``properties`` (if any) maps names to schemas (objects or booleans) and its
  ``required`` (if any) is a list of strings;
- ``input_schema`` is valid JSON Schema: it passes the meta-schema of the draft its ``$schema``
  declares (2020-12 when it declares none) and every ``$ref`` resolves inside it
  (:mod:`~nexus_mlx.tools.schema_check`); the error gives the JSON pointer of the offending part.

The stored schema and annotations are private deep copies (a JSON round trip); treat them as
read-only. Equality compares all fields; hashing uses :attr:`Tool.canonical`.

This module does not validate arguments against the schema, render signatures
(``routing.ir``) or know about registries, files and servers (``agent.registry``,
``agent.mcp_server``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_mlx.errors import ToolError
from nexus_mlx.tools.schema_check import schema_problem_cached

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,63}")
NAMESPACE_SEP = "."
MAX_JSON_DEPTH = 100
MAX_JSON_NODES = 1_000_000
EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about hostile inputs."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_json_data(value: Any, what: str) -> None:
    """Raise :class:`ToolError` unless ``value`` is bounded JSON data.

    JSON data: dicts with str keys, lists/tuples, str, int, bool, None and finite floats. The walk
    is iterative and bounded by :data:`MAX_JSON_DEPTH` and :data:`MAX_JSON_NODES`, so cyclic or
    exponentially shared containers are rejected instead of hanging the caller.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_JSON_NODES:
            raise ToolError(f"{what} has more than {MAX_JSON_NODES} JSON values")
        if depth > MAX_JSON_DEPTH:
            raise ToolError(
                f"{what} is nested deeper than {MAX_JSON_DEPTH} levels (or cyclic)"
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ToolError(f"{what} has a non-string key {_short(key)}")
                stack.append((child, depth + 1))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise ToolError(f"{what} holds the non-JSON number {item!r}")
        elif item is not None and not isinstance(item, (str, int, bool)):
            raise ToolError(
                f"{what} holds a {type(item).__name__} ({_short(item)}), not JSON"
            )


def _json_copy(value: Any, what: str) -> tuple[Any, str]:
    """A private deep copy of JSON data and its canonical (sorted, compact) text."""
    check_json_data(value, what)
    copy = json.loads(json.dumps(value, ensure_ascii=False))
    return copy, json.dumps(copy, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_name(name: Any) -> str:
    """Return ``name`` if it is a valid tool name, else raise :class:`ToolError`."""
    if not isinstance(name, str) or not name:
        raise ToolError(f"tool name must be a non-empty string, got {_short(name)}")
    if NAME_PATTERN.fullmatch(name) is None:
        raise ToolError(
            f"tool name {_short(name)} is invalid: use 1-128 characters from A-Z a-z 0-9 _ - . "
            "not starting with '.' or '-' (sanitize_name() maps other names onto this set)"
        )
    return name


def check_namespace(namespace: Any) -> str:
    """Return ``namespace`` if it is a valid server namespace, else raise :class:`ToolError`."""
    if not isinstance(namespace, str) or NAMESPACE_PATTERN.fullmatch(namespace) is None:
        raise ToolError(
            f"namespace {_short(namespace)} is invalid: use 1-64 characters from A-Z a-z 0-9 _ - "
            f"(no {NAMESPACE_SEP!r}, which separates namespace and tool name)"
        )
    return namespace


def sanitize_name(raw: str) -> str:
    """Map any string onto :data:`NAME_PATTERN` deterministically.

    Runs of disallowed characters become one ``_``; leading ``.``/``-`` are dropped; the result is
    cut to 128 characters. ``"requestFirst Aid Assistance"`` -> ``"requestFirst_Aid_Assistance"``.
    Raises :class:`ToolError` when nothing usable is left.
    """
    if not isinstance(raw, str):
        raise ToolError(f"tool name must be a string, got {_short(raw)}")
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", raw.strip()).lstrip(".-")[:128]
    if not name:
        raise ToolError(f"tool name {_short(raw)} has no usable characters")
    return name


def _check_schema(name: str, schema: Any) -> None:
    """The structural rules of an input schema (see the module docstring)."""
    if not isinstance(schema, Mapping):
        raise ToolError(
            f"tool {name!r}: input_schema must be a JSON object, got {type(schema).__name__}"
        )
    if schema.get("type") != "object":
        raise ToolError(
            f"tool {name!r}: input_schema must be an object schema (type 'object'), "
            f"got type {_short(schema.get('type'))}"
        )
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ToolError(
            f"tool {name!r}: 'properties' must be an object, got {_short(properties)}"
        )
    for key, sub in properties.items():
        if not isinstance(sub, (Mapping, bool)):
            raise ToolError(
                f"tool {name!r}: property {_short(key)} must be a schema (object or boolean), "
                f"got {_short(sub)}"
            )
    required = schema.get("required", [])
    if not isinstance(required, (list, tuple)) or not all(isinstance(r, str) for r in required):
        raise ToolError(
            f"tool {name!r}: 'required' must be a list of strings, got {_short(required)}"
        )


@dataclass(frozen=True)
class Tool:
    """One tool: name, description, object input schema, MCP annotations, optional namespace."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: dict(EMPTY_OBJECT_SCHEMA))
    annotations: dict[str, Any] = field(default_factory=dict)
    server: str | None = None
    _canonical: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.server is not None:
            check_namespace(self.server)
        description = "" if self.description is None else self.description
        if not isinstance(description, str):
            raise ToolError(
                f"tool {self.name!r}: description must be a string, got {_short(description)}"
            )
        if not isinstance(self.annotations, Mapping):
            raise ToolError(
                f"tool {self.name!r}: annotations must be an object, got {_short(self.annotations)}"
            )
        schema, schema_text = _json_copy(self.input_schema, f"tool {self.name!r}: input_schema")
        _check_schema(self.name, schema)
        problem = schema_problem_cached(schema_text)
        if problem is not None:
            raise ToolError(f"tool {self.name!r}: {problem}")
        annotations, notes_text = _json_copy(
            dict(self.annotations), f"tool {self.name!r}: annotations"
        )
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "input_schema", schema)
        object.__setattr__(self, "annotations", annotations)
        head = json.dumps(
            [self.name, self.server, description], ensure_ascii=False, separators=(",", ":")
        )
        object.__setattr__(self, "_canonical", f"{head}{schema_text}{notes_text}")

    def __hash__(self) -> int:
        return hash(self._canonical)

    @property
    def canonical(self) -> str:
        """The tool's contents as canonical JSON texts (sorted keys, compact, no raw newline):
        ``[name, server, description]``, then the schema, then the annotations."""
        return self._canonical

    @property
    def qualified_name(self) -> str:
        """``server.name`` when the tool has a namespace, else ``name``."""
        return self.name if self.server is None else f"{self.server}{NAMESPACE_SEP}{self.name}"

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The schema's property names, in schema order."""
        return tuple(self.input_schema.get("properties", {}))

    @property
    def required(self) -> tuple[str, ...]:
        """The schema's ``required`` names, in schema order."""
        return tuple(self.input_schema.get("required", ()))

    def with_server(self, server: str | None) -> Tool:
        """A copy of this tool under another namespace (``None`` removes it)."""
        return Tool(self.name, self.description, self.input_schema, self.annotations, server)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tool:
        """Build a tool from an MCP-style dict; unknown keys (``icons``, ``_meta``, ...) are ignored.

        Accepts ``inputSchema`` or ``input_schema`` (a missing schema means
        :data:`EMPTY_OBJECT_SCHEMA`; both keys present is an error), ``annotations`` (null means
        none) and ``server`` or ``namespace``.
        """
        if not isinstance(data, Mapping):
            raise ToolError(f"a tool definition must be a JSON object, got {_short(data)}")
        if "inputSchema" in data and "input_schema" in data:
            raise ToolError(
                f"tool {_short(data.get('name'))} has both inputSchema and input_schema"
            )
        schema = data.get("inputSchema", data.get("input_schema", EMPTY_OBJECT_SCHEMA))
        server = data.get("server", data.get("namespace"))
        return cls(
            # __post_init__ checks the name (and every other field)
            name=data.get("name"),  # type: ignore[arg-type]
            description=data.get("description") or "",
            input_schema=schema,
            annotations=data.get("annotations") or {},
            server=server,
        )

    def to_dict(self) -> dict[str, Any]:
        """The MCP-style dict (camelCase ``inputSchema``); ``from_dict(to_dict())`` round-trips."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": json.loads(json.dumps(self.input_schema)),
            "annotations": json.loads(json.dumps(self.annotations)),
        }
        if self.server is not None:
            out["server"] = self.server
        return out
