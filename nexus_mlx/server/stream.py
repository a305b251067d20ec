"""One assistant turn's growing text turned into OpenAI message deltas (for streaming, and for
the whole reply at once, so both answers agree).

Contract: ``ReplyAssembler(calls=..., stop=...)``; ``feed(text)`` takes the whole text generated
so far (each call a longer text) and returns the deltas it makes safe to send;
``finish(text, ended)`` takes the final text (the reply's, already cut at a stop string;
``ended``: the model ended the turn itself rather than hitting the limit) and returns the rest.
Afterwards ``content`` and ``tool_calls`` hold the assembled message. Deltas are
``{"content": piece}``, ``{"tool_calls": [{"index", "id", "type", "function": {"name",
"arguments": ""}}]}`` when a call's name is complete, then ``{"tool_calls": [{"index",
"function": {"arguments": fragment}}]}`` as the arguments are written.

The text's reading is the session's (:func:`~nexus_mlx.decode.call_format.parse_tool_calls`):
a call runs from ``<tool_call>`` to the first ``</tool_call>`` (or the end); the content is the
text outside calls, stripped, without a trailing start of an opener unless the turn ``ended``
there (else a call cut short), and a stop string ends it only outside calls. So whitespace at either end of the content is held back
until text follows it, as is a tail that may begin a stop string or a call opener, and a
trailing U+FFFD run (a character whose bytes are not all generated yet). A call's arguments are
streamed as their raw JSON text (the constrained grammar writes ``{"name": ..., "arguments":
{...}}`` in that order); a call written otherwise is parsed whole when it closes. Without
``calls`` (no tools, or ``tool_choice`` "none") every character is content, whitespace at its
ends included, exactly as generated (as the OpenAI API and mlx_lm.server return it).

Limits: a text that rewrites what it already showed (a tokenizer that cleans up spaces across
tokens) cannot take back sent deltas; the assembler goes on from where it was. It knows nothing
about models, sessions or HTTP.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nexus_mlx.decode.call_format import (
    CALL_ARGUMENTS,
    CALL_CLOSE,
    CALL_NAME,
    CALL_OPEN,
    cut_at_stop,
    partial_suffix,
)

_NAME = re.compile(CALL_NAME, re.S)
_ARGS = re.compile(CALL_ARGUMENTS + r"(?=\S)", re.S)
Delta = dict[str, Any]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class AssembledCall:
    id: str
    name: str
    arguments: str = ""  # the raw JSON text of the arguments (what was streamed)


class _ValueEnd:
    """Finds where one JSON value ends, reading it a piece at a time."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escape, self.started = 0, False, False, False
        self.done = False

    def scan(self, text: str, start: int, stop: int) -> int:
        """Read ``text[start:stop]``; the index just past the value's end, or ``stop``."""
        for i in range(start, stop):
            c = text[i]
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.done = True
                        return i + 1
                continue
            if not self.started:
                self.started = True
                if c in "{[":
                    self.depth = 1
                elif c == '"':
                    self.in_string = True
                continue
            if self.depth == 0:  # a bare number / literal: ends at a delimiter
                if c in ",}] \n\t\r":
                    self.done = True
                    return i
                continue
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return stop


