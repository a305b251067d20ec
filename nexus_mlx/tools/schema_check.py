"""Is a tool's input schema valid JSON Schema? Meta-validation and ``$ref`` resolution.

Contract: :func:`schema_problem` ``(schema)`` returns None for a valid schema, else one sentence
naming the JSON pointer (RFC 6901) of the offending part and what is wrong there. Valid means:

- the schema validates against the meta-schema of the draft its ``$schema`` declares (draft 3,
  4, 6, 7, 2019-09 or 2020-12; no ``$schema`` means 2020-12, the draft MCP uses); an unknown
  ``$schema`` is itself a problem;
- every ``$ref`` in a subschema position (``properties``, ``items``, ``allOf``, ``$defs``, ...)
  resolves inside the schema (JSON pointers, ``$id``-relative references, anchors) or to a
  published meta-schema. Nothing is fetched over the network: a reference to any other
  document is a problem, since neither the grammar compiler nor the argument validator could
  follow it.

Results are cached by the schema's canonical JSON text (:func:`schema_problem_cached`).
It does not know tool names (the caller adds them), validate arguments or compile grammars.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from typing import Any
from urllib.parse import urljoin

import jsonschema
import jsonschema.exceptions
from jsonschema_specifications import REGISTRY as META_SCHEMAS
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

DEFAULT_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
)
_UNKNOWN = object()


def json_pointer(parts: Any) -> str:
    """RFC 6901 pointer of a path (``["properties", "a/b"]`` -> ``/properties/a~1b``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _where(parts: Any) -> str:
    pointer = json_pointer(parts)
    return f"at {pointer}" if pointer else "at the root"


def _validator_class(schema: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The validator class of the declared draft, or (None, problem)."""
    if "$schema" not in schema:
        return jsonschema.Draft202012Validator, None
    dialect = schema["$schema"]
    if not isinstance(dialect, str):
        return None, f"$schema must be a URI string, got {dialect!r:.60}"
    cls = jsonschema.validators.validator_for(schema, default=_UNKNOWN)
    if cls is _UNKNOWN:
        return None, (
            f"$schema {dialect!r:.80} is not a JSON Schema draft this library knows "
            "(draft 3, 4, 6, 7, 2019-09 or 2020-12)"
        )
    return cls, None


def _subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """(relative path, subschema) of every direct subschema position of ``schema``."""
    for key in _SCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, Mapping):
            for name, sub in value.items():
                yield (key, name), sub
    for key in _SCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield (key, i), sub
    for key in _SCHEMA_ONE:
        if key in schema:
            yield (key,), schema[key]
    items = schema.get("items")
    if isinstance(items, list):
        for i, sub in enumerate(items):
            yield ("items", i), sub
    elif items is not None:
        yield ("items",), items
    dependencies = schema.get("dependencies")
    if isinstance(dependencies, Mapping):
        for name, sub in dependencies.items():
            if isinstance(sub, Mapping):  # a list of property names is not a schema
                yield ("dependencies", name), sub


def _ref_problem(schema: Mapping[str, Any], dialect: str) -> str | None:
    spec = specification_with(dialect, default=DRAFT202012)
    root = spec.create_resource(schema)
    registry: Registry[Any] = META_SCHEMAS.with_resource(uri=root.id() or "", resource=root)
    stack: list[tuple[tuple[str | int, ...], Any, Any]] = [  # (path, node, resolver)
        ((), schema, registry.crawl().resolver(base_uri=root.id() or ""))
    ]
    while stack:
        path, node, resolver = stack.pop()
        if not isinstance(node, Mapping):
            continue
        if path and spec.id_of(node) is not None:  # "$id" (draft 4: "id") starts a new base
            resolver = resolver.in_subresource(spec.create_resource(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except Unresolvable as exc:
                detail = type(exc).__name__
                return (
                    f"$ref {ref!r:.80} {_where((*path, '$ref'))} does not resolve "
                    f"({detail}; only references inside the schema or to a JSON Schema "
                    "meta-schema are followed)"
                )
        stack.extend(((*path, *rel), sub, resolver) for rel, sub in _subschemas(node))
    return None


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """None if ``schema`` is valid JSON Schema with resolvable ``$ref``s, else the problem."""
    cls, problem = _validator_class(schema)
    if problem is not None:
        return problem
    dialect = cls.ID_OF(cls.META_SCHEMA) or DEFAULT_DIALECT
    error = jsonschema.exceptions.best_match(_meta_validator(cls).iter_errors(schema))
    if error is not None:
        return (
            f"input_schema is not valid JSON Schema ({dialect.rstrip('#')}) "
            f"{_where(error.absolute_path)}: {error.message:.200}"
        )
    return _ref_problem(schema, dialect)


def _dynamic_to_root(node: Any) -> Any:
    """A copy of ``node`` with every ``"$dynamicRef": "#meta"`` made a plain ``"$ref": "#"``."""
    if isinstance(node, Mapping):
        return {("$ref" if k == "$dynamicRef" else k):
                ("#" if k == "$dynamicRef" else _dynamic_to_root(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_dynamic_to_root(v) for v in node]
    return node


def flat_2020_12_meta_schema() -> dict[str, Any] | None:
    """The 2020-12 meta-schema as one document, or None if its published form is not the
    expected one (then the official one is used).

    The official meta-schema is an ``allOf`` of seven vocabulary meta-schemas tied together by
    ``$dynamicRef``; every vocabulary describes its own keywords (no keyword twice), so merging
    their ``properties`` and ``$defs`` and pointing each ``$dynamicRef`` at the merged root
    accepts exactly the same schemas (nobody extends the dialect here), ~5x faster to check
    (``test_schema_validation`` compares the two on every real tool and on invalid ones).
    """
    root = META_SCHEMAS.contents(DEFAULT_DIALECT)
    flat: dict[str, Any] = {"$schema": DEFAULT_DIALECT, "type": ["object", "boolean"],
                            "properties": {}, "$defs": {}}
    parts = [root] + [META_SCHEMAS.contents(urljoin(DEFAULT_DIALECT, part["$ref"]))
                      for part in root.get("allOf", ())]
    for part in parts:
        if part.get("type", ["object", "boolean"]) != ["object", "boolean"]:
            return None
        for section in ("properties", "$defs"):
            for key, value in part.get(section, {}).items():
                if key in flat[section]:
                    return None
                flat[section][key] = _dynamic_to_root(value)
    return flat


@cache
def _meta_validator(cls: Any) -> Any:
    if cls is jsonschema.Draft202012Validator:
        flat = flat_2020_12_meta_schema()
        if flat is not None:
            return cls(flat)
    return cls(cls.META_SCHEMA)


@lru_cache(maxsize=8192)
def schema_problem_cached(schema_text: str) -> str | None:
    """:func:`schema_problem` of a schema given as JSON text (cached by that text)."""
    return schema_problem(json.loads(schema_text))
