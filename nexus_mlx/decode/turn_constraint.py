"""The constraint of one assistant turn, applied token by token while the session decodes.

Contract:
- :class:`TurnConstraint` drives a turn under a ``tool_choice``: ``"none"`` (the call opener is
  banned where it is one token), ``"auto"`` (free text; once the model writes the opener, the
  call's JSON is constrained by the schema grammar, llguidance), ``"required"`` or a tool name
  (the turn starts with a forced opener, the JSON constrained to all tools or the named one),
  or ``allowed_tools`` (``"auto"`` or ``"required"`` over a subset; :func:`parse_choice`).
  After a call closes, a turn with ``parallel`` calls may open another (a newline may come
  first) or end, and nothing else; otherwise it must end. A call that repeats an earlier one
  of the turn verbatim (``repeated``) ends the turn too: small models otherwise loop on one
  call until ``max_tokens``. The repeat itself stays in the reply, as written.
- :class:`ResponseConstraint` holds a reply to one JSON value under a ``response_format``'s
  schema, then the end of the turn.
- :class:`CallsOrResponse` is ``tool_choice`` ``"auto"`` with a ``response_format`` (as the
  OpenAI API reads the pair): the turn's first token decides between calls (as ``"required"``
  writes them) and one JSON value under the format. No prose precedes a call there.
- :func:`turn_constraint` picks one from a request's fields (None: free text); a forced
  ``tool_choice`` takes precedence over a ``response_format`` (the turn holds calls alone).
- :func:`parsed_turn` reads a finished reply that may hold calls as its constraint wrote it: a
  reply held to a ``response_format`` is that JSON, never a call written without its tags.

Each has ``allowed()`` (the bool mask ``(V,)`` of the next token, or None when anything goes),
``forced()`` (the ids that must come next, the grammar's fast-forward included, so a decoder
may feed them in one pass without reading a row; empty where the model has a choice),
``restrain(token, logits)`` (the optional-argument restraint: ``optional_margin`` nats, as
``generate_tool_call``'s: a call's arguments take a member past the required ones only where the
model prefers it clearly; 0 turns it off; ``weighs_logits()`` says whether it reads the step's
logits, so a decoder that picks the best id without them knows when it may) and
``accept(token)`` (advance). Expected refusals are
masks, never exceptions; bad requests (an unknown tool name, a forced choice without tools, a
schema that does not compile) raise :class:`~nexus_mlx.errors.ArgumentError` /
:class:`~nexus_mlx.errors.ToolError` when the constraint is built. It does not run the model or
sample (the session does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.decode.call_format import (
    CALL_CLOSE,
    CALL_OPEN,
    ParsedTurn,
    call_schema,
    function_of,
    parse_tool_calls,
)
from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema
from nexus_mlx.decode.name_fsm import token_bytes, vocab_of
from nexus_mlx.decode.restraint import DEFAULT_OPTIONAL_MARGIN, checked_margin, restrained
from nexus_mlx.errors import ArgumentError

MODES = ("none", "auto", "required")  # the tool_choice strings


class TurnConstraint:
    """One assistant turn under a ``tool_choice`` (module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: str | Mapping[str, Any] = "auto",
        *,
        parallel: bool = True,
        eos_ids: Sequence[int] = (),
        optional_margin: float = DEFAULT_OPTIONAL_MARGIN,
    ) -> None:
        self.optional_margin = checked_margin(optional_margin)
        self.vocab = vocab_of(tokenizer)
        choice, allowed = resolve_choice(tool_choice, [function_of(t)["name"] for t in tools])
        if choice not in MODES:
            allowed = [choice]
        if choice != "none" and not tools:
            raise ArgumentError(f"tool_choice {choice!r} needs at least one tool")
        offered = [t for t in tools if function_of(t)["name"] in allowed] if allowed else tools
        self.choice, self.parallel = choice, parallel
        self.eos_ids = tuple(int(i) for i in (eos_ids or self.vocab.eos_ids))
        self._tokenizer = tokenizer
        self._opener = list(tokenizer.encode(CALL_OPEN, add_special_tokens=False))
        self._newline = list(tokenizer.encode("\n", add_special_tokens=False))
        self._closer = self._newline + list(tokenizer.encode(CALL_CLOSE, add_special_tokens=False))
        self._compiled = compile_schema(call_schema(offered)) if offered and choice != "none" else None
        self._json: JsonConstraint | None = None
        self._text = ""  # free text since the last call
        self._forced: list[int] = []
        self._json_next = False  # the JSON starts once the forced ids are written
        self._call_ids: list[int] = []  # the open call's JSON so far
        self._written: set[tuple[int, ...]] = set()  # the JSON of each call this turn
        self.repeated = False  # a call repeated an earlier one verbatim: the turn ends
        self.calls = 0
        if choice not in ("none", "auto"):  # the opener as the template would tokenize it
            self._open_call(list(tokenizer.encode(CALL_OPEN + "\n", add_special_tokens=False)))

    def _open_call(self, forced: list[int]) -> None:
        self._forced, self._json_next = list(forced), True
        if not self._forced:
            self._start_json()

    def _start_json(self) -> None:
        assert self._compiled is not None
        self._json = JsonConstraint(self._compiled, self._tokenizer, guard_placeholders=False)
        self._json_next = False

    # ---- per token ----------------------------------------------------------------------
    def allowed(self) -> np.ndarray | None:
        """The bool mask of the next token, or None where anything goes."""
        if self._forced:
            return self._only(self._forced[0])
        if self._json is not None:
            return self._json.allowed_mask()
        if self.calls and (not self.parallel or self.repeated):
            return self._only(*self.eos_ids)
        if self.calls:  # after a call: another call (the opener, a newline before it) or the end
            return self._only(self._opener[0], *self._newline[:1], *self.eos_ids)
        if self.choice == "none" and len(self._opener) == 1:
            mask = np.ones(self.vocab.size, dtype=bool)
            mask[self._opener[0]] = False
            return mask
        return None

    def forced(self) -> list[int]:
        """The ids that must come next, whatever the model prefers (empty when it has a
        choice): the rest of a call's opener or closer, or what the grammar forces."""
        if self._forced:
            return list(self._forced)
        return self._json.forced_tokens() if self._json is not None else []

    def member_choice(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Where a call's arguments may end or take another member: (ending ids, going-on
        ids), as :meth:`~.json_constraint.JsonConstraint.member_choice`; else None."""
        if self._json is None or self._forced:
            return None
        return self._json.member_choice(depth=2)  # {"name": ..., "arguments": {<here>}}

    def weighs_logits(self) -> bool:
        """Whether :meth:`restrain` reads this step's logits (a member may end the arguments
        or go on, and the restraint is on)."""
        return bool(self.optional_margin) and self.member_choice() is not None

    def restrain(self, token: int, logits: mx.array) -> int:
        """``token``, or the best ending of the call's arguments where ``token`` would add a
        member without the margin (``logits``: the step's row, (V,); read only there)."""
        choice = self.member_choice() if self.optional_margin else None
        if choice is None:
            return token
        row = np.asarray(logits.astype(mx.float32))
        return restrained(token, row, choice, self.optional_margin)

    def accept(self, token: int) -> None:
        """Advance by the sampled ``token`` (one the last mask allowed)."""
        token = int(token)
        if self._forced:
            self._forced.pop(0)
            if not self._forced and self._json_next:
                self._start_json()
            return
        if self._json is not None:
            self._json.accept_token(token)
            self._call_ids.append(token)
            if self._json.is_complete():
                self._json, self._text = None, ""
                self.calls += 1
                self._forced = list(self._closer)
                self.repeated = tuple(self._call_ids) in self._written
                self._written.add(tuple(self._call_ids))
                self._call_ids = []
            return
        if self.calls and token == self._opener[0]:  # the next call's opener: write the rest
            self._open_call(self._opener[1:] + self._newline)
            return
        self._text += self._token_text(token)
        if self._compiled is not None and self._text.endswith(CALL_OPEN):
            self._open_call(self._newline)

    def _token_text(self, token: int) -> str:
        return token_bytes(self._tokenizer, token).decode("utf-8", errors="replace")

    def _only(self, *ids: int) -> np.ndarray:
        mask = np.zeros(self.vocab.size, dtype=bool)
        mask[list(ids)] = True
        return mask


def _function_name(tool: Any) -> Any:
    """``tool``'s ``function.name`` when it is a function tool (else None)."""
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        return None
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, Mapping) else None


