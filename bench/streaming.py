"""Streamed chat requests timed from the client's side: the ``openai`` client over loopback.

Contract: ``stream_chat(base_url, messages, max_tokens, on_first=None, **extra)`` sends one
greedy streamed chat request (model name ``"m"``; ``extra``: more request fields) and returns a
:class:`Streamed`: the milliseconds to its first text (a first chunk that only names the role
does not count; the whole reply's time when no text came) and to its end, the text and the
usage when the stream carried one. ``on_first()`` runs when the first text arrives (a second
request sent at that moment). It knows nothing about servers or benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai


@dataclass(frozen=True)
class Streamed:
    first_ms: float
    end_ms: float
    text: str
    usage: Any | None


def stream_chat(base_url: str, messages: list[dict[str, str]], max_tokens: int,
                on_first: Callable[[], None] | None = None, **extra: Any) -> Streamed:
    """One timed greedy streamed request (module docstring)."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0, timeout=600)
    start, first, text, usage = time.perf_counter(), None, [], None
    for chunk in client.chat.completions.create(model="m", messages=messages, stream=True,
                                                max_tokens=max_tokens, temperature=0, **extra):
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = (time.perf_counter() - start) * 1e3
                if on_first is not None:
                    on_first()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    end = (time.perf_counter() - start) * 1e3
    return Streamed(end if first is None else first, end, "".join(text), usage)
