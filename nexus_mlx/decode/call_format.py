"""Tool calls in the model's own chat format: parsed from a turn's text, and the messages and
system prompt that teach the format.

The format is Hermes / Qwen 2.5's (what their chat templates render and teach)::

    <tool_call>
    {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}
    </tool_call>

Contract:
- :func:`call_schema` is the JSON Schema of one call over the offered tools: one alternative per
  tool, ``name`` a constant and ``arguments`` that tool's input schema (what
  :mod:`~nexus_mlx.decode.turn_constraint` constrains a call to while it is generated).
- :func:`parse_tool_calls` splits a finished turn's text into its prose and its calls;
  :func:`checked_calls` keeps the calls that validate; :func:`grounded_calls` drops the optional
  arguments the conversation does not support (:mod:`~nexus_mlx.decode.grounding`).
- :func:`without_calls` is a reply's text with its calls in the format taken out, and a
  trailing start of an opener (``<tool_c``: a call cut short before its tag was whole) unless
  the model ended the turn there: the prose, which :mod:`~nexus_mlx.decode.prose_calls` reads
  for calls written as prose.
- :func:`cut_at_stop` cuts a text at its first stop string; with ``calls``, one written inside
  a call (or a trailing opener's start) does not count: stop strings end prose, never a call.
- :func:`tools_system_prompt` renders tools for a chat template that ignores them, teaching the
  same format; :func:`textual_messages` renders a conversation's calls and results for it;
  :func:`has_tool_turns` says whether a conversation holds any.

It does not run the model or constrain decoding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nexus_mlx.decode.grounding import Evidence, grounded_arguments
from nexus_mlx.decode.placeholders import schema_errors
from nexus_mlx.errors import ArgumentError, ToolError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.S)
# a call's JSON as the grammar writes it: its name (group 1, the string's body), then its arguments
CALL_NAME = r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
CALL_ARGUMENTS = r'\s*,\s*"arguments"\s*:\s*'
_CUT_CALL = re.compile(CALL_NAME + CALL_ARGUMENTS, re.S)


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


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def call_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text``'s calls lie: each from its opener to its closer (or the end), and a
    trailing start of an opener."""
    spans = [m.span() for m in _CALL.finditer(text)]
    tail = partial_suffix(text, CALL_OPEN)
    return spans + [(len(text) - tail, len(text))] if tail else spans


def without_calls(text: str, ended: bool = False) -> str:
    """``text`` with every call in the format (tags and contents) taken out, unstripped, and a
    trailing start of an opener unless the model ``ended`` the turn there itself (then it is
    prose: a reply cut short at the limit may have been opening a call)."""
    tail = 0 if ended else partial_suffix(text, CALL_OPEN)
    return _CALL.sub("", text[: len(text) - tail])


def cut_at_stop(text: str, stop: Sequence[str], calls: bool = False) -> str:
    """``text`` up to the first occurrence of any stop string; with ``calls``, occurrences
    that start inside a call (:func:`call_spans`) are passed over."""
    spans = call_spans(text) if calls else []
    cut = len(text)
    for s in stop:
        at = text.find(s) if s else -1
        while 0 <= at < cut:
            inside = next((end for start, end in spans if start <= at < end), None)
            if inside is None:
                cut = at
                break
            at = text.find(s, inside)
    return text[:cut]


def _call_object(body: str, cut: bool) -> Any:
    """A call's JSON; for a call ``cut`` short once its arguments were whole (only the outer
    brace missing, as the grammar writes ``name`` then ``arguments``), that object too."""
    try:
        return json.loads(body)
    except ValueError:
        head = _CUT_CALL.match(body) if cut else None
        if head is None:
            raise
        arguments, end = json.JSONDecoder().raw_decode(body, head.end())
        if body[end:].strip():
            raise
        return {"name": json.loads(f'"{head.group(1)}"'), "arguments": arguments}


def parse_tool_calls(text: str, names: Sequence[str] = (), ended: bool = False) -> ParsedTurn:
    """The prose and the calls of a finished turn (a call without its closer, or with part of
    it, or without its outer brace once its arguments are whole, still counts; ``ended``: the
    model ended the turn itself, see :func:`without_calls`).
    With ``names`` (the offered tools), a reply without tags that is, or fences, exactly one
    JSON call to one of them counts as that call too."""
    if names and CALL_OPEN not in text:
        bare = _bare_calls(text, names)
        if bare:
            return ParsedTurn(_FENCE.sub("", text).strip() if _FENCE.search(text) else "", bare)
    calls, errors = [], []
    for match in _CALL.finditer(text):
        body, cut = match.group(1), not match.group(0).endswith(CALL_CLOSE)
        if cut:  # cut short: maybe within its closer
            body = body[: len(body) - partial_suffix(body, CALL_CLOSE)].rstrip()
        try:
            value = _call_object(body, cut)
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                raise ValueError("not an object with a string 'name'")
            arguments = value.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                arguments = json.loads(arguments)
            if not isinstance(arguments, dict):
                raise ValueError("'arguments' is not an object")
            calls.append(ParsedCall(value["name"], arguments))
        except ValueError as exc:
            errors.append(f"{body[:80]!r}: {exc}")
    return ParsedTurn(without_calls(text, ended).strip(), calls, errors)


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


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a conversation holds a tool result or an assistant turn that called tools."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


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