def resolve_choice(tool_choice: str | Mapping[str, Any],
                   names: Sequence[str]) -> tuple[str, list[str] | None]:
    """:func:`parse_choice`, with every tool it names checked to be among ``names`` (the
    offered tools; :class:`~nexus_mlx.errors.ArgumentError` otherwise)."""
    choice, allowed = parse_choice(tool_choice)
    strays = [n for n in allowed or ([] if choice in MODES else [choice]) if n not in names]
    if strays:
        raise ArgumentError(f"tool_choice names {', '.join(map(repr, strays))}, which is not "
                            f"among the offered tools {list(names)}")
    return choice, allowed


def parse_choice(tool_choice: str | Mapping[str, Any]) -> tuple[str, list[str] | None]:
    """``(choice, allowed)``: ``"none"`` / ``"auto"`` / ``"required"`` or a tool's name, and the
    names of the tools a call may take (None: any offered one). OpenAI's ``allowed_tools``
    (``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools":
    [{"type": "function", "function": {"name": ...}}, ...]}}``) is its mode over those tools:
    the prompt keeps every tool (and so its cache), the grammar only those."""
    if isinstance(tool_choice, str):
        return tool_choice, None
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "allowed_tools":
        spec = tool_choice.get("allowed_tools")
        mode = spec.get("mode") if isinstance(spec, Mapping) else None
        listed = spec.get("tools") if isinstance(spec, Mapping) else None
        names = [_function_name(t) for t in listed] if isinstance(listed, list) else []
        if mode not in ("auto", "required") or not names or not all(
                isinstance(n, str) for n in names):
            raise ArgumentError("tool_choice allowed_tools needs {'mode': 'auto' | 'required', "
                                "'tools': [{'type': 'function', 'function': {'name': ...}}, ...]}"
                                f", got {tool_choice!r:.120}")
        return str(mode), [str(n) for n in names]
    if isinstance(tool_choice, Mapping) and tool_choice.get("type", "function") == "function":
        fn = tool_choice.get("function")  # {"type": "function", "function": {"name": ...}}
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            return str(fn["name"]), None
    raise ArgumentError(f"tool_choice must be 'none', 'auto', 'required', "
                        f"{{'type': 'function', 'function': {{'name': ...}}}} or allowed_tools, "
                        f"got {tool_choice!r}")


