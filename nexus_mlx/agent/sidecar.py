"""The sidecar: a short, pruned view of the conversation for argument generation (paper 1).

Contract: ``sidecar_messages(messages, window=4, payload_chars=240)`` returns the chat messages a
tool call is generated over, in a fresh sequence at position 0 (always anchored, so it never
needs splice repair): the last ``window`` messages verbatim, except that bulky tool payloads
(``role == "tool"`` messages longer than ``payload_chars``) are replaced by a short surrogate
naming the tool and keeping the payload's head; system messages are dropped (the tool-call
prompt brings its own). Older turns fall out of the window, but a one-line digest of the
earlier tool calls' arguments is kept so cross-turn references ("open a pull request *there*")
still resolve. Calls may come flat (``{"name", "arguments"}``) or in the OpenAI form
(``{"function": {"name", "arguments": "<JSON>"}}``). The last message must be the user's request.

It only rewrites message lists: no tokenizer, model or cache.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from nexus_mlx.decode.call_format import normalized_messages
from nexus_mlx.errors import ArgumentError

Message = Mapping[str, Any]


def surrogate(message: Message, payload_chars: int) -> str:
    """The short stand-in for a bulky tool result."""
    content = str(message.get("content", ""))
    name = message.get("name") or "tool"
    head = " ".join(content[: payload_chars // 2].split())
    return f"[result of {name}: {head} ... ({len(content) - payload_chars // 2} more characters)]"


def _call_digest(messages: Sequence[Message]) -> str | None:
    """One line naming the calls of ``messages`` (normalized: OpenAI form) with arguments."""
    calls = []
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            args = json.dumps(fn["arguments"], ensure_ascii=False, sort_keys=True)
            calls.append(f"{fn['name']}({args})")
    return "Earlier tool calls: " + "; ".join(calls[-6:]) if calls else None


def _plain(message: Message, payload_chars: int) -> dict[str, str]:
    role = str(message.get("role", ""))
    content = message.get("content", "")
    if role == "tool":
        text = str(content)
        body = surrogate(message, payload_chars) if len(text) > payload_chars else text
        return {"role": "user", "content": f"Tool result: {body}"}
    if message.get("tool_calls") and not content:
        content = _call_digest([message]) or ""
    return {"role": role, "content": str(content)}


def sidecar_messages(
    messages: Sequence[Message], *, window: int = 4, payload_chars: int = 240
) -> list[dict[str, str]]:
    """The pruned sliding window described in the module docstring."""
    if window < 1 or payload_chars < 16:
        raise ArgumentError(f"need window >= 1 and payload_chars >= 16, got {window}, {payload_chars}")
    turns = [m for m in normalized_messages(messages) if m["role"] != "system"]
    if not turns or turns[-1].get("role") != "user":
        raise ArgumentError("the last message must be the user's request")
    recent, older = turns[-window:], turns[:-window]
    out = [_plain(m, payload_chars) for m in recent]
    digest = _call_digest(older)
    if digest:
        out.insert(0, {"role": "user", "content": digest})
    return _merge_roles(out)


def _merge_roles(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Join consecutive messages of one role (chat templates expect alternation)."""
    merged: list[dict[str, str]] = []
    for m in messages:
        if merged and merged[-1]["role"] == m["role"]:
            merged[-1] = {"role": m["role"], "content": merged[-1]["content"] + "\n" + m["content"]}
        else:
            merged.append(dict(m))
    return merged