class ReplyAssembler:
    """See the module docstring."""

    def __init__(self, *, calls: bool, stop: Sequence[str] = (),
                 new_id: Callable[[], str] = new_call_id) -> None:
        self.calls_enabled, self.stop, self._new_id = calls, tuple(s for s in stop if s), new_id
        self.content = ""
        self.tool_calls: list[AssembledCall] = []
        self._pos = 0  # characters of the text consumed
        self._pending_ws = ""  # whitespace held back at the content's end
        self._in_call = False
        self._call_start = 0  # where the open call's body starts
        self._call: AssembledCall | None = None  # the open call, once its name is known
        self._args_start: int | None = None
        self._args_sent = 0  # index up to which the arguments were sent
        self._value = _ValueEnd()
        self._ended = False  # the model ended the turn itself (finish's argument)

    def feed(self, text: str) -> list[Delta]:
        return self._advance(text, final=False)

    def finish(self, text: str, ended: bool = False) -> list[Delta]:
        self._ended = ended
        deltas = self._advance(text, final=True)
        if self._in_call:
            deltas += self._close_call(text, len(text))
        self._pending_ws = ""
        return deltas

    # ---- reading ------------------------------------------------------------------------
    def _limit(self, text: str, final: bool) -> int:
        if final:
            return len(text)
        hold = max([partial_suffix(text, s) for s in self.stop] + [0])
        unfinished = len(text) - len(text.rstrip("\ufffd"))  # bytes of a character to come
        return len(text) - max(hold, unfinished)

    def _advance(self, text: str, final: bool) -> list[Delta]:
        text = cut_at_stop(text, self.stop, self.calls_enabled)
        limit = self._limit(text, final)
        deltas: list[Delta] = []
        while self._pos < limit:
            if self._in_call:
                close = text.find(CALL_CLOSE, self._call_start, limit)
                end = close if close >= 0 else limit
                deltas += self._call_progress(text, end)
                if close < 0:
                    self._pos = limit
                    break
                deltas += self._close_call(text, close)
                self._pos = close + len(CALL_CLOSE)
                continue
            start = text.find(CALL_OPEN, self._pos, limit) if self.calls_enabled else -1
            if start >= 0:
                deltas += self._prose(text[self._pos:start])
                self._open_call(start + len(CALL_OPEN))
                continue
            end = limit
            if self.calls_enabled and not (final and self._ended):  # an opener's start:
                end -= partial_suffix(text[self._pos:limit], CALL_OPEN)  # held, dropped if cut
            deltas += self._prose(text[self._pos:end])
            self._pos = end
            break
        return deltas

    def _prose(self, piece: str) -> list[Delta]:
        if not self.calls_enabled:  # every character is content, as generated
            self.content += piece
            return [{"content": piece}] if piece else []
        text = self._pending_ws + piece
        if not self.content:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._pending_ws = text
            return []
        self._pending_ws = text[len(body):]
        self.content += body
        return [{"content": body}]

    # ---- calls --------------------------------------------------------------------------
    def _open_call(self, body_start: int) -> None:
        self._in_call, self._call_start, self._pos = True, body_start, body_start
        self._call, self._args_start, self._value = None, None, _ValueEnd()

    def _header(self, call: AssembledCall) -> Delta:
        self.tool_calls.append(call)
        return {"tool_calls": [{"index": len(self.tool_calls) - 1, "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""}}]}

    def _arguments(self, fragment: str) -> Delta:
        assert self._call is not None
        self._call.arguments += fragment
        return {"tool_calls": [{"index": len(self.tool_calls) - 1,
                                "function": {"arguments": fragment}}]}

    def _call_progress(self, text: str, end: int) -> list[Delta]:
        deltas: list[Delta] = []
        if self._call is None:
            match = _NAME.match(text, self._call_start, end)
            if match is None:
                return deltas
            try:
                name = json.loads(f'"{match.group(1)}"')
            except ValueError:
                return deltas
            self._call = AssembledCall(self._new_id(), name)
            deltas.append(self._header(self._call))
            self._args_sent = match.end()
        if self._args_start is None:
            match = _ARGS.match(text, self._args_sent, end)
            if match is None:
                return deltas
            self._args_start = self._args_sent = match.end()
        if not self._value.done:
            upto = self._value.scan(text, self._args_sent, end)
            if upto > self._args_sent:
                deltas.append(self._arguments(text[self._args_sent:upto]))
                self._args_sent = upto
        return deltas

    def _close_call(self, text: str, end: int) -> list[Delta]:
        """The call's body ends at ``end``: parse it whole where streaming could not read it."""
        deltas = self._call_progress(text, end)
        self._in_call = False
        if self._call is not None and self._args_start is not None:
            return deltas
        try:
            value = json.loads(text[self._call_start:end].strip())
        except ValueError:
            return deltas  # an unparsable call: dropped, as the session's parser does
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return deltas
        if self._call is None:
            self._call = AssembledCall(self._new_id(), value["name"])
            deltas.append(self._header(self._call))
        arguments = value.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        deltas.append(self._arguments(arguments))
        return deltas
