"""Semantic units over the suffix tokens (paper 2): the pieces SUR admits whole.

Contract: ``semantic_units(tokenizer, ids) -> Units`` (or ``units_from_text(text, spans)`` when
the text and token spans of :func:`nexus_mlx.models.tokenizer.token_char_spans` are at hand)
returns half-open token ranges that partition ``[0, len(ids))`` exactly, in order, each with the
id of the container it lies in. Deterministic: the same ids always give the same units.

How the text is cut (boundaries, outermost first):

1. Messages: a boundary before every chat-template turn marker (:data:`MESSAGE_MARKERS`); the
   end-of-turn marker stays with the message it closes. Each message's prose is one container.
2. Structured containers inside a message, each its own container, recognised line by line:
   fenced code blocks (a line opening with ```` ``` ```` or ``~~~`` up to the matching fence, or
   the message's end), JSON values starting a line (``{`` / ``[`` up to the matching bracket,
   string-aware, and ``json.loads``-valid; unclosed ones count when they look like JSON), and
   lists (runs of ``-``/``*``/``+``/``1.`` items; an item keeps its indented continuation lines).
   Code blocks are cut at blank lines; JSON values between their members, at every comma of
   the shallowest nesting depth that has one; lists between items.
3. Prose: paragraphs (blank lines), markdown heading lines, and sentences (``.``/``!``/``?``
   then whitespace before anything but a lowercase ASCII letter; ``。！？``).
   Trailing whitespace stays with the unit it follows.

Text segments become token units by each token's character-span midpoint (a token belongs to
the segment holding ``(start + end) / 2``; an empty span by its start). Then units shorter than
:data:`MIN_UNIT` tokens are merged into their shorter neighbour in the same container (ties: the
preceding one; left to right, a merged unit is looked at again); a short unit with no neighbour in
its container stays as it is. Last, units longer than :data:`MAX_UNIT` tokens are split into
``ceil(n / MAX_UNIT)`` balanced chunks (sizes differ by at most one, larger first).

The seam: a suffix that starts mid-sentence makes its first unit that sentence's tail; one that
starts inside a code block or a JSON value is read as prose (its closing fence opens a block
that runs to the message's end; unbalanced closers are plain text) — still a valid partition.
It does not know token relevance (``repair.relevance``) or budgets (``repair.allocators``).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nexus_mlx.models.tokenizer import token_char_spans

MIN_UNIT = 8
MAX_UNIT = 128
MESSAGE_MARKERS = (
    "<|im_start|>", "<start_of_turn>", "<|start_header_id|>", "<|user|>", "<|assistant|>",
    "<|system|>", "[INST]",
)
_MARKER = re.compile("|".join(re.escape(m) for m in MESSAGE_MARKERS))
_FENCE = re.compile(r"[ \t]*(```|~~~)")
_LIST_ITEM = re.compile(r"[ \t]*(?:[-*+\u2022]|\d{1,3}[.)])[ \t]+\S")
_HEADING = re.compile(r"[ \t]*#{1,6}[ \t]")
_BLANK_RUN = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"')\]]*\s+(?=[^\sa-z])|[\u3002\uff01\uff1f]+\s*(?=\S)")
_JSON_LOOKS = re.compile(r"[\[{]\s*[\"\[{]")
_CLOSER = {"{": "}", "[": "]"}


@dataclass(frozen=True)
class Units:
    """Half-open token ranges partitioning the suffix, and a container id per range."""

    ranges: list[tuple[int, int]]
    containers: list[int]

    def __len__(self) -> int:
        return len(self.ranges)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.ranges)

    def lengths(self) -> np.ndarray:
        """Tokens per unit, ``(U,)``."""
        return np.array([b - a for a, b in self.ranges], dtype=np.int64)


def is_partition(ranges: list[tuple[int, int]], n: int) -> bool:
    """Whether non-empty ``ranges`` tile ``[0, n)`` in order."""
    edge = 0
    for a, b in ranges:
        if a != edge or b <= a:
            return False
        edge = b
    return edge == n


# ----------------------------------------------------------------------------- text segments

Segment = tuple[int, int]  # (first character, container id)


def _lines(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """``[a, b)`` as lines ``(start, end)``, each keeping its newline."""
    out, start = [], a
    while start < b:
        nl = text.find("\n", start, b)
        end = b if nl < 0 else nl + 1
        out.append((start, end))
        start = end
    return out


def _cuts(pattern: re.Pattern[str], text: str, a: int, b: int) -> list[int]:
    """Positions inside ``(a, b)`` where ``pattern``'s matches end."""
    return [m.end() for m in pattern.finditer(text, a, b) if a < m.end() < b]


