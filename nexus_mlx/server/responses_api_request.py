"""A ``POST /v1/responses`` body (OpenAI's Responses API) read as the chat request it asks for.

Contract: :func:`parse_responses_request` ``(body, previous)`` returns a
:class:`ResponsesRequest` (the equivalent :class:`~.protocol.ChatRequest`, the conversation as
input items, whether to store the response, and the fields a response echoes) or an
:class:`~.protocol.ApiError` (HTTP 400 naming the field). The client sends the whole
conversation in ``input`` each turn, or only what is new since a stored response it names in
``previous_response_id`` (``previous(id)`` gives that response's conversation items, or None
when it is unknown: ``previous_response_not_found``); either way the pool finds the live
session that holds the conversation. So:

- ``input``: a string (one user message) or a list of items: messages (``role`` ``user`` /
  ``assistant`` / ``system`` / ``developer``, the last read as ``system``; ``content`` a string
  or ``input_text`` / ``output_text`` parts), ``function_call`` (consecutive calls, and the
  assistant message before them, make one assistant turn) and ``function_call_output`` (a tool
  result). ``instructions`` is a first system message; it is not carried over from a previous
  response (as OpenAI's API does not).
- ``tools``: ``function`` tools (``name``, ``description``, ``parameters``, ``strict``);
  ``tool_choice``: ``none`` / ``auto`` / ``required`` / ``{"type": "function", "name"}`` /
  ``{"type": "allowed_tools", "mode", "tools"}``;
  ``parallel_tool_calls``; ``text.format``: ``text`` / ``json_object`` / ``json_schema`` (its
  ``name``, ``schema``, ``strict``, ``description``); ``max_output_tokens``; ``temperature``;
  ``top_p``; ``stream``; ``store`` (default true: the response can be continued and read back).
- ``include``: ``"message.output_text.logprobs"`` asks for each output text token's log
  probability (the chat request's ``logprobs``), with ``top_logprobs`` (0 to 20) alternatives
  each; ``top_logprobs`` alone is checked and echoed but adds nothing, as OpenAI's API does.
  The other values OpenAI documents name output this server never produces (hosted tools'
  results, images, encrypted reasoning), so they include nothing; an unknown one is refused.
- Fields that change nothing here are accepted (``metadata`` is echoed; ``user``,
  ``truncation: "disabled"``, ``max_tool_calls``, which bounds calls to built-in tools only,
  ...). What needs a capability this server lacks is refused by
  name: ``conversation`` (the Conversations API), hosted tools (``web_search``,
  ``file_search``, ...), ``reasoning`` items and options, ``background``, non-text input parts.

Checks past the translation are the chat request's (:func:`~.protocol.parse_chat_request`);
their errors, and the engine's (:func:`responses_error`), name the Responses field (``input``
for ``messages``, ``max_output_tokens``, ``text.format``). It knows nothing about HTTP,
generation or how responses are stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nexus_mlx.errors import ArgumentError
from nexus_mlx.server.protocol import (
    SHARED_NO_OPS,
    ApiError,
    ChatRequest,
    check_top_logprobs,
    field_problem,
    parse_chat_request,
)

# fields that change nothing here, with the values that keep it so
_NO_OPS: dict[str, Callable[[Any], bool]] = {
    **SHARED_NO_OPS,
    "truncation": lambda v: v in (None, "disabled"),
    "reasoning": lambda v: v is None,
    "conversation": lambda v: v is None,
    "background": lambda v: v in (None, False),
    # a bound on calls to OpenAI's built-in tools, which this server has none of
    "max_tool_calls": lambda v: v is None or (type(v) is int and v >= 1),
    "prompt": lambda v: v is None,
    "stream_options": lambda v: v is None or isinstance(v, dict),
}
_WHY = {
    "conversation": "is not served: this server keeps no conversations; send the whole "
                    "conversation in input, or continue a response with previous_response_id",
    "reasoning": "is not served: this server's models take no reasoning options",
    "truncation": "is not served: only truncation 'disabled' is; a conversation past the "
                  "context is refused, not trimmed",
}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# what OpenAI's include names besides log probabilities: output this server never produces
_NOTHING_TO_INCLUDE = frozenset({
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs", "reasoning.encrypted_content"})
_PASSED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls")
_CHAT_PARAM = {"messages": "input", "max_tokens": "max_output_tokens",
               "response_format": "text.format"}


Items = Sequence[Mapping[str, Any]]
Previous = Callable[[str], Items | None]  # a stored response's conversation items, by id


@dataclass(frozen=True)
class ResponsesRequest:
    chat: ChatRequest
    echo: dict[str, Any] = field(default_factory=dict)  # fields the response repeats
    items: tuple[Mapping[str, Any], ...] = ()  # the conversation as input items
    store: bool = True  # keep the response, to be continued and read back


def _no_previous(response_id: str) -> Items | None:
    return None


def parse_responses_request(body: Any, previous: Previous = _no_previous
                            ) -> ResponsesRequest | ApiError:
    """The request, or its first problem (module docstring)."""
    if not isinstance(body, Mapping):
        return ApiError(400, "the request body must be a JSON object")
    known = {"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens",
             "previous_response_id", "include", "top_logprobs", *_PASSED, *_NO_OPS}
    problem = field_problem(body, known, _NO_OPS, _WHY)
    if problem is not None:
        return problem
    conversation = _conversation(body, previous)
    if isinstance(conversation, ApiError):
        return conversation
    items, earlier = conversation
    chat = _chat_body(body, items, earlier)
    if isinstance(chat, ApiError):
        return chat
    parsed = parse_chat_request(chat)
    if isinstance(parsed, ApiError):
        return responses_error(parsed)
    echo = {name: body.get(name) for name in ("instructions", "metadata", "max_output_tokens",
                                              "previous_response_id", "top_logprobs")}
    echo["text"] = body.get("text") or {"format": {"type": "text"}}
    echo["tools"] = list(body.get("tools") or [])
    echo["tool_choice"] = body.get("tool_choice", "auto")
    return ResponsesRequest(parsed, echo, tuple(items), body.get("store") is not False)


def _conversation(body: Mapping[str, Any], previous: Previous
                  ) -> tuple[list[Any], int] | ApiError:
    """The conversation's input items (the previous response's, then this request's input) and
    how many of them are the previous response's."""
    earlier: Items = []
    response_id = body.get("previous_response_id")
    if response_id is not None:
        found = previous(response_id) if isinstance(response_id, str) else None
        if found is None:
            return ApiError(400, f"Previous response with id {response_id!r:.80} not found.",
                            "previous_response_id", "previous_response_not_found")
        earlier = found
    given = body.get("input")
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    if not isinstance(given, list):
        return ApiError(400, f"input must be a string or a list of items, got {given!r:.80}",
                        "input")
    return [*earlier, *given], len(earlier)


