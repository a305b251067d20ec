"""Format hints: the few words of an argument's schema that decide how its value is written.

Contract: ``format_hint(schema, limit)`` returns a one-line hint of at most ``limit`` characters
for one parameter schema (a JSON Schema node), or ``""`` when nothing in it fixes a format.
The compressed IR appends it to the parameter (``timezone: string /* IANA timezone name */``,
``time: string /* 24-hour; HH:MM */``) instead of the whole description, which it drops.

A hint is a ``"; "``-joined list of *atoms*, in this order, each found by a rule that knows no
registry or dataset:

1. schema keywords: ``format`` (``date-time``), ``pattern`` (cut), the first of ``examples``;
2. notations: date/time pictures (``YYYY-MM-DD``, ``HH:MM``), ``24-hour``, ``format: X``,
   units (``in seconds``);
3. named standards with up to two following format nouns: ``IANA timezone name``,
   ``ISO 8601 format``, ``Unix timestamp``, ``hex code``, ``base64``, ``RFC 3339``... (not
   right after a negation, "do not base64-encode it", nor as a file extension, ``ci.yaml``);
4. examples: the items after ``e.g.`` / ``for example`` / ``such as`` / ``for instance``
   that show how a value is written (:func:`shows_a_format`: digits, punctuation, acronyms,
   inner capitals; plain words such as "silk, cotton" say what is meant, not how to write it,
   and are dropped), at most :data:`MAX_EXAMPLES`, each cut to :data:`MAX_ITEM_CHARS`, and
   only when rules 1-3 found nothing: a small model copies a shown example instead of
   converting the request's value (Qwen2.5-Coder-0.5B wrote ``America/New_York`` for "Berlin"
   after ``IANA timezone name; e.g. 'America/New_York'``, and the example timestamp for
   "January 15, 2024"; with ``IANA timezone name`` alone it wrote ``Europe/Paris``);
5. choices: two or more quoted literals in a clause that offers a choice (``one of``,
   ``either``, ``whether``, ``options``, ``possible/allowed/valid values``), as ``'a'|'b'``;
   skipped when the schema has an ``enum`` or ``const`` (the type already lists them);
6. a default stated in the description (``(default: 30)``, ``defaults to 'owner'``) when the
   schema has no ``default`` (the IR renders that one itself); only short literal values.

An atom contained in an earlier one (or in a shown example) is dropped; atoms are added while
they fit ``limit``, and the examples atom gives up items before it is dropped. Descriptions that only say what the
value *is* ("Repository owner") give no hint, so the IR stays as short as before for them.
Pure function of its inputs; never raises on odd schemas (non-string descriptions, lists).

It does not render types or signatures (:mod:`nexus_mlx.tools.ir` does) or validate values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

MAX_EXAMPLES = 2
MAX_ITEM_CHARS = 28
MAX_PATTERN_CHARS = 24
MAX_DEFAULT_CHARS = 16
SEPARATOR = "; "

_PICTURE = re.compile(
    r"(?<![A-Za-z])(?:YYYY|YY|MM|DD|HH|hh|mm|ss|SS)(?:[-:/.T ]?(?:YYYY|YY|MM|DD|HH|hh|mm|ss|SS|Z))+"
    r"(?![A-Za-z])"
)
_HOURS = re.compile(r"\b\d{1,2}-hour\b", re.IGNORECASE)
_FORMAT_COLON = re.compile(r"\bformat:\s*([^\s,;)]+)", re.IGNORECASE)
_UNITS = re.compile(
    r"\b(?:in|as)\s+(?:seconds|milliseconds|microseconds|minutes|hours|days|bytes|kilobytes|"
    r"megabytes|percent(?:age)?|pixels|meters|kilometers|miles|celsius|fahrenheit|cents)"
    r"(?:\s+per\s+[a-z]+)?\b",
    re.IGNORECASE,
)
_STANDARD = re.compile(
    r"(?<![.\w/-])(?:IANA|ISO[ -]?\d{3,5}(?:-\d)?|RFC[ -]?\d{3,4}|Unix|POSIX|epoch|base64|hex(?:adecimal)?|"
    r"SemVer|cron|E\.164|BCP[ -]?47|UUID|URL|URI|JSON|YAML|CSV|markdown|glob|regex|"
    r"regular expression|SHA(?:-?\d+)?|MIME|ASCII|UTF-8|lowercase|uppercase|kebab-case|"
    r"snake_case|camelCase)\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"\b(?:not|no|never|without)\s+$|n't\s+$", re.IGNORECASE)
_FORMAT_NOUNS = frozenset(
    "timezone time zone name format timestamp date datetime string code id identifier "
    "expression syntax pattern encoded encoding duration offset type".split()
)
_EXAMPLE = re.compile(r"\b(?:e\.\s?g\.|for example|for instance|such as|example:)\s*,?\s*",
                      re.IGNORECASE)
_EXAMPLE_END = re.compile(r"\)|\]|;|\.\s|\.$|\n")
_FORMAT_CHAR = re.compile(r"[0-9/:\-_.@#%+=<>\[\]{}()$&*\\|~^]")
_QUOTED = re.compile(r"'([^'\n]{1,40})'|\"([^\"\n]{1,40})\"|`([^`\n]{1,40})`")
_CHOICE = re.compile(
    r"\b(?:one of|either|whether|options? (?:are|is)|possible values|allowed values|"
    r"valid values|accepted values|values are)\b",
    re.IGNORECASE,
)
_DEFAULT = re.compile(
    r"\(default(?:s)?(?: is|:)?\s*([^)]+)\)|\bdefaults? (?:to|is|:)\s*([^.;,)\s]+)",
    re.IGNORECASE,
)
_SHORT_LITERAL = re.compile(r"-?\d+(?:\.\d+)?|true|false|null|'[^']{1,14}'|\"[^\"]{1,14}\"|`[^`]{1,14}`",
                            re.IGNORECASE)
_CLAUSE = re.compile(r"(?<=[.!?])\s+|;\s*|\n+")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)].rstrip() + "…"


def _keyword_atoms(schema: Mapping[str, Any]) -> list[str]:
    atoms = []
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt.strip():
        atoms.append(_one_line(fmt))
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern:
        atoms.append("pattern " + _cut(_one_line(pattern), MAX_PATTERN_CHARS))
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        try:
            first = json.dumps(examples[0], ensure_ascii=False)
        except (TypeError, ValueError):
            first = ""
        if first:
            atoms.append("e.g. " + _cut(_one_line(first), MAX_ITEM_CHARS))
    return atoms


def _notation_atoms(text: str) -> list[str]:
    found: list[tuple[int, str]] = []
    for rx in (_PICTURE, _HOURS, _UNITS):
        found += [(m.start(), m.group(0)) for m in rx.finditer(text)]
    found += [(m.start(), "format " + m.group(1)) for m in _FORMAT_COLON.finditer(text)
              if not _PICTURE.fullmatch(m.group(1))]
    return [atom for _, atom in sorted(found)]


def _standard_atoms(text: str) -> list[str]:
    atoms = []
    for m in _STANDARD.finditer(text):
        if _NEGATION.search(text[max(m.start() - 12, 0):m.start()]):
            continue  # "do not base64-encode it" is no format to follow
        phrase = [m.group(0)]
        for word in text[m.end():].split()[:2]:
            bare = word.strip(",.;:()'\"")
            if bare.lower() not in _FORMAT_NOUNS:
                break
            phrase.append(bare)
            if bare != word:  # punctuation ends the phrase
                break
        atoms.append(" ".join(phrase))
    return atoms


def shows_a_format(item: str) -> bool:
    """Whether an example value shows how values are *written* (digits, punctuation, an
    acronym or inner capitals: ``2024-01-15``, ``'America/New_York'``, ``ci.yaml``, ``MD5``,
    ``PRRT_kwDO``), not just which words are meant (``silk``, ``Pacific Ocean``)."""
    bare = item.strip("'\"`")
    if _FORMAT_CHAR.search(bare):
        return True
    return any((w.isupper() and len(w) >= 2) or any(c.isupper() for c in w[1:])
               for w in bare.split())


def _example_items(text: str) -> list[str]:
    items: list[str] = []
    for m in _EXAMPLE.finditer(text):
        tail = text[m.end():]
        end = _EXAMPLE_END.search(tail)
        body = tail[: end.start()] if end else tail
        for part in re.split(r",\s*|\s+or\s+|\s+and\s+", body):
            part = part.strip(" ,")
            if part and shows_a_format(part) and part not in items:
                items.append(_cut(part, MAX_ITEM_CHARS))
    return items[:MAX_EXAMPLES]


def _choice_atom(text: str) -> str:
    for clause in _CLAUSE.split(text):
        if _CHOICE.search(clause):
            values = [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(clause)]
            values = list(dict.fromkeys(values))
            if len(values) >= 2:
                return "|".join(f"'{v}'" for v in values)
    return ""


def _default_atom(text: str) -> str:
    for m in _DEFAULT.finditer(text):
        value = (m.group(1) or m.group(2) or "").strip()
        first = _SHORT_LITERAL.match(value)
        if first is not None and len(first.group(0)) <= MAX_DEFAULT_CHARS:
            return "default " + first.group(0)
    return ""


def _fit(atoms: list[str], examples: list[str], limit: int) -> str:
    """Join atoms (``"\0examples"`` stands for the examples, which shed items) within ``limit``."""
    out: list[str] = []
    for atom in atoms:
        room = limit - len(SEPARATOR.join(out)) - len(SEPARATOR) * bool(out)
        if atom == "\0examples":
            fitting = [c for c in ("e.g. " + ", ".join(examples[:n])
                                   for n in range(len(examples), 0, -1)) if len(c) <= room]
            if fitting:
                out.append(fitting[0])
            elif not out:
                return _cut("e.g. " + examples[0], limit)
        elif len(atom) <= room:
            out.append(atom)
        elif not out:
            return _cut(atom, limit)
    return SEPARATOR.join(out)


def format_hint(schema: Any, limit: int) -> str:
    """The format hint of one parameter schema, at most ``limit`` characters (module docstring)."""
    if limit <= 0 or not isinstance(schema, Mapping):
        return ""
    raw = schema.get("description")
    text = _one_line(raw) if isinstance(raw, str) else ""
    atoms = _keyword_atoms(schema)
    if text:
        atoms += _notation_atoms(text) + _standard_atoms(text)
    examples = _example_items(text) if text else []
    shown = " ".join(examples).lower()
    kept: list[str] = []
    for atom in atoms:
        low = atom.lower()
        if atom and low not in shown and not any(low in k.lower() for k in kept):
            kept.append(atom)
    if examples and not kept:  # examples only where nothing else names the format
        kept.append("\0examples")
    if text and "enum" not in schema and "const" not in schema:
        choice = _choice_atom(text)
        if choice:
            kept.append(choice)
    if text and "default" not in schema:
        default = _default_atom(text)
        if default:
            kept.append(default)
    return _fit(kept, examples, limit).replace("*/", "* /")