def _prose(text: str, a: int, b: int, container: int) -> list[Segment]:
    """Paragraphs, heading lines and sentences of ``[a, b)``."""
    cuts = set(_cuts(_BLANK_RUN, text, a, b)) | set(_cuts(_SENTENCE_END, text, a, b))
    for s, e in _lines(text, a, b):
        if _HEADING.match(text, s, e):
            cuts.update(x for x in (s, e) if a < x < b)
    return [(x, container) for x in sorted({a} | cuts)]


def _skip_space(text: str, x: int, b: int) -> int:
    """The first non-whitespace position at or after ``x`` (``b`` if none)."""
    while x < b and text[x].isspace():
        x += 1
    return x


def _bracket_scan(text: str, i: int, limit: int) -> tuple[int, bool, list[int]] | None:
    """Scan the bracketed value opening at ``i`` (string-aware): ``(end, closed, cuts)`` with
    ``cuts`` just after every comma of the shallowest depth that has one; ``end`` is ``limit``
    when it never closes. None when a bracket closes the wrong opener."""
    stack: list[str] = []
    commas: dict[int, list[int]] = {}
    in_string = escaped = False
    for k in range(i, limit):
        c = text[k]
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in _CLOSER:
            stack.append(_CLOSER[c])
        elif c in "}]":
            if stack.pop() != c:
                return None
            if not stack:
                return k + 1, True, _shallowest(commas)
        elif c == ",":
            commas.setdefault(len(stack), []).append(k + 1)
    return limit, False, _shallowest(commas)


def _shallowest(commas: dict[int, list[int]]) -> list[int]:
    return commas[min(commas)] if commas else []


def _json_value(text: str, s: int, e: int, b: int) -> tuple[int, list[int]] | None:
    """The JSON value starting the line ``[s, e)`` of a message ending at ``b``: (end of the
    line it ends on, member cuts). A closed value must parse and end its line (a trailing comma
    allowed); an unclosed one must open like JSON (``{"``, ``[{``, ``["``, ``[[``)."""
    i = _skip_space(text, s, e)
    if i >= e or text[i] not in _CLOSER:
        return None
    scanned = _bracket_scan(text, i, b)
    if scanned is None:
        return None
    end, closed, cuts = scanned
    nl = text.find("\n", end, b)
    line_end = b if nl < 0 else nl + 1
    if closed:
        if text[end:line_end].strip() not in ("", ","):
            return None
        try:
            json.loads(text[i:end])
        except ValueError:
            return None
    elif not _JSON_LOOKS.match(text, i):
        return None
    return line_end, cuts


def _fence_end(text: str, lines: list[tuple[int, int]], k: int) -> int:
    """Index of the line closing the fence opened on line ``k`` (the last line if none)."""
    fence = _FENCE.match(text, *lines[k])
    assert fence is not None
    for j in range(k + 1, len(lines)):
        close = _FENCE.match(text, *lines[j])
        if close and close.group(1) == fence.group(1):
            return j
    return len(lines) - 1


def _list_end(text: str, lines: list[tuple[int, int]], k: int) -> tuple[int, list[int]]:
    """(index after the list that starts on line ``k``, the first character of each item)."""
    items, j = [lines[k][0]], k + 1
    while j < len(lines):
        s, e = lines[j]
        line = text[s:e]
        if _LIST_ITEM.match(line):
            items.append(s)
        elif not line.strip():
            nxt = next((t for t in range(j, len(lines)) if text[slice(*lines[t])].strip()), None)
            if nxt is None or not _LIST_ITEM.match(text, *lines[nxt]):
                return j + 1, items  # the blank line closes the list
        elif not line[:1].isspace():
            return j, items  # an unindented line after the last item
        j += 1
    return j, items