class ResponseConstraint:
    """A reply that is one JSON value under ``schema`` (``response_format``), then the end of
    the turn."""

    def __init__(self, tokenizer: Any, schema: Mapping[str, Any] | bool,
                 eos_ids: Sequence[int] = ()) -> None:
        self.vocab = vocab_of(tokenizer)
        self.eos_ids = tuple(int(i) for i in (eos_ids or self.vocab.eos_ids))
        compiled = compile_schema(schema, closed=False, required_first=False)
        self._json = JsonConstraint(compiled, tokenizer, guard_placeholders=False)

    def allowed(self) -> np.ndarray | None:
        if self._json.is_complete():
            mask = np.zeros(self.vocab.size, dtype=bool)
            mask[list(self.eos_ids)] = True
            return mask
        return self._json.allowed_mask()

    def forced(self) -> list[int]:
        return self._json.forced_tokens()

    def weighs_logits(self) -> bool:
        return False

    def restrain(self, token: int, logits: mx.array) -> int:
        """``token`` unchanged: a ``response_format`` schema's optional fields are the reply's."""
        return token

    def accept(self, token: int) -> None:
        if not self._json.is_complete():
            self._json.accept_token(int(token))


def response_schema(response_format: Mapping[str, Any]) -> Mapping[str, Any] | bool | None:
    """The JSON Schema an OpenAI ``response_format`` asks for (None for plain text)."""
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, (Mapping, bool)):
            raise ArgumentError("response_format json_schema needs {'json_schema': {'schema': ...}}")
        return schema
    raise ArgumentError(f"response_format type {kind!r} is not 'text', 'json_object' or "
                        "'json_schema'")


