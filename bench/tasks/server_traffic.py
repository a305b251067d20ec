"""Agent-like traffic for a long-running server: several conversations taking turns.

Contract: ``ServerTraffic(client, tools)`` (an ``openai`` client of the server, tools in the chat
API's form, at least three; :func:`chat_tools` makes them from an MCP registry file) sends one
turn per :meth:`ServerTraffic.turn` ``(i)``, cycling through ``conversations`` (3) chat
histories. Each chat turn appends a user request from :data:`REQUESTS` (an append), offers three
of the tools, rotating with ``i`` (tool blocks spliced in and out), keeps only the system prompt
and the last ``window`` (6) messages (deletions repaired) and answers a call with a tool result.
Every fourth turn continues the last stored response through the Responses API
(``previous_response_id``; every ``chain``-th (8th) such turn starts a new chain, so that
conversation stays bounded too); every seventh chat turn is streamed and the client leaves
after its first event (a cancelled generation). Replies are short (``max_tokens`` 6): the
traffic exercises the cache paths and the server's bookkeeping, not decoding.

Used by the server soak test (``tests/test_server_soak.py``) and ``bench/server_memory.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REQUESTS = (
    "list the open pull requests of octocat/hello-world",
    "what is in the README of octocat/hello-world?",
    "add a comment saying thanks to issue 3",
    "search the code for TODO",
    "create a branch called dev",
)
MAX_TOKENS = 6


def chat_tools(path: str | Path, count: int) -> list[dict[str, Any]]:
    """The first ``count`` tools of an MCP registry file (``{"tools": [...]}``), chat form."""
    tools = json.loads(Path(path).read_text())["tools"][:count]
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["inputSchema"]}} for t in tools]


class ServerTraffic:
    """See the module docstring."""

    def __init__(self, client: Any, tools: list[dict[str, Any]], *, model: str = "default",
                 conversations: int = 3, window: int = 6, chain: int = 8) -> None:
        if len(tools) < 3:
            raise ValueError(f"the traffic offers three tools a turn; got {len(tools)}")
        self.client, self.tools, self.model = client, tools, model
        self.window, self.chain = window, chain
        self.histories = [[{"role": "system", "content": f"You are agent {i}. Use the tools."}]
                          for i in range(conversations)]
        self.previous: str | None = None

    def turn(self, i: int) -> None:
        request = REQUESTS[i % len(REQUESTS)]
        offered = [self.tools[(i + j) % len(self.tools)] for j in range(3)]
        if i % 4 == 3:
            self._continue_response(i, request, offered[0])
            return
        which = i % len(self.histories)
        history = self.histories[which]
        history.append({"role": "user", "content": request})
        self._chat_turn(history, offered, stream_and_leave=i % 7 == 6)
        self.histories[which] = self._windowed(history)

    def _continue_response(self, i: int, request: str, tool: dict[str, Any]) -> None:
        previous = None if (i // 4) % self.chain == 0 else self.previous
        response = self.client.responses.create(
            model=self.model, input=request, previous_response_id=previous,
            max_output_tokens=MAX_TOKENS, tools=[{"type": "function", **tool["function"]}],
            tool_choice="none")
        self.previous = response.id

    def _windowed(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The system prompt and the last ``window`` messages, starting at a user message."""
        system, rest = messages[:1], messages[1:][-self.window:]
        while rest and rest[0]["role"] != "user":
            rest = rest[1:]
        return system + rest

    def _chat_turn(self, history: list[dict[str, Any]], tools: list[dict[str, Any]],
                   stream_and_leave: bool) -> None:
        ask = dict(model=self.model, messages=history, tools=tools, max_tokens=MAX_TOKENS)
        if stream_and_leave:
            with self.client.chat.completions.create(**ask, stream=True) as stream:
                next(iter(stream))  # the role chunk; then the client goes away
            return
        message = self.client.chat.completions.create(**ask).choices[0].message
        if message.tool_calls:
            call = message.tool_calls[0]
            history.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {
                    "name": call.function.name, "arguments": call.function.arguments}}]})
            history.append({"role": "tool", "tool_call_id": call.id, "content": '{"ok": true}'})
        else:
            history.append({"role": "assistant", "content": message.content or ""})
