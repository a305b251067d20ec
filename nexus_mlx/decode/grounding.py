"""Grounding of optional call arguments: what the conversation supports, and what was invented.

Small models fill optional arguments with values nobody asked for (``"perPage": 100``,
``"language": "English"``, ``"year": 2021``). Leaving such an argument out lets the API apply
its own default, which is what the user asked for by not naming one.

Contract: :class:`Evidence` indexes a text (the request, or the conversation a call answers);
:meth:`Evidence.supports` judges one JSON value given its property name, and
:func:`ungrounded_optional` returns the top-level arguments a call should drop: those the
schema does not require whose values the evidence does not support. :func:`grounded_arguments`
splits a call's arguments into those kept and those dropped; it drops nothing when dropping
would make valid arguments invalid (``minProperties``, ``dependentRequired``). Only top-level
optional arguments are judged; required ones, nested members and keys never are.

A value is supported when:

- a string: it occurs in the text (case-insensitively, blanks collapsed), or its content words
  do (all of them for a short value, at least half of them past :data:`SHORT_WORDS`, since
  longer values are prose the model composes from the request). A word occurs when the text has
  it, shares its stem (the first ``max(4, len - 3)`` characters: "recursive" ~ "recursively"),
  or, for a number, has the same number (``"03"`` ~ ``3``) or the month of that number
  (``"2016-03-01"`` ~ "March 1, 2016");
- a number: the text has that number (digits, ``50,000`` included, or a number or ordinal word
  up to twenty: "third floor" ~ 3);
- a boolean: the words of its property name occur (``failed_only: true`` ~ "only the failed");
- a list or object: it is non-empty and every element or member value is supported (empty ones
  are fillers);
- ``null``: always (an explicit null may clear a field; it is not a guess);
- and any value equal to the property's schema ``default`` is dropped as well: it means what
  leaving it out means.

It does not generate or parse calls (``tool_call`` and the session drop what this finds).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from nexus_mlx.decode.placeholders import schema_errors

SHORT_WORDS = 3
"""Up to this many content words, a string value needs every one of them in the evidence."""
MIN_STEM = 4
"""Words shorter than this match only whole (no stem matching)."""

_WORD = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|[^\W\d_]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                 "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                 "seventeen", "eighteen", "nineteen", "twenty")
_ORDINALS = ("zeroth", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
             "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth",
             "sixteenth", "seventeenth", "eighteenth", "nineteenth", "twentieth")
_STOPWORDS = frozenset(
    "a an the of to in on at by for from with and or is are be as it its this that".split())


def words(text: str) -> list[str]:
    """Lower-cased words and numbers of ``text`` (letters and digits split apart)."""
    return _WORD.findall(text.casefold())


def _number(word: str) -> float | None:
    """The value of a :func:`words` number (ASCII digits first: "nan" and "inf" are words)."""
    if not ("0" <= word[:1] <= "9"):
        return None
    try:
        return float(word.replace(",", ""))
    except ValueError:  # other digits the word pattern takes ("¹")
        return None


def _stem(word: str) -> str:
    return word[: max(MIN_STEM, len(word) - 3)]


class Evidence:
    """The words, stems, numbers and months of one text, for :meth:`supports`."""

    def __init__(self, text: str) -> None:
        self.flat = " ".join(text.casefold().split())
        self.words = set(words(text))
        self.stems: dict[str, set[str]] = {}  # stems by their first MIN_STEM characters
        for w in self.words:
            if len(w) >= MIN_STEM:
                self.stems.setdefault(w[:MIN_STEM], set()).add(_stem(w))
        self.numbers = {n for n in map(_number, self.words) if n is not None}
        self.numbers |= {float(i) for names in (_NUMBER_WORDS, _ORDINALS)
                         for i, w in enumerate(names) if w in self.words}
        self.months = {float(i + 1) for i, m in enumerate(_MONTHS)
                       if any(m.startswith(w) for w in self.words if len(w) >= 3)}

    def has_word(self, word: str) -> bool:
        """Whether ``word`` (a :func:`words` item) occurs, by itself, its stem or its number."""
        number = _number(word)
        if number is not None:
            return number in self.numbers or number in self.months
        if word in self.words:
            return True
        if len(word) < MIN_STEM:
            return False
        own = _stem(word)
        return any(stem.startswith(own) or own.startswith(stem)
                   for stem in self.stems.get(word[:MIN_STEM], ()))

    def supports_text(self, value: str) -> bool:
        """A string value (module docstring)."""
        flat = " ".join(value.casefold().split())
        if not flat or flat in self.flat:
            return True
        content = [w for w in words(value) if w not in _STOPWORDS] or words(value)
        if not content:
            return False
        found = sum(self.has_word(w) for w in content)
        return found == len(content) if len(content) <= SHORT_WORDS else 2 * found >= len(content)

    def supports(self, value: Any, name: str = "") -> bool:
        """Whether the text supports ``value`` given to property ``name`` (module docstring)."""
        if value is None:
            return True
        if isinstance(value, bool):
            named = words(_CAMEL.sub(" ", name))
            return bool(named) and all(self.has_word(w) for w in named)
        if isinstance(value, int | float):
            return float(value) in self.numbers
        if isinstance(value, str):
            return self.supports_text(value)
        if isinstance(value, list):
            return bool(value) and all(self.supports(v, name) for v in value)
        if isinstance(value, dict):
            return bool(value) and all(self.supports(v, str(k)) for k, v in value.items())
        return False


def _is_default(value: Any, schema: Any) -> bool:
    if not isinstance(schema, Mapping) or "default" not in schema:
        return False
    default = schema["default"]
    return type(default) is type(value) and default == value


def ungrounded_optional(arguments: Mapping[str, Any], schema: Mapping[str, Any],
                        evidence: Evidence | str) -> dict[str, Any]:
    """The top-level arguments not in ``schema``'s ``required`` whose values ``evidence`` does
    not support, or that equal their property's ``default`` (module docstring), in order."""
    if isinstance(evidence, str):
        evidence = Evidence(evidence)
    required = set(schema.get("required") or ()) if isinstance(schema, Mapping) else set()
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    properties = properties if isinstance(properties, Mapping) else {}
    return {name: value for name, value in arguments.items() if name not in required and (
        _is_default(value, properties.get(name)) or not evidence.supports(value, name))}


def grounded_arguments(arguments: dict[str, Any], schema: Mapping[str, Any],
                       evidence: Evidence | str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``arguments`` without the optional ones ``evidence`` does not support, those dropped);
    nothing is dropped when dropping would make valid arguments invalid."""
    dropped = ungrounded_optional(arguments, schema, evidence)
    if not dropped:
        return arguments, {}
    kept = {k: v for k, v in arguments.items() if k not in dropped}
    if schema_errors(kept, schema) and not schema_errors(arguments, schema):
        return arguments, {}
    return kept, dropped
