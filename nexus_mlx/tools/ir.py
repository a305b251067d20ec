"""Compressed IR: a tool's JSON input schema as one short, type-hinted signature line.

Contract: ``signature("create_repository", schema)`` returns e.g.
``create_repository(name: string, autoInit?: boolean, private?: boolean = true)``. Rules:

- parameters: the ``properties`` of the top-level schema (after following top-level ``$ref``s; a
  schema without properties, of any type, gives ``name()``): required ones first, then optional
  ones (``?`` after the name), each group in ``properties`` order (``required_first=False`` keeps
  pure schema order); names listed in ``required`` but absent from ``properties`` follow the
  required properties as ``any``;
- types: ``string integer number boolean null``; arrays ``T[]`` (``(A|B)[]``; tuple-style ``items``
  or ``prefixItems`` as ``[A, B]``); objects with properties ``{k: T, k2?: T}`` down to
  ``max_depth`` nesting levels, ``object`` beyond; a map-like object (``additionalProperties`` /
  ``patternProperties`` schema only) ``{*: T}``; ``enum`` and ``const`` as JSON literals
  ``"a"|"b"`` with huge enums cut to ``max_enum`` values plus ``…+N`` (``max_enum=0`` drops the
  values, keeping the schema's ``type`` or else the values' JSON types); ``anyOf``/``oneOf`` and
  type lists as unions ``A|B`` (at most ``max_union`` members, then ``…+N``), ``allOf`` as ``A&B``;
  OpenAPI ``nullable: true`` adds ``|null``; an empty/``true`` schema or anything unrecognised is
  ``any``, ``false`` (or an empty enum) ``never``;
- ``$ref``: JSON pointers into the same schema (``#/$defs/X``, ``#/definitions/X``, ``#``) are
  resolved; a reference already being expanded (a cycle) and a reference that does not resolve are
  rendered as their last path segment (``Node``) when that is an identifier, else ``any``;
- defaults as `` = value`` (JSON literal); literals longer than ``max_literal_chars`` are cut
  with ``…``; with ``max_desc_chars`` set, every parameter gets an inline ``/* description */``
  cut to that many characters and the tool description is appended as ``// description``;
- without descriptions (the default), a top-level parameter keeps its *format hint* as
  ``/* hint */``: the words of its schema that decide how the value is written (IANA timezone
  name, ``HH:MM``, ISO 8601, examples, choices, a stated default), at most ``max_hint_chars``
  characters (:func:`nexus_mlx.tools.hints.format_hint`; ``max_hint_chars=0`` drops them).
  A parameter whose schema fixes no format gets none, so such signatures stay as they were.

:func:`tool_signature` names a tool by its ``qualified_name`` (``server.name``) when it has one.
The output is a single line (every line-breaking character is escaped or collapsed) and a pure
function of its inputs. Rendering is bounded: at most ``max_nodes`` schema nodes are expanded per
signature (the rest render as ``…``) and recursion stops after :data:`MAX_HOPS` levels, so cyclic,
enormous or malformed schemas always terminate. The only error raised is :class:`ToolError`, for a
name that is not a non-empty string without whitespace, for a top-level schema that is neither an
object nor a boolean, for invalid options, and for statistics over no tools.

This module does not validate schemas or arguments, build grammars or know about registries and
tokenizers beyond the ``encode`` callable that :func:`ir_length_stats` is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol
from urllib.parse import unquote

import numpy as np

from nexus_mlx.errors import ToolError
from nexus_mlx.tools.hints import format_hint

MAX_HOPS = 32
"""Hard limit on nested schema levels visited (objects, arrays, unions and ``$ref`` hops alike)."""

_PLAIN_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.\-]*")
_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCALARS = ("string", "integer", "number", "boolean", "null")
_MAX_NAME_CHARS = 64


@dataclass(frozen=True)
class IROptions:
    """Knobs of the signature renderer (all bounds are counts of items or characters)."""

    max_depth: int = 2
    max_enum: int = 8
    max_union: int = 8
    max_props: int = 12
    max_literal_chars: int = 32
    max_desc_chars: int | None = None
    max_hint_chars: int = 48
    max_nodes: int = 1000
    required_first: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "required_first":
                if not isinstance(value, bool):
                    raise ToolError(f"IROptions.required_first must be a bool, got {value!r}")
            elif f.name == "max_desc_chars" and value is None:
                continue
            elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ToolError(f"IROptions.{f.name} must be a non-negative int, got {value!r}")
        if self.max_literal_chars < 4:
            raise ToolError(f"IROptions.max_literal_chars must be >= 4, got {self.max_literal_chars}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IROptions:
        """Build options from a dict, ignoring unknown keys."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


