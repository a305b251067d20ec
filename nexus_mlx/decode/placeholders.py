"""Placeholder guard for generated tool arguments.

Contract: small models copy type names and template markers from the prompt into values
(``{"owner": "string"}``, ``"<value>"``). :class:`PlaceholderPolicy` defines what counts as a
placeholder (see ``json_constraint``'s docstring for the full list); ``is_placeholder`` judges one
string, ``find_placeholders`` returns the JSON-pointer paths of placeholder strings in a finished
value, and ``check_arguments`` adds ``jsonschema`` validation errors. Keys are never judged.

``quoted`` is text the values may quote (the conversation the call answers): a value that occurs
in it (as whole words, case-insensitively) is never a placeholder, whatever it looks like (a comment body
``"Your fix works"``, a title ``"TODO"`` the user asked for).

It does not compile grammars or drive matchers (:mod:`.json_constraint`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jsonschema
import referencing.exceptions

_TYPE_WORD = r"(?:string|integer|number|boolean|object|array|null|any|never|int|float|bool|str|dict|list)"
_TYPE_RE = re.compile(rf"{_TYPE_WORD}(?:\[\])*\??(?:\s*[|&]\s*{_TYPE_WORD}(?:\[\])*\??)*")
_TEMPLATE_RE = re.compile(r"<[^<>]{0,64}>|\{\{?[^{}]{0,64}\}?\}|\$\{[^{}]{0,64}\}|%[sdif]")
_YOUR_RE = re.compile(r"your[_\- ][a-z0-9_\- ]+")
_WORDS = frozenset({
    "...", "…", "value", "placeholder", "todo", "tbd", "tba", "fixme", "xxx", "lorem ipsum",
})
_STARTS = frozenset("<{$%.…")
_WORD_LIST = tuple(_WORDS) + (
    "string", "integer", "number", "boolean", "object", "array", "null", "any", "never",
    "int", "float", "bool", "str", "dict", "list", "your", "the",
)
_ECHO_SUFFIXES = ("", "name", "id", "value")
_DIGITS = "0123456789"
_ECHO_PREFIXES = ("your", "the")
MIN_NAME_PREFIX = 4
"""Caller names shorter than this are not banned as value prefixes."""


_NORM_DROP = str.maketrans("", "", " \t\n\r\f\v_-.")


def _norm(text: str) -> str:
    return text.lower().translate(_NORM_DROP)


def _echoes(norm_value: str, words: Iterable[str]) -> bool:
    """``norm_value`` is a word, ``word + name/id/value`` (digits may follow) or
    ``your/the + word``."""
    for word in words:
        if norm_value.startswith(word) and norm_value[len(word):].rstrip(_DIGITS) in _ECHO_SUFFIXES:
            return True
        if norm_value.endswith(word) and norm_value[: -len(word)] in _ECHO_PREFIXES:
            return True
    return False


class PlaceholderPolicy:
    """Which string values count as placeholder text for one schema (module docstring).

    ``names`` are further prompt names (the candidate tools'): a value may neither echo one nor
    start with one (``"create_repository_private"``)."""

    def __init__(self, schema: Any = None, names: Iterable[str] = (),
                 quoted: str | None = None) -> None:
        self.names = tuple(n for n in names if len(n) >= MIN_NAME_PREFIX)
        self.exempt = schema_strings(schema)
        words = [*schema_property_names(schema), *names]
        self.words = frozenset(n for n in (_norm(w) for w in words) if n)
        self.quoted = quoted.lower() if quoted is not None else None

    def is_placeholder(self, value: str, key: str | None = None) -> bool:
        """Whether ``value`` (a string value of property ``key``) is placeholder text."""
        if value in self.exempt or self.is_quoted(value):
            return False
        text = value.strip()
        low = text.lower()
        if not text or low in _WORDS or _TYPE_RE.fullmatch(low) or _TEMPLATE_RE.fullmatch(text):
            return True
        if _YOUR_RE.fullmatch(low) or any(value.startswith(n) for n in self.names):
            return True
        norm = _norm(text)
        words = self.words | {_norm(key)} if key else self.words
        return bool(norm) and _echoes(norm, words)

    def is_quoted(self, value: str) -> bool:
        """Whether ``value`` (stripped, non-empty) occurs in the quoted text as whole words,
        ignoring case (``"value"`` is not quoted by ``"evaluate"``)."""
        text = value.strip().lower()
        if not text or self.quoted is None or text not in self.quoted:
            return False
        return re.search(rf"(?<!\w){re.escape(text)}(?!\w)", self.quoted) is not None

    def may_become(self, value: str, key: str | None) -> bool:
        """Conservative filter: ``False`` only if no continuation of ``value`` is a placeholder."""
        if any(value.startswith(n) or n.startswith(value) for n in self.names):
            return True
        low = value.strip().lower()
        if not low or low[0] in _STARTS:
            return True
        if any(low.startswith(w) or w.startswith(low) for w in _WORD_LIST):
            return True
        norm = _norm(low)
        words = self.words | {_norm(key)} if key else self.words
        return any(w.startswith(norm) or norm.startswith(w) for w in words)

    def name_rests(self, value: str) -> list[bytes]:
        """For each caller name that ``value`` is a proper prefix of, the bytes still missing."""
        return [n[len(value):].encode("utf-8") for n in self.names
                if len(n) > len(value) and n.startswith(value)]


def is_placeholder(value: str, key: str | None = None, names: Iterable[str] = (),
                   quoted: str | None = None) -> bool:
    """:meth:`PlaceholderPolicy.is_placeholder` without a schema."""
    return PlaceholderPolicy(None, names, quoted).is_placeholder(value, key)


def schema_property_names(schema: Any) -> frozenset[str]:
    """Every property name declared anywhere in ``schema`` (the IR shows them all)."""
    found: set[str] = set()

    def visit(node: Any, depth: int) -> None:
        if depth > 64:
            return
        if isinstance(node, Mapping):
            props = node.get("properties")
            if isinstance(props, Mapping):
                found.update(str(k) for k in props)
            for value in node.values():
                visit(value, depth + 1)
        elif isinstance(node, list):
            for item in node:
                visit(item, depth + 1)

    visit(schema, 0)
    return frozenset(found)


def schema_strings(schema: Any) -> frozenset[str]:
    """Every string the schema names as a value (``enum``, ``const``, ``default``, ``examples``)."""
    found: set[str] = set()

    def visit(node: Any, depth: int) -> None:
        if depth > 64:
            return
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in ("enum", "examples") and isinstance(value, list):
                    found.update(v for v in value if isinstance(v, str))
                elif key in ("const", "default") and isinstance(value, str):
                    found.add(value)
                else:
                    visit(value, depth + 1)
        elif isinstance(node, list):
            for item in node:
                visit(item, depth + 1)

    visit(schema, 0)
    return frozenset(found)


def _string_values(value: Any, path: str = "", key: str | None = None) -> Iterator[tuple[str, str, str | None]]:
    if isinstance(value, str):
        yield path or "/", value, key
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _string_values(v, f"{path}/{k}", str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _string_values(v, f"{path}/{i}", key)


def find_placeholders(value: Any, schema: Any = None, names: Iterable[str] = (),
                      quoted: str | None = None) -> list[str]:
    """JSON-pointer paths of the placeholder strings in ``value`` (:class:`PlaceholderPolicy`).

    A string inside an array is judged against the property holding the array."""
    policy = PlaceholderPolicy(schema, names, quoted)
    return [p for p, s, k in _string_values(value) if policy.is_placeholder(s, k)]


def schema_errors(value: Any, schema: Any) -> list[str]:
    """``jsonschema`` errors of ``value`` against ``schema``, as ``"/path: message"`` (empty:
    valid); a schema that cannot be evaluated is one error."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
    except (referencing.exceptions.Unresolvable, jsonschema.SchemaError) as exc:
        return [f"/: schema cannot be evaluated: {exc}"]
    return [f"/{'/'.join(str(p) for p in error.path)}: {error.message}" for error in errors]


def check_arguments(value: Any, schema: Any, names: Iterable[str] = (),
                    quoted: str | None = None) -> list[str]:
    """Problems with a finished value: ``jsonschema`` errors and placeholder paths (empty: fine)."""
    problems = schema_errors(value, schema)
    if problems and problems[0].startswith("/: schema cannot be evaluated"):
        return problems
    problems.extend(f"{p}: placeholder text"
                    for p in find_placeholders(value, schema, names, quoted))
    return problems


