"""``ToolRegistry``: an ordered set of uniquely named tools, plus loaders for tool files.

Contract: a registry keeps :class:`~nexus_mlx.tools.tool.Tool` objects in insertion order, keyed
by their qualified name (``server.name``, or ``name`` without a namespace). Adding a name that is
already present raises :class:`ToolError` naming it; so does asking for an unknown one (the
message lists close matches). Every operation either succeeds or leaves the registry unchanged.
``merge(other, namespace="git")`` returns a new registry holding this one's tools followed by
``other``'s tools, the latter moved under the namespace ``git`` (``git.git_status``): the way tools
from several MCP servers are combined without name clashes. An empty registry is valid.

Files:
- ``save(path)`` / ``ToolRegistry.load(path)``: JSON ``{"format": "nexus-mlx/tools", "version": 1,
  "tools": [...]}`` with MCP-style tool dicts; ``load`` (= :func:`load_tools_json`) also reads a
  bare list of tools or any object with a ``"tools"`` list (such as ``github-mcp/tools.json``),
  with ``inputSchema`` or ``input_schema``; unknown keys are ignored.
- :func:`load_seal_tools`: Seal-Tools ``tool.jsonl`` (``api_name``, ``api_description``, ``field``,
  ``parameters``, ``required``); see :func:`seal_tool` for the type mapping and fallbacks.
- Live MCP servers: ``nexus_mlx.agent.mcp_server`` (kept apart so this module needs no ``mcp``).
Malformed files raise :class:`FormatError` naming the file and the tool (index or line).

``digest()`` is the SHA-256 of the canonical JSON of the tools in order (``Tool.canonical``):
equal contents in the same order give the same digest on every machine and Python version.
``text_for_embedding`` is the text a retrieval embedder sees for a tool. This module does not embed, route, render signatures or talk to servers.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from nexus_mlx.errors import FormatError, ToolError
from nexus_mlx.tools.tool import Tool, check_namespace, sanitize_name

FILE_FORMAT = "nexus-mlx/tools"
FILE_VERSION = 1

SEAL_TYPES: dict[str, str] = {
    "str": "string",
    "string": "string",
    "text": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "double": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
    "none": "null",
    "null": "null",
}
"""Seal-Tools (Python-style) type names, lower-cased, to JSON Schema types."""

_GENERIC = re.compile(r"\s*(\w+)\s*\[(.*)\]\s*")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def split_identifier(identifier: str) -> str:
    """An identifier as lower-case words: ``getHealthWorkforce`` -> ``get health workforce``,
    ``list_pull_requests`` -> ``list pull requests`` (camel case and ``_ - .`` separate)."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", identifier)
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", text)
    return " ".join(re.sub(r"[_\-.]+", " ", text).split()).lower()


def text_for_embedding(tool: Tool, *, parameters: bool = True, split_names: bool = True) -> str:
    """``"name: description"`` on one line, plus ``". Parameters: a, b."`` when asked and present.

    With ``split_names`` (the default) the tool and parameter names are written as words
    (:func:`split_identifier`): a sentence encoder matches ``get health workforce`` to a request
    far better than ``getHealthWorkforce`` (Seal-Tools, 4,076 tools: SLB top-1 0.75 -> 0.80 in
    the lever sweep of ``results/routing_accuracy.json``). The raw tool name is used (not the
    namespace), so the same tool embeds the same on any server.
    """
    def name(identifier: str) -> str:
        return split_identifier(identifier) if split_names else _one_line(identifier)

    description = _one_line(tool.description)
    text = f"{name(tool.name)}: {description}" if description else name(tool.name)
    names = [name(n) for n in tool.parameter_names]
    if parameters and names:
        stop = "" if not description or description[-1] in ".!?" else "."
        text += f"{stop} Parameters: {', '.join(names)}."
    return text


