"""The conversation part of a chat-completions request, checked: messages, tools, tool_choice.

Contract: each ``check_*`` takes the raw JSON value of one request field and returns it
normalised, or raises :class:`~nexus_mlx.errors.ArgumentError` whose message names the offending
element (``messages[2].tool_calls[0].function.arguments is not JSON: ...``); the caller turns that
into an HTTP 400 naming the field. What they accept is the OpenAI API's shape:

- ``messages``: a non-empty list; roles ``system`` / ``developer`` (read as ``system``), ``user``,
  ``assistant`` (``content`` and/or ``tool_calls``: ``id``, ``type: "function"``,
  ``function.name``, ``function.arguments`` as a JSON-object string, or an object) and ``tool``
  (``tool_call_id`` answering a call of the assistant message before it). Content is a string
  or a list of ``text`` parts (``refusal`` parts too, for the assistant), joined. Every call must
  be answered by a tool message before the next non-tool message, as OpenAI requires.
- ``tools``: a non-empty list of ``{"type": "function", "function": {"name", "description"?,
  "parameters"?, "strict"?}}`` with distinct names of ``[A-Za-z0-9_-]{1,64}``; ``parameters``
  an object (whether the grammar compiles it is checked later, with the tokenizer).
- ``tool_choice``: ``"none"``, ``"auto"``, ``"required"``, ``{"type": "function",
  "function": {"name": ...}}`` naming an offered tool, or ``{"type": "allowed_tools",
  "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}`` naming some (the prompt
  keeps every tool, so its cache stays valid; calls may take only those).

Normalised messages hold only ``role``, ``content`` (a string), ``tool_calls`` (arguments kept
as the client's string, which the session parses) and ``tool_call_id``. It knows nothing about
models, tokenizers or HTTP.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nexus_mlx.decode.turn_constraint import MODES, resolve_choice
from nexus_mlx.errors import ArgumentError

ROLES = ("system", "developer", "user", "assistant", "tool")
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    # the rest are what a client echoes back from a response (null here)
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio", "annotations",
                  "function_call"},
    "tool": {"role", "content", "tool_call_id", "name"},
}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


def _text(value: Any, where: str, *, parts: tuple[str, ...] = ("text",)) -> str:
    """A message's content as one string (a string, or a list of text parts)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out = []
        for k, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in parts:
                raise ArgumentError(f"{where}.content[{k}] has type {kind!r}; only "
                                    f"{' / '.join(parts)} content parts are supported")
            text = part.get(kind)
            if not isinstance(text, str):
                raise ArgumentError(f"{where}.content[{k}].{kind} must be a string")
            out.append(text)
        return "".join(out)
    raise ArgumentError(f"{where}.content must be a string or a list of text parts, got "
                        f"{type(value).__name__}")


