"""The OpenAI-shaped answers: a chat completion, its stream chunks, usage with the ``nexus``
extension, and the models list.

Contract: pure functions from a finished (or growing) reply to JSON-ready dicts.
``usage`` carries ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
``prompt_tokens_details.cached_tokens`` (the rows the session kept or spliced rather than
computed), ``completion_tokens_details`` (``accepted_prediction_tokens`` /
``rejected_prediction_tokens``: ids a ``prediction`` drafted that the reply kept / dropped),
plus ``nexus``: what the live cache did for this request (``path`` and ``reason``;
rows ``reused`` / ``spliced`` / ``repaired`` / ``computed`` / ``deleted``; the pooled
``session``; ``timings`` in seconds: the session's stages, ``ttft``, ``decode`` and ``queue``, the
wait for a session and the model). Finish reasons map ``stop_string`` to ``stop``.
``logprobs`` (when asked for) are ``{"content": [{"token", "logprob", "bytes",
"top_logprobs"}], "refusal": null}`` over every id generated but the end-of-turn one (tool
calls' ids, the one that completed a stop string and whitespace the content strips
included). It knows nothing about HTTP or how replies are made.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nexus_mlx.agent.session import Reply, TokenLogprob
from nexus_mlx.server.stream import AssembledCall, Delta

OWNER = "nexus-mlx"
@dataclass
class Completion:
    """A reply and where it was made."""

    reply: Reply
    session: int | None  # the pooled session's id (None: the request took no session)
    queue_s: float  # from the request's arrival to the start of its step
    logprobs: list[dict[str, Any]] | None = None  # the reply's, shaped (logprob_entry)
    prompt_logprobs: list[dict[str, Any]] | None = None  # a scored raw prompt's, id by id


def logprob_entry(scored: TokenLogprob, token_bytes: Callable[[int], bytes]) -> dict[str, Any]:
    """One ``logprobs.content`` entry: the token's text, its log probability, its UTF-8 bytes
    and its ``top_logprobs`` alike."""
    def one(token: int, logprob: float) -> dict[str, Any]:
        data = token_bytes(token)
        return {"token": data.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(data)}
    return {**one(scored.id, scored.logprob),
            "top_logprobs": [one(i, lp) for i, lp in scored.top]}


def logprobs_body(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return None if entries is None else {"content": entries, "refusal": None}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def finish_reason(reply: Reply, called: bool) -> str:
    """``"length"`` for a reply cut at ``max_tokens``; else ``"tool_calls"`` exactly when the
    reply sent carries calls (``called``: what the client receives, not what another parser
    read), else ``"stop"``."""
    if reply.finish_reason == "length":
        return "length"
    return "tool_calls" if called else "stop"


def usage(done: Completion, *later: Completion) -> dict[str, Any]:
    """The usage of a reply (``done``), or of a request's choices (``later``: the others, whose
    tokens count as completion tokens; the prompt and ``nexus`` are the first choice's)."""
    reply, report = done.reply, done.reply.report
    timings = {k: round(v, 6) for k, v in report.timings.items()}
    timings.update(ttft=round(reply.ttft_s, 6), decode=round(reply.decode_s, 6),
                   queue=round(done.queue_s, 6))
    generated = len(reply.tokens) + sum(len(c.reply.tokens) for c in later)
    drafts = [c.reply.drafts for c in (done, *later)]
    accepted = sum(d.predicted_accepted for d in drafts)
    return {
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": report.prompt_tokens + generated,
        "completion_tokens_details": {
            "reasoning_tokens": 0, "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(d.predicted for d in drafts) - accepted},
        "prompt_tokens_details": {"cached_tokens": report.reused + report.spliced},
        "nexus": {"path": report.path, "reason": report.reason, "reused": report.reused,
                  "spliced": report.spliced, "repaired": report.repaired,
                  "computed": report.computed, "deleted": report.deleted,
                  "session": done.session, "timings": timings},
    }


def tool_call_body(call: AssembledCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def choice_body(index: int, content: str, calls: list[AssembledCall], done: Completion
                ) -> dict[str, Any]:
    """One choice of a whole chat completion."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": (content or None) if calls else content}
    if calls:
        message["tool_calls"] = [tool_call_body(c) for c in calls]
    return {"index": index, "message": message, "logprobs": logprobs_body(done.logprobs),
            "finish_reason": finish_reason(done.reply, bool(calls))}


def completion_body(cid: str, created: int, model: str, choices: list[dict[str, Any]],
                    dones: list[Completion]) -> dict[str, Any]:
    """A whole chat completion: its ``choices`` (:func:`choice_body`), made by ``dones``."""
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage(*dones)}


def chunk_body(cid: str, created: int, model: str, delta: Delta,
               finish: str | None = None, *, with_usage: bool = False,
               logprobs: list[dict[str, Any]] | None = None, index: int = 0) -> dict[str, Any]:
    """One stream chunk of choice ``index``; ``with_usage`` (``stream_options.include_usage``):
    ``"usage": null``, as OpenAI sends on every chunk but the last; ``logprobs``: the entries
    of the ids since the last chunk that carried some."""
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs_body(logprobs),
                         "finish_reason": finish}]}
    if with_usage:
        body["usage"] = None
    return body


def usage_chunk(cid: str, created: int, model: str, dones: list[Completion]
                ) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage(*dones)}


def models_body(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_body(n, created) for n in names]}


def model_body(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}


def now() -> int:
    return int(time.time())