DEFAULT_OPTIONS = IROptions()


class _Text(NamedTuple):
    text: str
    op: str = ""  # "|" for a top-level union, "&" for an intersection, "" otherwise


def _escape_breaks(text: str) -> str:
    for char, escaped in _BREAKS.items():
        text = text.replace(char, escaped)
    return text


def _one_line(text: str) -> str:
    """Collapse all whitespace (line breaks included) to single spaces."""
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _literal(value: Any, limit: int) -> str:
    """A JSON literal on one line, cut to ``limit`` characters (strings keep a closing quote)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return "…"
    text = _escape_breaks(text)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        return text[: limit - 2] + '…"'
    return text[: limit - 1] + "…"


def _name(key: Any) -> str:
    """A property name as is when plain, else as a (cut) JSON string."""
    key = key if isinstance(key, str) else str(key)
    if _PLAIN_NAME.fullmatch(key) and len(key) <= _MAX_NAME_CHARS:
        return key
    return _literal(key, _MAX_NAME_CHARS)


def _ref_name(ref: Any) -> str:
    if isinstance(ref, str):
        last = unquote(ref.rstrip("/").rsplit("/", 1)[-1]).lstrip("#")
        if last and _PLAIN_NAME.fullmatch(last) and len(last) <= _MAX_NAME_CHARS:
            return last
    return "any"


def _resolve_pointer(root: Any, ref: Any) -> Any | None:
    """The target of a same-document ``$ref`` (``#`` or ``#/a/b``), or ``None``."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    if ref in ("#", "#/"):
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _json_type(value: Any) -> str:
    """The JSON Schema type name of a JSON value (``any`` for non-JSON values)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    if isinstance(value, (int, float)):
        return "integer" if isinstance(value, int) else "number"
    kinds = ((str, "string"), (list, "array"), (Mapping, "object"))
    return next((name for cls, name in kinds if isinstance(value, cls)), "any")


def _wrap(part: _Text, joiner: str) -> str:
    """A part inside ``A|B`` (never wrapped), ``A&B`` (unions wrapped) or ``T[]`` (joiner ``""``)."""
    if part.op and part.op != joiner and joiner != "|":
        return f"({part.text})"
    return part.text


def _join(parts: list[_Text], joiner: str, hidden: int = 0) -> _Text:
    """Deduplicated ``A|B`` / ``A&B`` (``any`` absorbs a union, vanishes from an intersection)."""
    texts = list(dict.fromkeys(_wrap(p, joiner) for p in parts))
    if joiner == "|" and "any" in texts:
        return _Text("any")
    if joiner == "&" and len(texts) > 1:
        texts = [t for t in texts if t != "any"] or ["any"]
    if hidden > 0:
        texts.append(f"…+{hidden}")
    return _Text(joiner.join(texts), joiner if len(texts) > 1 else "")


class _Renderer:
    """One signature's rendering state: root (for ``$ref``), node budget and the ``$ref`` stack."""

    def __init__(self, root: Any, options: IROptions) -> None:
        self.root = root
        self.opt = options
        self.nodes = 0
        self.refs: list[str] = []

    def render(self, schema: Any, level: int, hops: int) -> _Text:
        """The type of ``schema``; ``level`` counts object nesting, ``hops`` all nesting."""
        self.nodes += 1
        if self.nodes > self.opt.max_nodes:
            return _Text("…")
        if schema is False:
            return _Text("never")
        if hops > MAX_HOPS or not isinstance(schema, Mapping):
            return _Text("any")  # also the schema `true`
        if "$ref" in schema:
            return self._ref(schema["$ref"], level, hops)
        if "const" in schema:
            return _Text(_literal(schema["const"], self.opt.max_literal_chars))
        enum = schema.get("enum")
        if isinstance(enum, list) and (self.opt.max_enum > 0 or not enum or "type" not in schema):
            return self._enum(enum)
        for key, joiner in (("anyOf", "|"), ("oneOf", "|"), ("allOf", "&")):
            if isinstance(schema.get(key), list) and schema[key]:
                return self._members(schema[key], level, hops, joiner)
        result = self._typed(schema, level, hops)
        if schema.get("nullable") is True:
            return _join([result, _Text("null")], "|")
        return result

    def _ref(self, ref: Any, level: int, hops: int) -> _Text:
        if not isinstance(ref, str) or ref in self.refs:
            return _Text(_ref_name(ref))
        target = _resolve_pointer(self.root, ref)
        if target is None:
            return _Text(_ref_name(ref))
        self.refs.append(ref)
        try:
            return self.render(target, level, hops + 1)
        finally:
            self.refs.pop()

    def _enum(self, values: list[Any]) -> _Text:
        if not values:
            return _Text("never")
        if self.opt.max_enum == 0:
            kinds = [_json_type(v) for v in values[: self.opt.max_nodes]]
            return _join([_Text(k) for k in dict.fromkeys(kinds)], "|")
        limit = self.opt.max_enum
        parts = [_literal(v, self.opt.max_literal_chars) for v in values[:limit]]
        if len(values) > limit:
            parts.append(f"…+{len(values) - limit}")
        return _Text("|".join(parts), "|" if len(parts) > 1 else "")

    def _members(self, members: list[Any], level: int, hops: int, joiner: str) -> _Text:
        """The first ``max_union`` members joined; the rest are counted, not rendered."""
        limit = max(self.opt.max_union, 1)
        parts = [self.render(m, level, hops + 1) for m in members[:limit]]
        return _join(parts, joiner, hidden=len(members) - len(parts))

    def _typed(self, schema: Mapping[str, Any], level: int, hops: int) -> _Text:
        kind = schema.get("type")
        if isinstance(kind, list):
            names = [k for k in kind if isinstance(k, str)]
            if not names:
                return _Text("any")
            limit = max(self.opt.max_union, 1)
            parts = [self._single(schema, k, level, hops) for k in names[:limit]]
            return _join(parts, "|", hidden=len(names) - len(parts))
        if kind is None:
            if isinstance(schema.get("properties"), Mapping):
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
        return self._single(schema, kind, level, hops)

    def _single(self, schema: Mapping[str, Any], kind: Any, level: int, hops: int) -> _Text:
        if kind in _SCALARS:
            return _Text(kind)
        if kind == "array":
            return self._array(schema, level, hops)
        if kind == "object":
            return self._object(schema, level, hops)
        return _Text("any")

    def _array(self, schema: Mapping[str, Any], level: int, hops: int) -> _Text:
        tuple_items = schema.get("prefixItems", schema.get("items"))
        if isinstance(tuple_items, list):
            limit = max(self.opt.max_props, 1)
            parts = [self.render(i, level, hops + 1).text for i in tuple_items[:limit]]
            if len(tuple_items) > limit:
                parts.append(f"…+{len(tuple_items) - limit}")
            return _Text(f"[{', '.join(parts)}]")
        items = schema.get("items")
        if items is None:
            return _Text("any[]")
        return _Text(_wrap(self.render(items, level, hops + 1), "") + "[]")

    def _object(self, schema: Mapping[str, Any], level: int, hops: int) -> _Text:
        if level >= self.opt.max_depth:
            return _Text("object")
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties:
            params = _ordered_params(properties, schema.get("required"), self.opt.required_first)
            limit = max(self.opt.max_props, 1)
            parts = [
                f"{_name(key)}{'' if req else '?'}: {self.render(sub, level + 1, hops + 1).text}"
                for key, sub, req in params[:limit]
            ]
            if len(params) > limit:
                parts.append(f"…+{len(params) - limit}")
            return _Text("{" + ", ".join(parts) + "}")
        extra = schema.get("additionalProperties")
        patterns = schema.get("patternProperties")
        if (
            not (isinstance(extra, Mapping) and extra)
            and isinstance(patterns, Mapping)
            and patterns
        ):
            extra = next(iter(patterns.values()))
        if isinstance(extra, Mapping) and extra:
            return _Text("{*: " + self.render(extra, level + 1, hops + 1).text + "}")
        return _Text("object")

    def parameter(self, key: Any, sub: Any, required: bool) -> str:
        """One top-level parameter: ``name?: T = default /* description */``."""
        text = f"{_name(key)}{'' if required else '?'}: {self.render(sub, 0, 1).text}"
        if isinstance(sub, Mapping) and "default" in sub:
            text += " = " + _literal(sub["default"], self.opt.max_literal_chars)
        description = sub.get("description") if isinstance(sub, Mapping) else None
        if self.opt.max_desc_chars and isinstance(description, str) and description.strip():
            note = _cut(_one_line(description), self.opt.max_desc_chars).replace("*/", "* /")
            text += f" /* {note} */"
        elif not self.opt.max_desc_chars:
            hint = _escape_breaks(format_hint(sub, self.opt.max_hint_chars))
            if hint:
                text += f" /* {hint} */"
        return text


def _ordered_params(
    properties: Mapping[Any, Any], required: Any, required_first: bool
) -> list[tuple[Any, Any, bool]]:
    """``(name, schema, required)`` triples in rendering order (see the module docstring)."""
    needed = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    needed_set = set(needed)
    listed = [(k, v, k in needed_set) for k, v in properties.items()]
    missing = [(r, True, True) for r in dict.fromkeys(needed) if r not in properties]
    if not required_first:
        return listed + missing
    return [p for p in listed if p[2]] + missing + [p for p in listed if not p[2]]


def _top_level(schema: Any) -> Mapping[str, Any]:
    """Follow top-level ``$ref``s (cycle-safe) to the object schema whose properties we list."""
    if schema is True or schema is False:
        return {}
    if not isinstance(schema, Mapping):
        raise ToolError(
            f"an input schema must be a JSON object or boolean, got {type(schema).__name__}"
        )
    node: Any = schema
    seen: set[str] = set()
    while (
        isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and node["$ref"] not in seen
    ):
        seen.add(node["$ref"])
        node = _resolve_pointer(schema, node["$ref"])
    return node if isinstance(node, Mapping) else {}


def _check_name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not name
        or any(c.isspace() or not c.isprintable() for c in name)
    ):
        raise ToolError(f"tool name must be a non-empty string without whitespace, got {name!r:.80}")
    return name