def responses_error(error: ApiError) -> ApiError:
    """A chat request's error (the parser's or the engine's) naming the Responses field."""
    param = _CHAT_PARAM.get(error.param or "", error.param)
    return ApiError(error.status, error.message, param, error.code, error.type)


def _chat_body(body: Mapping[str, Any], items: Items, earlier: int
               ) -> dict[str, Any] | ApiError:
    """The chat request's body for the conversation ``items`` (the first ``earlier`` of them a
    stored response's), or the first field that cannot be read as one."""
    chat: dict[str, Any] = {name: body[name] for name in _PASSED if name in body}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    param = "instructions"  # the field being read: the one an error names
    try:
        system = _instructions(body.get("instructions"))
        param = "input"
        chat["messages"] = system + _messages(items, earlier)
        param = "tools"
        if body.get("tools"):
            chat["tools"] = [_tool(t, i) for i, t in enumerate(_list(body["tools"], "tools"))]
        param = "tool_choice"
        if "tool_choice" in body:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
        param = "include"
        if LOGPROBS_INCLUDE in _included(body.get("include")):
            chat["logprobs"] = True
            if body.get("top_logprobs") is not None:
                chat["top_logprobs"] = body["top_logprobs"]
        elif body.get("top_logprobs") is not None:
            param = "top_logprobs"
            check_top_logprobs(body["top_logprobs"])
        param = "text"
        fmt = _format_of(body.get("text"))
        param = "text.format"
        if fmt is not None:
            chat["response_format"] = _response_format(fmt)
    except ArgumentError as exc:
        return ApiError(400, str(exc), param)
    return chat


