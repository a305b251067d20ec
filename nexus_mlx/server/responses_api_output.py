"""One assistant turn as OpenAI's Responses API returns it: the ``response`` object, and its
stream of typed events.

Contract: ``ResponseWriter(request, stored)`` follows the chat deltas of one reply
(:class:`~.stream.ReplyAssembler`'s: content pieces, a call's header, its argument fragments).
``opening()`` is the stream's first events (``response.created``, ``response.in_progress``);
``events(deltas)`` the events the deltas make: a ``message`` output item (its ``output_text``
part added, ``response.output_text.delta`` per piece) or a ``function_call`` item
(``response.function_call_arguments.delta`` per fragment), each item opened with
``response.output_item.added`` and closed (``…done`` events, ``response.output_item.done``)
when the next begins or the reply ends; ``closing(done)`` closes the open item and ends with
``response.completed`` (or ``response.incomplete``, reason ``max_output_tokens``, for a reply
cut at the limit); ``failure(error)`` is an ``error`` event, then ``response.failed`` (the
terminal event clients wait for). Every event carries its ``type``
and a ``sequence_number``. ``body(done)`` is the final ``response`` object, which equals the one
in ``response.completed``; a whole (not streamed) answer feeds all deltas first, so both agree.
``usage`` has ``input_tokens`` (``input_tokens_details.cached_tokens``), ``output_tokens`` and
``total_tokens``, plus the chat answers' ``nexus`` extension. ``store`` says ``stored`` (whether
the server keeps the response); ``previous_response_id`` echoes the request's.

With log probabilities asked (``include``), ``logprob(entry)`` hands over one generated id's
entry (:func:`~.responses.logprob_entry`) before the deltas its text makes: the next text delta
carries every entry handed over since the last one (the ids of text the stop-string scan held
back come with the piece it lets through), in its event's ``logprobs`` and in its part's; the
ids a function call's text is made of belong to no text and are dropped. Without them every
``logprobs`` is empty. It knows nothing about HTTP or how responses are stored.
"""

from __future__ import annotations

import uuid
from typing import Any

from nexus_mlx.server import responses as R
from nexus_mlx.server.protocol import ApiError
from nexus_mlx.server.responses import Completion
from nexus_mlx.server.responses_api_request import ResponsesRequest
from nexus_mlx.server.stream import Delta