class CallsOrResponse:
    """Tool calls or a JSON reply, whichever the turn's first token starts (module docstring)."""

    def __init__(self, calls: TurnConstraint, response: ResponseConstraint) -> None:
        self._calls, self._response = calls, response
        self._chosen: TurnConstraint | ResponseConstraint | None = None

    @property
    def calling(self) -> bool:
        """Whether the turn's first token opened a call (False before it is accepted)."""
        return self._chosen is self._calls

    def allowed(self) -> np.ndarray | None:
        if self._chosen is not None:
            return self._chosen.allowed()
        opener, value = self._calls.allowed(), self._response.allowed()
        assert opener is not None and value is not None  # both constrain their first token
        return opener | value

    def forced(self) -> list[int]:
        return [] if self._chosen is None else self._chosen.forced()

    def weighs_logits(self) -> bool:
        return self._chosen is not None and self._chosen.weighs_logits()

    def restrain(self, token: int, logits: mx.array) -> int:
        return token if self._chosen is None else self._chosen.restrain(token, logits)

    def accept(self, token: int) -> None:
        if self._chosen is None:
            opener = self._calls.allowed()
            assert opener is not None
            self._chosen = self._calls if opener[int(token)] else self._response
        self._chosen.accept(token)


def turn_constraint(
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str | Mapping[str, Any],
    parallel: bool,
    response_format: Mapping[str, Any] | None,
    eos_ids: Sequence[int] | set[int] = (),
    optional_margin: float = DEFAULT_OPTIONAL_MARGIN,
) -> TurnConstraint | ResponseConstraint | CallsOrResponse | None:
    """The constraint of one assistant turn (module docstring): None for free text."""
    choice, allowed = parse_choice(tool_choice)
    schema = response_schema(response_format) if response_format else None
    eos = sorted(eos_ids)
    if not tools and choice not in ("none", "auto"):
        raise ArgumentError(f"tool_choice {choice!r} needs tools")
    response = ResponseConstraint(tokenizer, schema, eos) if schema is not None else None
    if not tools or (response is not None and choice == "none"):
        return response

    def calls(choice: str | Mapping[str, Any]) -> TurnConstraint:
        return TurnConstraint(tokenizer, tools, choice, parallel=parallel, eos_ids=eos,
                              optional_margin=optional_margin)

    if response is not None and choice == "auto":
        forced = "required" if allowed is None else {"type": "allowed_tools", "allowed_tools": {
            "mode": "required", "tools": [{"type": "function", "function": {"name": n}}
                                          for n in allowed]}}
        return CallsOrResponse(calls(forced), response)
    return calls(tool_choice)


def parsed_turn(text: str, tools: Sequence[Mapping[str, Any]], constraint: Any,
                ended: bool) -> ParsedTurn:
    """The prose and calls of a reply that may hold calls (module docstring)."""
    if isinstance(constraint, CallsOrResponse):
        return parse_tool_calls(text, ended=ended) if constraint.calling \
            else ParsedTurn(text.strip())
    return parse_tool_calls(text, [function_of(tool)["name"] for tool in tools], ended)