class ToolRegistry:
    """An ordered collection of tools with unique qualified names (see the module docstring)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self.extend(tools)

    # -- collection protocol ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolRegistry):
            return NotImplemented
        return list(self._tools.values()) == list(other._tools.values())

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable

    def __repr__(self) -> str:
        return f"ToolRegistry({len(self)} tools, digest={self.digest()[:12]})"

    def names(self) -> list[str]:
        """Qualified names in registry order."""
        return list(self._tools)

    def _unknown(self, name: str) -> ToolError:
        close = difflib.get_close_matches(str(name), list(self._tools), n=3)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        return ToolError(f"no tool named {name!r} among {len(self)} tools{hint}")

    def get(self, name: str) -> Tool:
        """The tool with this qualified name; :class:`ToolError` if there is none."""
        try:
            return self._tools[name]
        except (KeyError, TypeError):
            raise self._unknown(name) from None

    # -- mutation ------------------------------------------------------------------------------
    def add(self, tool: Tool) -> None:
        """Append ``tool``; a duplicate qualified name raises :class:`ToolError`."""
        self.extend([tool])

    def extend(self, tools: Iterable[Tool]) -> None:
        """Append several tools, all or none (every name is checked before any is added)."""
        batch = list(tools)
        seen: set[str] = set()
        for tool in batch:
            if not isinstance(tool, Tool):
                raise ToolError(f"a registry holds Tool objects, got {type(tool).__name__}")
            name = tool.qualified_name
            if name in self._tools or name in seen:
                raise ToolError(f"duplicate tool name {name!r}")
            seen.add(name)
        for tool in batch:
            self._tools[tool.qualified_name] = tool

    def remove(self, name: str) -> Tool:
        """Remove and return the tool with this qualified name."""
        tool = self.get(name)
        del self._tools[name]
        return tool

    # -- namespaces ----------------------------------------------------------------------------
    def namespaced(self, namespace: str) -> ToolRegistry:
        """A copy with every tool under ``namespace``; a tool already under another one is an error."""
        check_namespace(namespace)
        moved = []
        for tool in self._tools.values():
            if tool.server not in (None, namespace):
                raise ToolError(
                    f"tool {tool.qualified_name!r} already has namespace {tool.server!r}; "
                    f"cannot move it under {namespace!r}"
                )
            moved.append(tool.with_server(namespace))
        return ToolRegistry(moved)

    def merge(self, other: ToolRegistry, namespace: str | None = None) -> ToolRegistry:
        """A new registry: this one's tools, then ``other``'s (under ``namespace`` if given)."""
        incoming = other.namespaced(namespace) if namespace is not None else other
        merged = ToolRegistry(self)
        merged.extend(incoming)
        return merged

    # -- derived views -------------------------------------------------------------------------
    def texts_for_embedding(self, *, parameters: bool = True, split_names: bool = True) -> list[str]:
        """:func:`text_for_embedding` of every tool, in registry order."""
        return [text_for_embedding(t, parameters=parameters, split_names=split_names)
                for t in self._tools.values()]

    def to_dict(self) -> dict[str, Any]:
        """The file form: format tag, version and MCP-style tool dicts in order."""
        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "tools": [t.to_dict() for t in self._tools.values()],
        }

    def digest(self) -> str:
        """Hex SHA-256 of the tools' :attr:`~nexus_mlx.tools.tool.Tool.canonical` texts, in order."""
        hasher = hashlib.sha256(f"{FILE_FORMAT}/{FILE_VERSION}".encode())
        for tool in self._tools.values():
            hasher.update(b"\n" + tool.canonical.encode("utf-8"))
        return hasher.hexdigest()

    # -- files ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the registry as JSON (UTF-8), atomically (temporary file, then rename)."""
        target = Path(path)
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_text(
            json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n", "utf-8"
        )
        os.replace(temporary, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ToolRegistry:
        """Read a file written by :meth:`save` (or any file :func:`load_tools_json` accepts)."""
        return load_tools_json(path)


# -- loaders -------------------------------------------------------------------------------------
def _read_text(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"cannot read tool file {str(path)!r}: {exc}") from exc


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where}: not valid JSON ({exc})") from exc
    except RecursionError:
        raise FormatError(f"{where}: JSON nested too deeply") from None


def load_tools_json(path: str | os.PathLike[str]) -> ToolRegistry:
    """Read a JSON file holding a list of MCP-style tools or an object with a ``"tools"`` list."""
    data = _parse_json(_read_text(path), str(path))
    items = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise FormatError(
            f"{str(path)!r}: expected a list of tools or an object with a 'tools' list, "
            f"got {type(data).__name__}"
            + (f" with keys {sorted(data)[:8]}" if isinstance(data, dict) else "")
        )
    tools = []
    for index, item in enumerate(items):
        try:
            tools.append(Tool.from_dict(item))
        except ToolError as exc:
            raise FormatError(f"{str(path)!r}: tool #{index}: {exc}") from exc
    try:
        return ToolRegistry(tools)
    except ToolError as exc:
        raise FormatError(f"{str(path)!r}: {exc}") from exc


