"""How each API the server speaks presents one reply: its server-sent events and its whole body.

Contract: an :class:`Answer` is made per request, over the reply's
:class:`~.stream.ReplyAssembler`. ``opening()`` gives the stream's first events, ``deltas(ds)``
the events for the assembler's deltas (``logprob(entry)`` before them hands it the ids' log
probabilities, which the next event carries), ``closing(done)`` the last ones, ``failure(error)`` an
error event once the stream has started; ``whole(done, deltas)`` is the JSON body of an answer
not streamed (``deltas``: what the assembler made of the final text that no ``deltas`` call
has seen). ``follows_tokens`` says whether an answer not streamed must still see the reply id
by id (``logprob`` and ``deltas`` as the stream would call them, their events dropped) before
``whole``: where log probabilities are placed by the text they spell. Events are
``sse_starlette`` dicts (``data``, and ``event`` where the API names its events).

- :class:`ChatAnswer`: ``chat.completion`` / ``chat.completion.chunk`` (:mod:`.responses`): a
  role chunk, the deltas, a ``finish_reason`` chunk, a usage chunk with
  ``stream_options.include_usage``, then ``data: [DONE]``. With ``n`` > 1,
  ``next_choice(assembler, prepared)`` starts the next choice after one has closed: each chunk
  names its choice's ``index``, the usage chunk and ``[DONE]`` follow the last choice only, and
  ``whole`` returns the body of every choice given so far (usage: :func:`~.responses.usage`).
- :class:`ResponsesAnswer`: the Responses API's ``response`` and typed events
  (:mod:`.responses_api_output`); no ``[DONE]``. A finished response (completed or cut at the
  limit; not a failed one) is kept in the :class:`~.response_store.ResponseStore` when the
  request asks for it (``store``), with its conversation: the request's items, then its output.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from nexus_mlx.errors import ArgumentError
from nexus_mlx.server import responses as R
from nexus_mlx.server.engine import Prepared
from nexus_mlx.server.protocol import ApiError, ChatRequest
from nexus_mlx.server.response_store import ResponseStore
from nexus_mlx.server.responses import Completion
from nexus_mlx.server.responses_api_output import ResponseWriter
from nexus_mlx.server.responses_api_request import ResponsesRequest
from nexus_mlx.server.stream import Delta, ReplyAssembler

Sse = dict[str, str]


class Answer(Protocol):
    follows_tokens: bool

    def next_choice(self, assembler: ReplyAssembler, prepared: Prepared) -> None: ...

    def logprob(self, entry: dict[str, Any]) -> None: ...
    def opening(self) -> list[Sse]: ...
    def deltas(self, deltas: list[Delta]) -> list[Sse]: ...
    def closing(self, done: Completion) -> list[Sse]: ...
    def failure(self, error: ApiError) -> list[Sse]: ...
    def whole(self, done: Completion, deltas: list[Delta]) -> dict[str, Any]: ...


class ChatAnswer:
    """Chat completions (module docstring)."""

    follows_tokens = False  # a whole answer's log probabilities are the reply's, in order

    def __init__(self, request: ChatRequest, assembler: ReplyAssembler) -> None:
        self.r, self.assembler = request, assembler
        self.id, self.created = R.completion_id(), R.now()
        self.index = 0  # the choice being answered
        self._choices: list[dict[str, Any]] = []  # the whole answer's finished choices
        self._dones: list[Completion] = []  # the finished choices' replies
        self._logprobs: list[dict[str, Any]] = []  # entries no chunk has carried yet

    def next_choice(self, assembler: ReplyAssembler, prepared: Prepared) -> None:
        self.assembler, self.index, self._logprobs = assembler, self.index + 1, []

    def logprob(self, entry: dict[str, Any]) -> None:
        self._logprobs.append(entry)

    def _chunk(self, delta: Delta, finish: str | None = None) -> Sse:
        carried = self._logprobs if self.r.logprobs else None
        self._logprobs = []
        return {"data": json.dumps(R.chunk_body(self.id, self.created, self.r.model, delta,
                                                finish, with_usage=self.r.include_usage,
                                                logprobs=carried, index=self.index))}

    def opening(self) -> list[Sse]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def deltas(self, deltas: list[Delta]) -> list[Sse]:
        return [self._chunk(d) for d in deltas]

    def closing(self, done: Completion) -> list[Sse]:
        self._dones.append(done)
        out = [self._chunk({}, R.finish_reason(done.reply, bool(self.assembler.tool_calls)))]
        if self.index + 1 < self.r.n:
            return out  # more choices follow
        if self.r.include_usage:
            out.append({"data": json.dumps(R.usage_chunk(self.id, self.created, self.r.model,
                                                         self._dones))})
        return [*out, {"data": "[DONE]"}]

    def failure(self, error: ApiError) -> list[Sse]:
        return [{"data": json.dumps(error.body())}]

    def whole(self, done: Completion, deltas: list[Delta]) -> dict[str, Any]:
        a = self.assembler
        self._dones.append(done)
        self._choices.append(R.choice_body(self.index, a.content, a.tool_calls, done))
        return R.completion_body(self.id, self.created, self.r.model, self._choices,
                                 self._dones)


class ResponsesAnswer:
    """The Responses API (module docstring)."""

    def __init__(self, request: ResponsesRequest, assembler: ReplyAssembler,
                 store: ResponseStore) -> None:
        self.request, self.store = request, store
        self.writer = ResponseWriter(request, stored=request.store and store.enabled)
        self.follows_tokens = self.writer.logprobs  # each text part carries its own ids'

    def _keep(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.writer.stored:
            self.store.put(body, [*self.request.items, *self.writer.output])
        return body

    def logprob(self, entry: dict[str, Any]) -> None:
        self.writer.logprob(entry)

    def next_choice(self, assembler: ReplyAssembler, prepared: Prepared) -> None:
        raise ArgumentError("a response has one choice: the Responses API takes no n")

    @staticmethod
    def _sse(events: list[dict[str, Any]]) -> list[Sse]:
        return [{"event": e["type"], "data": json.dumps(e)} for e in events]

    def opening(self) -> list[Sse]:
        return self._sse(self.writer.opening())

    def deltas(self, deltas: list[Delta]) -> list[Sse]:
        return self._sse(self.writer.events(deltas))

    def closing(self, done: Completion) -> list[Sse]:
        events = self.writer.closing(done)
        self._keep(events[-1]["response"])
        return self._sse(events)

    def failure(self, error: ApiError) -> list[Sse]:
        return self._sse(self.writer.failure(error))

    def whole(self, done: Completion, deltas: list[Delta]) -> dict[str, Any]:
        self.writer.events(deltas)
        return self._keep(self.writer.body(done))