def _arguments(value: Any, where: str) -> str:
    """A call's arguments: a JSON-object string (or an object, serialised)."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        raise ArgumentError(f"{where} must be a JSON string, got {type(value).__name__}")
    if not value.strip():
        return "{}"
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError) as exc:  # too deeply nested: RecursionError
        raise ArgumentError(f"{where} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ArgumentError(f"{where} must encode a JSON object, got {type(parsed).__name__}")
    return value


def _tool_calls(value: Any, where: str, seen: set[str]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ArgumentError(f"{where}.tool_calls must be a non-empty list (or be omitted)")
    calls = []
    for k, call in enumerate(value):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise ArgumentError(f"{at} must be an object")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise ArgumentError(f"{at}.id must be a non-empty string")
        if call_id in seen:
            raise ArgumentError(f"{at}.id {call_id!r} is used by an earlier tool call")
        seen.add(call_id)
        if call.get("type", "function") != "function":
            raise ArgumentError(f"{at}.type must be 'function', got {call.get('type')!r}")
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ArgumentError(f"{at}.function needs a non-empty string 'name'")
        arguments = _arguments(fn.get("arguments", "{}"), f"{at}.function.arguments")
        calls.append({"id": call_id, "type": "function",
                      "function": {"name": fn["name"], "arguments": arguments}})
    return calls


def check_messages(value: Any) -> list[dict[str, Any]]:
    """The conversation, normalised (see the module docstring)."""
    if not isinstance(value, list) or not value:
        raise ArgumentError("messages must be a non-empty list of message objects")
    out: list[dict[str, Any]] = []
    pending: dict[str, str] = {}  # call id -> function name, awaiting a tool message
    seen: set[str] = set()
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ArgumentError(f"{where} must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ArgumentError(f"{where}.role must be one of {list(ROLES)}, got {role!r}")
        unknown = sorted(set(message) - _KEYS[role])
        if unknown:
            raise ArgumentError(f"{where} ({role}) has unknown fields {unknown}")
        if role != "tool" and pending:
            raise ArgumentError(f"{where}: the tool calls {sorted(pending)} of an earlier "
                                "assistant message must each be answered by a tool message first")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in pending:
                raise ArgumentError(f"{where}.tool_call_id {call_id!r} answers no tool call of "
                                    "the assistant message before it")
            content = _text(message.get("content"), where)
            out.append({"role": "tool", "tool_call_id": call_id, "name": pending.pop(call_id),
                        "content": content})
            continue
        if role == "assistant":
            if message.get("function_call") is not None or message.get("audio") is not None:
                raise ArgumentError(f"{where}: function_call and audio are not supported; send "
                                    "tool_calls and text content")
            raw = message.get("content")
            content = "" if raw is None else _text(raw, where, parts=("text", "refusal"))
            m: dict[str, Any] = {"role": "assistant", "content": content}
            if message.get("tool_calls") is not None:
                m["tool_calls"] = _tool_calls(message["tool_calls"], where, seen)
                pending = {c["id"]: c["function"]["name"] for c in m["tool_calls"]}
            elif raw is None:
                raise ArgumentError(f"{where} (assistant) needs content or tool_calls")
            out.append(m)
            continue
        if "content" not in message:
            raise ArgumentError(f"{where} ({role}) needs content")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text(message["content"], where)})
    if pending:
        raise ArgumentError(f"the tool calls {sorted(pending)} of the last assistant message "
                            "need tool messages answering them")
    return out


def check_tools(value: Any) -> list[dict[str, Any]]:
    """The offered tools, normalised to ``{"type": "function", "function": {...}}``."""
    if not isinstance(value, list) or not value:
        raise ArgumentError("tools must be a non-empty list (or be omitted)")
    out, names = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ArgumentError(f"{where} must be {{'type': 'function', 'function': {{...}}}}")
        unknown = sorted(set(tool) - {"type", "function"})
        if unknown:
            raise ArgumentError(f"{where} has unknown fields {unknown}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ArgumentError(f"{where}.function must be an object")
        unknown = sorted(set(fn) - _FUNCTION_KEYS)
        if unknown:
            raise ArgumentError(f"{where}.function has unknown fields {unknown}")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ArgumentError(f"{where}.function.name must match [A-Za-z0-9_-]{{1,64}}, got "
                                f"{name!r}")
        if name in names:
            raise ArgumentError(f"{where}.function.name {name!r} is offered twice")
        names.add(name)
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise ArgumentError(f"{where}.function.description must be a string")
        parameters = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ArgumentError(f"{where}.function.parameters must be a JSON Schema object")
        if not isinstance(fn.get("strict", False), bool):
            raise ArgumentError(f"{where}.function.strict must be a boolean")
        function: dict[str, Any] = {"name": name, "parameters": parameters}
        if description:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def check_tool_choice(value: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """``"none"`` / ``"auto"`` / ``"required"``, a named function among ``tools``, or
    ``allowed_tools`` naming some of them
    (:func:`~nexus_mlx.decode.turn_constraint.resolve_choice`), normalized."""
    if isinstance(value, str) and value not in MODES:
        raise ArgumentError(f"tool_choice must be 'none', 'auto', 'required' or a named "
                            f"function, got {value!r}")
    choice, allowed = resolve_choice(value, [t["function"]["name"] for t in tools])
    if choice == "required" and not tools:
        raise ArgumentError("tool_choice 'required' needs tools")
    if allowed is not None:
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice, "tools": [{"type": "function", "function": {"name": n}}
                                      for n in allowed]}}
    return choice if choice in MODES else {"type": "function", "function": {"name": choice}}