def signature(
    name: str,
    schema: Mapping[str, Any] | bool,
    *,
    description: str | None = None,
    options: IROptions = DEFAULT_OPTIONS,
) -> str:
    """The one-line compressed IR of a tool (see the module docstring for every rule)."""
    _check_name(name)
    if not isinstance(options, IROptions):
        raise ToolError(f"options must be IROptions, got {type(options).__name__}")
    top = _top_level(schema)
    renderer = _Renderer(schema, options)
    properties = top.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    params = _ordered_params(properties, top.get("required"), options.required_first)
    text = f"{name}({', '.join(renderer.parameter(k, s, r) for k, s, r in params)})"
    if options.max_desc_chars and isinstance(description, str) and description.strip():
        text += " // " + _cut(_one_line(description), options.max_desc_chars)
    return text


class SchemaTool(Protocol):
    """What :func:`tool_signature` reads from a tool (``agent.tools.Tool`` fits)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def input_schema(self) -> Mapping[str, Any]: ...


def tool_signature(tool: SchemaTool, options: IROptions = DEFAULT_OPTIONS) -> str:
    """:func:`signature` of a tool, named by its ``qualified_name`` when it has one."""
    name = getattr(tool, "qualified_name", tool.name)
    return signature(name, tool.input_schema, description=tool.description, options=options)


@dataclass(frozen=True)
class IRLengthStats:
    """Length distribution of the IR over a set of tools (``unit`` is ``tokens`` or ``chars``)."""

    n: int
    median: float
    p99: float
    mean: float
    max: int
    unit: str


def ir_length_stats(
    tools: Iterable[SchemaTool],
    encode: Callable[[str], Sized] | None = None,
    options: IROptions = DEFAULT_OPTIONS,
) -> IRLengthStats:
    """Median / p99 (numpy's linear percentile) / mean / max length of every tool's IR.

    Lengths are ``len(encode(ir))`` tokens, or characters when ``encode`` is ``None``.
    """
    lengths = [
        len(encode(s)) if encode is not None else len(s)
        for s in (tool_signature(t, options) for t in tools)
    ]
    if not lengths:
        raise ToolError("ir_length_stats needs at least one tool, got none")
    median, p99 = np.percentile(np.asarray(lengths, dtype=np.float64), [50, 99])
    return IRLengthStats(
        n=len(lengths),
        median=float(median),
        p99=float(p99),
        mean=float(np.mean(lengths)),
        max=int(max(lengths)),
        unit="chars" if encode is None else "tokens",
    )
