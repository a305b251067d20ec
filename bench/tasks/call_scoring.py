"""Score one generated tool call against its gold call, as parsed structures (AST-style).

Contract: a gold call is one JSON line ``{"id", "query", "tool", "arguments", "acceptable"}``
(:func:`parse_gold`, :func:`read_gold`). ``arguments`` is the one canonical call (what the query
specifies); ``acceptable`` maps every argument name a right call may carry to the list of
values that count as right, and ``""`` in a list means the argument may also be omitted. A row
without ``acceptable`` gets ``{name: [value]}`` from ``arguments`` (nothing optional).

:func:`score_call` judges a call ``(tool, arguments)`` given the gold tool's ``required`` names:

- the tool must be the gold tool; if it is not, every argument counts as wrong (the arguments
  of another tool are not this call's) and nothing else is examined;
- each argument named in ``acceptable`` is right when it is present and its value matches one
  of the listed values, or absent and ``""`` is listed;
- an argument the call carries that ``acceptable`` does not name is *unknown* (whether or not
  the tool's schema has it: the query asked for no value there), and a ``required`` argument
  the call lacks is *missing*; either makes the call wrong;
- the call is right when the tool, every argument, and the two lists (empty) all are.

Values match (:func:`same_value`) by JSON structure, never by text: numbers by value (``3 ==
3.0``), booleans only with booleans (``True != 1``), ``null`` only with ``null``, strings
exactly after trimming surrounding whitespace (case-sensitive: ``"OPEN" != "open"``, because an
API reads them as written; a gold author lists the spellings that are right), lists element by
element in order (same length; list other orders as other acceptable values when order does not
matter), objects key by key with the same keys. The same rules apply at any depth. A string
``""`` (or blanks) given for an argument whose list holds ``""`` also matches, as it equals the
listed value. ``fold_case=True`` (a diagnostic, never the headline score) also case-folds strings
and collapses inner whitespace: how many calls are wrong only by spelling.

:func:`schema_problems` checks a gold call against its tool's input schema before anything is
scored: every acceptable name is a schema property, every required one is named and cannot be
omitted, the canonical arguments validate, and so does the canonical call with any one argument
swapped for any one of its acceptable values (or dropped, for ``""``).

It does not know how calls are generated, and is pure Python (no MLX, no model; ``jsonschema``
only in :func:`schema_problems`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OMIT = ""
"""In an acceptable-value list: the argument may be left out."""


@dataclass(frozen=True)
class GoldCall:
    """One query with its gold tool, canonical arguments and acceptable values."""

    id: str
    query: str
    tool: str
    arguments: dict[str, Any]
    acceptable: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class CallScore:
    """How one call compares with its gold call (see the module docstring)."""

    tool_right: bool
    arguments: dict[str, bool]  # every name in the gold's acceptable -> right?
    unknown: tuple[str, ...] = ()  # given, but not named in acceptable
    missing_required: tuple[str, ...] = ()  # required by the tool, not given

    @property
    def call_right(self) -> bool:
        return (self.tool_right and all(self.arguments.values()) and not self.unknown
                and not self.missing_required)


def _text(value: str, fold_case: bool) -> str:
    return " ".join(value.split()).casefold() if fold_case else value.strip()


def same_value(gold: Any, got: Any, *, fold_case: bool = False) -> bool:
    """Whether ``got`` equals ``gold`` as a JSON value (the rules of the module docstring)."""
    if isinstance(gold, bool) or isinstance(got, bool):
        return isinstance(gold, bool) and isinstance(got, bool) and gold is got
    if isinstance(gold, int | float) and isinstance(got, int | float):
        return bool(gold == got)
    if isinstance(gold, str) and isinstance(got, str):
        return _text(gold, fold_case) == _text(got, fold_case)
    if isinstance(gold, list) and isinstance(got, list):
        return len(gold) == len(got) and all(
            same_value(a, b, fold_case=fold_case) for a, b in zip(gold, got, strict=True))
    if isinstance(gold, dict) and isinstance(got, dict):
        return gold.keys() == got.keys() and all(
            same_value(gold[k], got[k], fold_case=fold_case) for k in gold)
    if gold is None or got is None:
        return gold is None and got is None
    return False


def argument_right(options: Sequence[Any], present: bool, value: Any = None, *,
                   fold_case: bool = False) -> bool:
    """One argument: absent is right when ``""`` is an option; present, when a value matches."""
    if not present:
        return any(isinstance(o, str) and o == OMIT for o in options)
    return any(same_value(option, value, fold_case=fold_case) for option in options)


def score_call(gold: GoldCall, tool: str, arguments: Mapping[str, Any],
               required: Sequence[str] = (), *, fold_case: bool = False) -> CallScore:
    """Compare the call ``tool(arguments)`` with ``gold``; ``required``: the gold tool's
    required argument names (from its input schema)."""
    if tool != gold.tool:
        return CallScore(False, {name: False for name in gold.acceptable})
    given = dict(arguments) if isinstance(arguments, Mapping) else {}
    right = {name: argument_right(options, name in given, given.get(name), fold_case=fold_case)
             for name, options in gold.acceptable.items()}
    unknown = tuple(name for name in given if name not in gold.acceptable)
    missing = tuple(name for name in required if name not in given)
    return CallScore(True, right, unknown, missing)


def _where(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def parse_gold(row: Mapping[str, Any], where: str = "gold call") -> GoldCall:
    """A :class:`GoldCall` from one decoded JSON line; malformed rows raise :class:`ValueError`
    naming ``where``. Every canonical argument must itself be acceptable (a gold file that
    contradicts itself is a bug in the file)."""
    if not isinstance(row, Mapping):
        raise _where(where, f"expected a JSON object, got {type(row).__name__}")
    for key in ("query", "tool"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise _where(where, f"{key!r} must be a non-empty string, got {row.get(key)!r}")
    arguments = row.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise _where(where, f"'arguments' must be an object, got {arguments!r:.60}")
    raw = row.get("acceptable")
    acceptable = {k: [v] for k, v in arguments.items()} if raw is None else raw
    if not isinstance(acceptable, dict):
        raise _where(where, f"'acceptable' must be an object, got {acceptable!r:.60}")
    for name, options in acceptable.items():
        if not isinstance(options, list) or not options:
            raise _where(where, f"acceptable[{name!r}] must be a non-empty list, got "
                                f"{options!r:.60}")
    for name, value in arguments.items():
        if name not in acceptable or not argument_right(acceptable[name], True, value):
            raise _where(where, f"canonical argument {name}={value!r:.60} is not among its "
                                f"acceptable values {acceptable.get(name)!r:.80}")
    return GoldCall(str(row.get("id") or where), row["query"], row["tool"], dict(arguments),
                    {k: list(v) for k, v in acceptable.items()})


def read_gold(path: str | Path) -> list[GoldCall]:
    """Every gold call of a JSON-lines file (blank lines skipped), in file order."""
    calls = []
    lines = Path(path).read_text("utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if line.strip():
            where = f"{path} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _where(where, f"not valid JSON ({exc})") from None
            calls.append(parse_gold(row, where))
    ids = [c.id for c in calls]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"{path}: duplicate ids {dup[:5]}")
    return calls


def gold_row(call: GoldCall) -> dict[str, Any]:
    """The JSON-lines form of ``call`` (what :func:`parse_gold` reads back)."""
    return {"id": call.id, "query": call.query, "tool": call.tool, "arguments": call.arguments,
            "acceptable": call.acceptable}


def _schema_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"/{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(value)]


def schema_problems(call: GoldCall, schema: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``call`` as gold for a tool with input ``schema`` (empty: nothing)."""
    properties = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    problems = [f"{name!r} is not a parameter of {call.tool}" for name in call.acceptable
                if name not in properties]
    for name in required:
        if name not in call.acceptable:
            problems.append(f"required {name!r} has no acceptable values")
        elif argument_right(call.acceptable[name], False):
            problems.append(f"required {name!r} is marked omittable")
    problems += [f"canonical arguments: {e}" for e in _schema_errors(call.arguments, schema)]
    for name, options in call.acceptable.items():
        for option in options:
            variant = {k: v for k, v in call.arguments.items() if k != name}
            if not (isinstance(option, str) and option == OMIT):
                variant[name] = option
            problems += [f"acceptable {name}={option!r:.40}: {e}"
                         for e in _schema_errors(variant, schema)]
    return problems