def _list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise ArgumentError(f"{param} must be a list, got {value!r:.80}")
    return value


def _included(include: Any) -> set[str]:
    """``include``'s values, checked (module docstring)."""
    if include is None:
        return set()
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise ArgumentError(f"include must be a list of strings, got {include!r:.80}")
    unknown = sorted(set(include) - _NOTHING_TO_INCLUDE - {LOGPROBS_INCLUDE})
    if unknown:
        raise ArgumentError(f"include names unknown output {unknown[0]!r:.60}; it takes "
                            f"{sorted(_NOTHING_TO_INCLUDE | {LOGPROBS_INCLUDE})}")
    return set(include)


def _instructions(instructions: Any) -> list[dict[str, Any]]:
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise ArgumentError("instructions must be a string")
    return [{"role": "system", "content": instructions}]


def _messages(items: Items, earlier: int) -> list[dict[str, Any]]:
    """Chat messages of ``items``, the first ``earlier`` of them a stored response's."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i - earlier}]" if i >= earlier else f"the previous response's item {i}"
        _add_item(messages, item, where)
    return messages


def _format_of(text: Any) -> Any:
    """``text.format`` (None when absent)."""
    if text is None:
        return None
    if not isinstance(text, Mapping) or set(text) - {"format", "verbosity"}:
        raise ArgumentError(f"text must be {{'format': {{...}}}}, got {text!r:.80}")
    return text.get("format")


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, Mapping):
        raise ArgumentError(f"{where} must be an object, got {item!r:.80}")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ArgumentError(f"{where}.role must be 'user', 'assistant', 'system' or "
                              f"'developer', got {role!r:.40}")
        messages.append({"role": "system" if role == "developer" else role,
                         "content": _content_text(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        call = {"id": _string(item, "call_id", where), "type": "function",
                "function": {"name": _string(item, "name", where),
                             "arguments": _string(item, "arguments", where)}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # the same assistant turn
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                         "content": _content_text(item.get("output"), f"{where}.output")})
    else:
        raise ArgumentError(f"{where}.type {kind!r:.40} is not served here: input items "
                          "are messages, function_call and function_call_output")


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ArgumentError(f"{where}.{key} must be a string, got {value!r:.80}")
    return value


def _content_text(content: Any, where: str) -> str:
    """A content string, or the text of its parts (``input_text``, ``output_text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ArgumentError(f"{where} must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
                part.get("text"), str):
            raise ArgumentError(f"{where}[{j}] must be a text part (input_text / "
                              f"output_text); this server reads text only, got {part!r:.80}")
        texts.append(part["text"])
    return "".join(texts)


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else tool
        raise ArgumentError(f"tools[{i}] of type {kind!r:.40} is not served here: "
                          "only function tools")
    unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
    if unknown:
        raise ArgumentError(f"tools[{i}] has unknown fields {unknown}")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        listed = choice.get("tools")
        if not isinstance(listed, list) or not all(
                isinstance(t, Mapping) and t.get("type") == "function" for t in listed):
            raise ArgumentError(f"tool_choice allowed_tools lists function tools "
                                f"({{'type': 'function', 'name': ...}}), got {listed!r:.80}")
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": [
            {"type": "function", "function": {"name": t.get("name")}} for t in listed]}}
    if isinstance(choice, str) or choice is None:
        return choice
    raise ArgumentError(f"tool_choice must be 'none', 'auto', 'required' or "
                      f"{{'type': 'function', 'name': ...}}, got {choice!r:.80}")


def _response_format(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, Mapping):
        raise ArgumentError(f"text.format must be an object, got {fmt!r:.80}")
    if fmt.get("type") != "json_schema":
        return dict(fmt)
    spec = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": spec}