def _message(text: str, a: int, b: int, ids: Iterator[int]) -> list[Segment]:
    """Segments of one message ``[a, b)``: prose, code blocks, JSON values, lists."""
    prose, out = next(ids), []
    lines = _lines(text, a, b)
    run = a  # start of the pending prose run

    def flush(upto: int) -> None:
        if run < upto:
            out.extend(_prose(text, run, upto, prose))

    k = 0
    while k < len(lines):
        s, e = lines[k]
        if _FENCE.match(text, s, e):
            j = _fence_end(text, lines, k)
            flush(s)
            box, stop = next(ids), lines[j][1]
            out += [(x, box) for x in [s, *_cuts(_BLANK_RUN, text, s, stop)]]
            k, run = j + 1, stop
        elif (found := _json_value(text, s, e, b)) is not None:
            stop, commas = found
            flush(s)
            box = next(ids)
            out += [(x, box) for x in sorted({s} | {_skip_space(text, c, stop) for c in commas} - {stop})]
            k, run = next((t for t in range(k + 1, len(lines)) if lines[t][0] >= stop), len(lines)), stop
        elif _LIST_ITEM.match(text, s, e):
            j, items = _list_end(text, lines, k)
            flush(s)
            box = next(ids)
            out += [(x, box) for x in items]
            k = j
            run = lines[j][0] if j < len(lines) else b
        else:
            k += 1
    flush(b)
    return out


def text_segments(text: str) -> list[Segment]:
    """``(first character, container id)`` of every segment, in order; the first starts at 0."""
    if not text:
        return []
    starts = sorted({0} | {m.start() for m in _MARKER.finditer(text)})
    ids = itertools.count()
    out: list[Segment] = []
    for a, b in zip(starts, [*starts[1:], len(text)], strict=True):
        out += _message(text, a, b, ids)
    return out


# ----------------------------------------------------------------------------- token units


def segments_to_tokens(
    spans: np.ndarray, segments: list[Segment]
) -> tuple[list[tuple[int, int]], list[int]]:
    """Token ranges and containers of text segments: each token joins the segment holding its
    span's midpoint (spans ``(n, 2)``, non-decreasing); segments left without tokens vanish."""
    n = len(spans)
    twice_mid = spans[:, 0] + spans[:, 1]  # (n,) non-decreasing
    firsts = np.searchsorted(twice_mid, 2 * np.array([x for x, _ in segments]), side="left")
    ranges, containers = [], []
    for u, (a, b) in enumerate(zip(firsts, [*firsts[1:], n], strict=True)):
        if b > a:
            ranges.append((int(a), int(b)))
            containers.append(segments[u][1])
    return ranges, containers


def merge_short(
    ranges: list[tuple[int, int]], containers: list[int], min_len: int = MIN_UNIT
) -> tuple[list[tuple[int, int]], list[int]]:
    """Merge each unit under ``min_len`` tokens into its shorter same-container neighbour."""
    r, c = list(ranges), list(containers)
    i = 0
    while i < len(r):
        size = r[i][1] - r[i][0]
        prev_ok = i > 0 and c[i - 1] == c[i]
        next_ok = i + 1 < len(r) and c[i + 1] == c[i]
        if size >= min_len or not (prev_ok or next_ok):
            i += 1
            continue
        prev_len = r[i - 1][1] - r[i - 1][0] if prev_ok else math.inf
        next_len = r[i + 1][1] - r[i + 1][0] if next_ok else math.inf
        lo = i - 1 if prev_len <= next_len else i
        r[lo : lo + 2] = [(r[lo][0], r[lo + 1][1])]
        del c[lo + 1]
        i = lo
    return r, c


def split_long(
    ranges: list[tuple[int, int]], containers: list[int], max_len: int = MAX_UNIT
) -> tuple[list[tuple[int, int]], list[int]]:
    """Split each unit over ``max_len`` tokens into balanced chunks (larger ones first)."""
    r, c = [], []
    for (a, b), box in zip(ranges, containers, strict=True):
        parts = max(1, math.ceil((b - a) / max_len))
        base, extra = divmod(b - a, parts)
        for p in range(parts):
            stop = a + base + (p < extra)
            r.append((a, stop))
            c.append(box)
            a = stop
    return r, c


def units_from_text(text: str, spans: np.ndarray) -> Units:
    """Units of tokens whose decoded ``text`` and character ``spans`` ``(n, 2)`` are given."""
    n = len(spans)
    if n == 0:
        return Units([], [])
    segments = text_segments(text) or [(0, 0)]
    ranges, containers = split_long(*merge_short(*segments_to_tokens(np.asarray(spans), segments)))
    assert is_partition(ranges, n), "semantic units must partition the suffix"
    return Units(ranges, containers)


def semantic_units(tokenizer: Any, ids: Sequence[int] | np.ndarray) -> Units:
    """Semantic units of the token ids ``(n,)`` as the tokenizer spells them."""
    text, spans = token_char_spans(tokenizer, ids)
    return units_from_text(text, spans)