Event = dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseWriter:
    """See the module docstring."""

    def __init__(self, request: ResponsesRequest, stored: bool = False) -> None:
        self.request, self.stored = request, stored
        self.id, self.created = _id("resp"), R.now()
        self.output: list[dict[str, Any]] = []  # items, the last one maybe still open
        self.logprobs = request.chat.logprobs  # whether the output text carries them
        self._pending: list[dict[str, Any]] = []  # entries of ids no text has carried yet
        self._open = False
        self._seq = 0

    def logprob(self, entry: dict[str, Any]) -> None:
        """One generated id's entry, before the deltas of its text (module docstring)."""
        if self.logprobs:
            self._pending.append(entry)

    # ---- the stream ---------------------------------------------------------------------
    def opening(self) -> list[Event]:
        shell = self._response("in_progress", None)
        return [self._event("response.created", response=shell),
                self._event("response.in_progress", response=shell)]

    def events(self, deltas: list[Delta]) -> list[Event]:
        out: list[Event] = []
        for delta in deltas:
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
        return out

    def closing(self, done: Completion) -> list[Event]:
        out = self._close(_status(done))
        body = self.body(done)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return [*out, self._event(kind, response=body)]

    def failure(self, error: ApiError) -> list[Event]:
        err = error.body()["error"]
        code = err["code"] or err["type"]
        failed = self._response("failed", None)
        failed["error"] = {"code": code, "message": err["message"]}
        return [self._event("error", code=code, message=err["message"], param=err["param"]),
                self._event("response.failed", response=failed)]

    # ---- the response -------------------------------------------------------------------
    def body(self, done: Completion) -> dict[str, Any]:
        self._close(_status(done))
        return self._response(_status(done), done)

    def _response(self, status: str, done: Completion | None) -> dict[str, Any]:
        r, echo = self.request.chat, self.request.echo
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": None, "model": r.model, "output": list(self.output),
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": echo.get("instructions"), "metadata": echo.get("metadata") or {},
            "max_output_tokens": echo.get("max_output_tokens"),
            "parallel_tool_calls": r.parallel_tool_calls, "temperature": r.temperature,
            "top_p": r.top_p, "text": echo.get("text"), "tool_choice": echo.get("tool_choice"),
            "tools": echo.get("tools"), "top_logprobs": echo.get("top_logprobs"),
            "truncation": "disabled", "store": self.stored,
            "previous_response_id": echo.get("previous_response_id"), "reasoning": None,
            "usage": _usage(done) if done is not None else None,
        }

    # ---- items --------------------------------------------------------------------------
    def _text(self, piece: str) -> list[Event]:
        out: list[Event] = []
        item = self.output[-1] if self._open else None
        if item is None or item["type"] != "message":
            out += self._close()
            item = {"id": _id("msg"), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
            out += self._added(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            out.append(self._event("response.content_part.added", item_id=item["id"],
                                   output_index=len(self.output) - 1, content_index=0,
                                   part=_part_copy(part)))
        carried, self._pending = self._pending, []
        part = item["content"][0]
        part["text"] += piece
        part["logprobs"] += carried
        out.append(self._event("response.output_text.delta", item_id=item["id"],
                               output_index=len(self.output) - 1, content_index=0, delta=piece,
                               logprobs=carried))
        return out

    def _call(self, delta: dict[str, Any]) -> list[Event]:
        function = delta.get("function") or {}
        self._pending = []  # the call's own ids: no text carries them
        if "id" in delta:  # a new call: its name is known
            out = self._close()
            item = {"id": _id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": delta["id"], "name": function.get("name", ""), "arguments": ""}
            return out + self._added(item)
        item = self.output[-1]
        fragment = function.get("arguments", "")
        item["arguments"] += fragment
        return [self._event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=len(self.output) - 1, delta=fragment)]

    def _added(self, item: dict[str, Any]) -> list[Event]:
        self.output.append(item)
        self._open = True
        return [self._event("response.output_item.added", output_index=len(self.output) - 1,
                            item=_copy(item))]

    def _close(self, status: str = "completed") -> list[Event]:
        """Close the open item (``status``: ``incomplete`` for the last one of a reply cut at
        the limit)."""
        if not self._open:
            return []
        self._open = False
        item, index = self.output[-1], len(self.output) - 1
        item["status"] = status
        out: list[Event] = []
        if item["type"] == "message":
            part = item["content"][0]
            out += [self._event("response.output_text.done", item_id=item["id"],
                                output_index=index, content_index=0, text=part["text"],
                                logprobs=list(part["logprobs"])),
                    self._event("response.content_part.done", item_id=item["id"],
                                output_index=index, content_index=0, part=_part_copy(part))]
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, name=item["name"],
                                   arguments=item["arguments"]))
        out.append(self._event("response.output_item.done", output_index=index,
                               item=_copy(item)))
        return out

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event


def _status(done: Completion) -> str:
    return "completed" if done.reply.ended else "incomplete"


def _part_copy(part: dict[str, Any]) -> dict[str, Any]:
    return {**part, "logprobs": list(part["logprobs"])}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "content": [_part_copy(p) for p in item["content"]]} if "content" in item \
        else dict(item)


def _usage(done: Completion) -> dict[str, Any]:
    chat = R.usage(done)
    return {"input_tokens": chat["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"][
                "cached_tokens"]},
            "output_tokens": chat["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["total_tokens"], "nexus": chat["nexus"]}