def seal_type(type_name: Any) -> dict[str, Any]:
    """The JSON Schema for a Seal-Tools (Python-style) type name.

    ``str int float bool list dict`` (any case, also ``tuple``, ``none`` and JSON names) map to
    ``string integer number boolean array object``; ``list[T]``/``List[T]`` becomes an array of
    ``T``, ``dict[...]`` an object. Anything else (unknown names, non-strings, missing) falls back
    to ``{}`` (any JSON value), with the original kept under ``"x-original-type"`` when present.
    """
    if isinstance(type_name, str):
        key = type_name.strip().lower()
        if key in SEAL_TYPES:
            return {"type": SEAL_TYPES[key]}
        generic = _GENERIC.fullmatch(type_name)
        if generic is not None:
            outer = SEAL_TYPES.get(generic.group(1).lower())
            if outer == "array":
                inner = generic.group(2).split(",")[0]
                return {"type": "array", "items": seal_type(inner)}
            if outer == "object":
                return {"type": "object"}
    return {} if type_name is None else {"x-original-type": str(type_name)[:64]}


def _seal_parameter(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One Seal-Tools parameter -> JSON Schema (description, default, choices -> enum, examples)."""
    schema = seal_type(spec.get("type"))
    description = spec.get("description")
    if isinstance(description, str) and description:
        schema["description"] = description
    if isinstance(spec.get("unit"), str):
        schema["description"] = f"{schema.get('description', '')} (unit: {spec['unit']})".strip()
    if "default" in spec:
        schema["default"] = spec["default"]
    if isinstance(spec.get("choices"), list):
        schema["enum"] = spec["choices"]
    examples = [spec[k] for k in ("example", "example_values") if k in spec]
    if isinstance(spec.get("examples"), list):
        examples.extend(spec["examples"])
    if examples:
        schema["examples"] = examples
    return schema


def seal_tool(row: Mapping[str, Any], *, sanitize: bool = True) -> Tool:
    """One Seal-Tools row -> :class:`Tool` (``responses`` are dropped; ``field`` goes to annotations).

    The schema is ``{"type": "object", "properties": ..., "required": ...}`` with every parameter
    mapped by :func:`seal_type`; ``description``, ``default``, ``choices`` (as ``enum``),
    ``example``/``examples``/``example_values`` (as ``examples``) and ``unit`` (appended to the
    description) are kept, other parameter keys dropped. With ``sanitize`` (default) an
    ``api_name`` outside the MCP name rule goes through :func:`sanitize_name` (one Seal-Tools tool,
    ``"requestFirst Aid Assistance"``, has spaces): map gold names the same way when scoring.
    """
    if not isinstance(row, Mapping):
        raise ToolError(f"a Seal-Tools row must be a JSON object, got {type(row).__name__}")
    name = row.get("api_name")
    if sanitize and isinstance(name, str):
        name = sanitize_name(name)
    parameters = row.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise ToolError(
            f"tool {name!r}: 'parameters' must be an object, got {type(parameters).__name__}"
        )
    properties = {}
    for key, spec in parameters.items():
        if not isinstance(spec, Mapping):
            raise ToolError(
                f"tool {name!r}: parameter {key!r} must be an object, got {spec!r:.60}"
            )
        properties[key] = _seal_parameter(spec)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = row.get("required")
    if required:
        schema["required"] = required
    annotations = {"field": row["field"]} if isinstance(row.get("field"), str) else {}
    return Tool(name, row.get("api_description") or "", schema, annotations)  # type: ignore[arg-type]


def load_seal_tools(path: str | os.PathLike[str], *, sanitize: bool = True) -> ToolRegistry:
    """Read a Seal-Tools ``tool.jsonl`` (one tool per line; blank lines skipped)."""
    tools = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{str(path)!r} line {number}"
        try:
            tools.append(seal_tool(_parse_json(line, where), sanitize=sanitize))
        except ToolError as exc:
            raise FormatError(f"{where}: {exc}") from exc
    try:
        return ToolRegistry(tools)
    except ToolError as exc:
        raise FormatError(f"{str(path)!r}: {exc}") from exc


def load_tools(path: str | os.PathLike[str]) -> ToolRegistry:
    """:func:`load_seal_tools` for ``*.jsonl`` files, :func:`load_tools_json` for anything else."""
    return load_seal_tools(path) if str(path).endswith(".jsonl") else load_tools_json(path)
