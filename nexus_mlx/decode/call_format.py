"""Tool calls in the model's own chat format, constrained while they are generated.

The format is Hermes / Qwen 2.5's (what their chat templates render and teach)::

    <tool_call>
    {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}
    </tool_call>

Contract:
- :func:`call_schema` is the JSON Schema of one call over the offered tools: one alternative per
  tool, ``name`` a constant and ``arguments`` that tool's input schema.
- :class:`TurnConstraint` drives one assistant turn under a ``tool_choice``: ``"none"`` (the
  call opener is banned where it is one token), ``"auto"`` (free text; once the model writes the
  opener, the call's JSON is constrained by the schema grammar, llguidance), ``"required"`` or a
  tool name (the turn starts with a forced opener, the JSON constrained to all tools or the named
  one). After a call closes, a turn with ``parallel`` calls may open another (a newline may come
  first) or end, and nothing else; otherwise it must end. ``allowed()`` returns the bool mask
  ``(V,)`` for the next token, or None when unconstrained; ``restrain(token, logits)`` applies
  the optional-argument restraint (``optional_margin`` nats, as ``generate_tool_call``'s: a
  call's arguments take a member past the required ones only where the model prefers it
  clearly; 0 turns it off); ``accept(token)`` advances. Expected refusals are masks, never
  exceptions.
- :func:`parse_tool_calls` splits a finished turn's text into its prose and its calls;
  :func:`checked_calls` keeps the calls that validate; :func:`grounded_calls` drops the optional
  arguments the conversation does not support (:mod:`~nexus_mlx.decode.grounding`).
- :func:`without_calls` is a reply's text with its calls in the format taken out (what
  :mod:`~nexus_mlx.decode.prose_calls` reads for calls written as prose).
- :func:`tools_system_prompt` renders tools for a chat template that ignores them, teaching the
  same format.

It does not run the model or sample (the session does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.decode.grounding import Evidence, grounded_arguments
from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema
from nexus_mlx.decode.name_fsm import vocab_of
from nexus_mlx.decode.placeholders import schema_errors
from nexus_mlx.decode.restraint import DEFAULT_OPTIONAL_MARGIN, checked_margin, restrained
from nexus_mlx.errors import ArgumentError, ToolError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]
    dropped: dict[str, Any] = field(default_factory=dict)  # see grounded_calls


@dataclass
class ParsedTurn:
    content: str  # the prose outside the calls, stripped
    calls: list[ParsedCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # calls that did not parse


def function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The function definition of an OpenAI-style tool (``{"type": "function", "function":
    {...}}``) or of a bare ``{"name", "parameters"}`` definition."""
    fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolError(f"a tool needs a function with a non-empty name, got {tool!r:.80}")
    return fn


def call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """JSON Schema of one call to any of ``tools``."""
    if not tools:
        raise ToolError("a tool call needs at least one tool")
    options = []
    for tool in tools:
        fn = function_of(tool)
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object",
                        "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"]})
    return options[0] if len(options) == 1 else {"anyOf": options}


_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.S)


def _bare_calls(text: str, names: Sequence[str]) -> list[ParsedCall]:
    """Calls written without the tags, as small models often do: the whole reply, or each
    fenced block of it, one JSON object ``{"name": <an offered tool>, "arguments": {...}}``."""
    found = []
    for piece in _FENCE.findall(text) or [text.strip()]:
        try:
            value = json.loads(piece)
        except ValueError:
            continue
        if (isinstance(value, dict) and value.get("name") in names
                and isinstance(value.get("arguments", {}), dict)):
            found.append(ParsedCall(value["name"], dict(value.get("arguments", {}))))
    return found


def without_calls(text: str) -> str:
    """``text`` with every call in the format (tags and contents) taken out, unstripped."""
    return _CALL.sub("", text)


