"""Soak of the server: many turns of several agent conversations over loopback, through every
cache path the pool takes; memory must level off and every request must be served.

Three conversations take turns on a server with two pooled sessions (so each turn of one may
evict or reseed another's cache), a 128 MiB cache budget, 16 stored responses and healing after
each reply. Each turn appends a user request (an append), offers three of nine real GitHub MCP
tools, rotating (tool blocks spliced in and out), keeps only the last six messages (deletions
repaired), and answers a call with a tool result. Every fourth turn continues a stored response
through the Responses API (``previous_response_id``; every eighth such turn starts a new chain,
so that conversation stays bounded too); every seventh is streamed and the client
leaves after its first event (a cancelled generation). After a warm-up of 100 turns, memory
is sampled every 10 turns, in two parts:

- outside MLX's buffers: the resident set size once glibc's allocator has returned its free
  pages (``malloc_trim(0)``), less MLX's live arrays and its cache of freed buffers (the Python
  heap, the allocator's own, everything the server holds that is not an MLX array). Without
  the trim RSS creeps by about 2 MiB a turn here, from freed buffers of many sizes fragmenting
  the allocator's heap (one probe of 110 turns: RSS 3,076 -> 3,286 MiB while the trimmed RSS
  stayed at 3,003-3,059 MiB and Python's object count at 189,898-190,449). Stated bound, as the
  agent soak's (:mod:`test_soak`): it may grow by at most 64 MiB in all, and the least-squares
  slope must stay under 16 KiB per turn.
- MLX's live arrays (weights, tool blocks, the sessions' caches, a request's working set): they
  swing by ~150 MiB with which sessions are cached when the sample is taken, so a leak is
  looked for in their medians: the last third's may exceed the first third's by at most 64 MiB.

No request may fail, no heal may fail, and the pool and the store stay within their bounds.
``NEXUS_SERVER_SOAK_TURNS`` sets the length (default 600, at least 200).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from test_server import client, http  # noqa: E402

from nexus_mlx.server import serve  # noqa: E402

WARMUP = 100
EVERY = 10
MAX_GROWTH = 64 << 20
MAX_SLOPE = 16 << 10
CONVERSATIONS = 3
WINDOW = 6  # messages kept after the system prompt
CHAIN = 8  # Responses continued in one chain before a new one starts
REQUESTS = (
    "list the open pull requests of octocat/hello-world",
    "what is in the README of octocat/hello-world?",
    "add a comment saying thanks to issue 3",
    "search the code for TODO",
    "create a branch called dev",
)


def _held() -> tuple[int, int, int]:
    """(RSS once the allocator's free pages are returned, less MLX's live arrays and cache;
    MLX's live arrays; MLX's cache of freed buffers), in bytes."""
    psutil = pytest.importorskip("psutil")
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pytest.skip("needs glibc's malloc_trim to tell held memory from free heap pages")
    rss = int(psutil.Process().memory_info().rss)
    active, cache = mx.get_active_memory(), mx.get_cache_memory()
    return rss - active - cache, active, cache


def _chat_tools(path: Any, count: int) -> list[dict[str, Any]]:
    tools = json.loads(path.read_text())["tools"][:count]
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["inputSchema"]}} for t in tools]


def _window(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system prompt and the last ``WINDOW`` messages, starting at a user message."""
    system, rest = messages[:1], messages[1:]
    rest = rest[-WINDOW:]
    while rest and rest[0]["role"] != "user":
        rest = rest[1:]
    return system + rest


def _chat_turn(c: Any, history: list[dict[str, Any]], tools: list[dict[str, Any]],
               stream_and_leave: bool) -> None:
    ask = dict(model="default", messages=history, tools=tools, max_tokens=6)
    if stream_and_leave:
        with c.chat.completions.create(**ask, stream=True) as stream:
            next(iter(stream))  # the role chunk; then the client goes away
        return
    message = c.chat.completions.create(**ask).choices[0].message
    if message.tool_calls:
        call = message.tool_calls[0]
        history.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]})
        history.append({"role": "tool", "tool_call_id": call.id, "content": '{"ok": true}'})
    else:
        history.append({"role": "assistant", "content": message.content or ""})


@pytest.mark.slow
def test_server_turns_do_not_grow_memory(default_model, github_tools_file):
    turns = max(200, int(os.environ.get("NEXUS_SERVER_SOAK_TURNS", "600")))
    tools = _chat_tools(github_tools_file, 9)
    histories = [[{"role": "system", "content": f"You are agent {i}. Use the tools."}]
                 for i in range(CONVERSATIONS)]
    previous: str | None = None
    samples: list[tuple[int, int, int]] = []  # (turn, outside MLX's buffers, MLX arrays)
    with serve(*default_model, model_name="default", host="127.0.0.1", port=0,
               max_sessions=2, cache_budget_mib=128, max_stored_responses=16,
               heal_after_reply=True) as server:
        c = client(server)
        for turn in range(turns):
            request = REQUESTS[turn % len(REQUESTS)]
            offered = [tools[(turn + j) % len(tools)] for j in range(3)]
            if turn % 4 == 3:  # the Responses API, continuing the last stored response
                previous = None if (turn // 4) % CHAIN == 0 else previous
                response = c.responses.create(
                    model="default", input=request, previous_response_id=previous,
                    max_output_tokens=6, tools=[{"type": "function", **t["function"]}
                                                for t in offered[:1]], tool_choice="none")
                previous = response.id
            else:
                history = histories[turn % CONVERSATIONS]
                history.append({"role": "user", "content": request})
                _chat_turn(c, history, offered, stream_and_leave=turn % 7 == 6)
                histories[turn % CONVERSATIONS] = _window(history)
            if turn + 1 >= WARMUP and (turn + 1) % EVERY == 0:
                gc.collect()
                outside, active, cached = _held()
                samples.append((turn + 1, outside, active))
                print(f"turn {turn + 1}: outside MLX {outside / 2**20:.1f} MiB, MLX arrays "
                      f"{active / 2**20:.1f}, MLX cache {cached / 2**20:.1f}", flush=True)
        status, health = http(server, "/health")
    assert status == 200 and health["failed"] == 0 and health["heal_failures"] == 0, health
    assert health["sessions"] <= 2 and health["stored_responses"] <= 16, health
    assert health["served"] >= turns - turns // 7 - 1, health
    x, y, arrays = (np.array(column, dtype=np.float64) for column in zip(*samples, strict=True))
    growth, slope = y[-1] - y[0], float(np.polyfit(x, y, 1)[0])
    third = max(1, len(arrays) // 3)
    arrays_growth = float(np.median(arrays[-third:]) - np.median(arrays[:third]))
    report = (f"outside MLX {y[0] / 2**20:.1f} MiB after {WARMUP} turns -> "
              f"{y[-1] / 2**20:.1f} MiB after {turns} (peak {y.max() / 2**20:.1f}); slope "
              f"{slope / 1024:.2f} KiB/turn; MLX arrays' median {arrays_growth / 2**20:+.1f} MiB "
              f"(range {arrays.min() / 2**20:.0f}-{arrays.max() / 2**20:.0f}); "
              f"{health['served']} served, {health['cancelled']} cancelled")
    print(report)
    assert growth <= MAX_GROWTH, report
    assert slope <= MAX_SLOPE, report
    assert arrays_growth <= MAX_GROWTH, report