def parse_tool_calls(text: str, names: Sequence[str] = ()) -> ParsedTurn:
    """The prose and the calls of a finished turn (a call without its closer still counts).
    With ``names`` (the offered tools), a reply without tags that is, or fences, exactly one
    JSON call to one of them counts as that call too."""
    if names and CALL_OPEN not in text:
        bare = _bare_calls(text, names)
        if bare:
            return ParsedTurn(_FENCE.sub("", text).strip() if _FENCE.search(text) else "", bare)
    calls, errors = [], []
    for match in _CALL.finditer(text):
        try:
            value = json.loads(match.group(1))
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                raise ValueError("not an object with a string 'name'")
            arguments = value.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                arguments = json.loads(arguments)
            if not isinstance(arguments, dict):
                raise ValueError("'arguments' is not an object")
            calls.append(ParsedCall(value["name"], arguments))
        except ValueError as exc:
            errors.append(f"{match.group(1)[:80]!r}: {exc}")
    return ParsedTurn(without_calls(text).strip(), calls, errors)


def parameter_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{tool name: its parameters' JSON schema ({} when it has none)}."""
    return {function_of(t)["name"]: function_of(t).get("parameters") or {} for t in tools}


def checked_calls(turn: ParsedTurn, tools: Sequence[Mapping[str, Any]]) -> ParsedTurn:
    """``turn`` with every call checked against its tool's schema (``jsonschema``): calls to
    tools not offered, or whose arguments do not validate, move to ``errors``."""
    schemas = parameter_schemas(tools)
    good, errors = [], list(turn.errors)
    for call in turn.calls:
        if call.name not in schemas:
            errors.append(f"{call.name!r} is not an offered tool")
            continue
        problems = schema_errors(call.arguments, schemas[call.name])
        if problems:
            errors.append(f"{call.name}: arguments at {problems[0]}")
        else:
            good.append(call)
    return ParsedTurn(turn.content, good, errors)


def grounded_calls(turn: ParsedTurn, tools: Sequence[Mapping[str, Any]],
                   evidence: str) -> ParsedTurn:
    """``turn`` with each call's optional arguments that ``evidence`` (the conversation's text)
    does not support dropped and kept in the call's ``dropped``
    (:func:`~nexus_mlx.decode.grounding.grounded_arguments`). Calls must be checked first."""
    schemas = parameter_schemas(tools)
    index = Evidence(evidence)
    calls = []
    for call in turn.calls:
        kept, dropped = grounded_arguments(call.arguments, schemas.get(call.name) or {}, index)
        calls.append(ParsedCall(call.name, kept, dropped))
    return ParsedTurn(turn.content, calls, list(turn.errors))


def tools_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """Instructions that show ``tools`` and the call format to a model whose template does not."""
    lines = "\n".join(json.dumps({"type": "function", "function": dict(function_of(t))})
                      for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\nFor each function call, return a json object with "
            f"function name and arguments within {CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_OPEN}\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n' + CALL_CLOSE)


class TurnConstraint:
    """The state of one assistant turn under a ``tool_choice`` (see the module docstring)."""

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
        names = [function_of(t)["name"] for t in tools]
        choice = _choice_name(tool_choice)
        if choice not in ("none", "auto", "required") and choice not in names:
            raise ArgumentError(f"tool_choice names {choice!r}, which is not among the offered "
                                f"tools {names}")
        if choice != "none" and not tools:
            raise ArgumentError(f"tool_choice {choice!r} needs at least one tool")
        offered = [t for t in tools if function_of(t)["name"] == choice] if choice in names else tools
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
        if self.calls and not self.parallel:
            return self._only(*self.eos_ids)
        if self.calls:  # after a call: another call (the opener, a newline before it) or the end
            return self._only(self._opener[0], *self._newline[:1], *self.eos_ids)
        if self.choice == "none" and len(self._opener) == 1:
            mask = np.ones(self.vocab.size, dtype=bool)
            mask[self._opener[0]] = False
            return mask
        return None

    def member_choice(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Where a call's arguments may end or take another member: (ending ids, going-on
        ids), as :meth:`~.json_constraint.JsonConstraint.member_choice`; else None."""
        if self._json is None or self._forced:
            return None
        return self._json.member_choice(depth=2)  # {"name": ..., "arguments": {<here>}}

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
            if self._json.is_complete():
                self._json, self._text = None, ""
                self.calls += 1
                self._forced = list(self._closer)
            return
        if self.calls and token == self._opener[0]:  # the next call's opener: write the rest
            self._open_call(self._opener[1:] + self._newline)
            return
        self._text += self._token_text(token)
        if self._compiled is not None and self._text.endswith(CALL_OPEN):
            self._open_call(self._newline)

    def _token_text(self, token: int) -> str:
        if token in self.vocab.special_ids or not self.vocab.token_bytes[token]:
            return str(self._tokenizer.decode([token]))
        return self.vocab.token_bytes[token].decode("utf-8", errors="replace")

    def _only(self, *ids: int) -> np.ndarray:
        mask = np.zeros(self.vocab.size, dtype=bool)
        mask[list(ids)] = True
        return mask


def _choice_name(tool_choice: str | Mapping[str, Any]) -> str:
    if isinstance(tool_choice, str):
        return tool_choice
    if isinstance(tool_choice, Mapping):  # {"type": "function", "function": {"name": ...}}
        fn = tool_choice.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            return str(fn["name"])
    raise ArgumentError(f"tool_choice must be 'none', 'auto', 'required' or "
                        f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}")


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


def turn_constraint(
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str | Mapping[str, Any],
    parallel: bool,
    response_format: Mapping[str, Any] | None,
    eos_ids: Sequence[int] | set[int] = (),
    optional_margin: float = DEFAULT_OPTIONAL_MARGIN,
) -> TurnConstraint | ResponseConstraint | None:
    """The constraint of one assistant turn: a JSON reply, a tool-call turn, or None (free)."""
    schema = response_schema(response_format) if response_format else None
    eos = sorted(eos_ids)
    if schema is not None:
        if tools and _choice_name(tool_choice) not in ("none", "auto"):
            raise ArgumentError("a turn cannot both force a tool call and a response_format")
        return ResponseConstraint(tokenizer, schema, eos)
    if not tools:
        if _choice_name(tool_choice) not in ("none", "auto"):
            raise ArgumentError(f"tool_choice {_choice_name(tool_choice)!r} needs tools")
        return None
    return TurnConstraint(tokenizer, tools, tool_choice, parallel=parallel, eos_ids=eos,
                          optional_margin=optional_margin)


def normalized_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of chat messages as templates expect them: ``content`` a string, and tool-call
    ``arguments`` objects (the OpenAI API sends them as JSON strings)."""
    out = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ArgumentError(f"a message needs a string 'role', got {message!r:.80}")
        m = dict(message)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [_normalized_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _normalized_call(call: Any) -> dict[str, Any]:
    fn = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ArgumentError(f"an assistant tool call needs a function name, got {call!r:.80}")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise ArgumentError(f"tool call {fn['name']!r} has arguments that are not JSON: "
                                f"{exc}") from None
    return {**dict(call), "type": "function", "function": {"name": fn["name"],
                                                            "arguments": arguments}}


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows tools (probed with one named tool)."""
    probe = {"type": "function", "function": {"name": "nexus_probe_tool_name", "parameters": {}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[probe],
                                             add_generation_prompt=True, tokenize=False)
    except Exception:
        return False
    return "nexus_probe_tool_name" in str(text)


def textual_messages(messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that knows nothing of tools: the tools in the system message,
    assistant calls as ``<tool_call>`` text, tool results as user turns in
    ``<tool_response>`` tags — the format the model is asked to write."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                f"{CALL_OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n{CALL_CLOSE}"
                for c in m["tool_calls"])
            content = f"{m.get('content') or ''}\n{calls}".strip()
            out.append({"role": "assistant", "content": content})
        elif m.get("role") == "tool":
            out.append({"role": "user",
                        "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if tools:
        prompt = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
