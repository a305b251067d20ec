"""The HTTP surface: a Starlette app with OpenAI's chat-completions, completions and Responses
routes over an :class:`Engine`.

Contract: ``build_app(engine, model_names, executor, store)`` serves

- ``POST /v1/chat/completions``: the body is checked (:mod:`.protocol`), the model named must be
  one of ``model_names`` (else HTTP 404 ``model_not_found``), the conversation is rendered and
  fitted (:meth:`Engine.prepare`); any problem is an HTTP 400 with an OpenAI error body, before
  any generation. Then the reply is generated in a worker thread (the model is not async) and
  answered whole (``chat.completion``) or, with ``stream``, as server-sent events
  (``chat.completion.chunk``: the role, content pieces, incremental tool calls, a last chunk
  with ``finish_reason``, a usage chunk with ``stream_options.include_usage``, then
  ``data: [DONE]``). Both answers assemble the reply the same way (:mod:`.stream`). With ``n``
  > 1 the choices are generated one after another on the same live session (each later one
  reuses the prompt's rows) and streamed one after another, each chunk naming its ``index``.
- ``POST /v1/completions``: the legacy completions API, a raw prompt (or a batch of them, each
  checked before any is generated, their choices in order) continued without the chat template
  (:mod:`.completions_api`), served and answered the same way (``text_completion`` objects or
  chunks).
- ``POST /v1/responses``: the Responses API, read as the chat request it asks for
  (:mod:`.responses_api_request`) and served the same way; answered as a ``response`` object or
  its typed events (:mod:`.answers`). Finished responses are kept in ``store``
  (:mod:`.response_store`), so ``previous_response_id`` can continue one;
  ``GET /v1/responses/{id}`` reads one back, ``GET /v1/responses/{id}/input_items`` lists
  the items it answered (``after``, ``limit``, ``order``: :mod:`.response_store`)
  and ``DELETE /v1/responses/{id}`` forgets it (an unknown id: HTTP 404).
- ``GET /v1/models`` (and ``/v1/models/{id}``), ``GET /health`` (the engine's counters, heap
  trims and MLX's memory, the pool's sessions and bytes, and how many responses are stored).

A client that goes away stops its generation at the next token (streamed: the stream's end;
whole: a disconnect poll). A failure inside generation is answered 500 (``server_error``), or as
an error event once a stream has started; no request can stop the server. Unknown routes and
methods answer OpenAI-style errors too. It knows nothing about sockets or uvicorn
(:mod:`.runner`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nexus_mlx.errors import ArgumentError, NexusError
from nexus_mlx.server import responses as R
from nexus_mlx.server.answers import Answer, ChatAnswer, ResponsesAnswer
from nexus_mlx.server.completions_api import CompletionsAnswer, parse_completions_request
from nexus_mlx.server.engine import Engine, Prepared
from nexus_mlx.server.protocol import ApiError, ChatRequest, parse_chat_request
from nexus_mlx.server.response_store import DEFAULT_PAGE_ITEMS, ResponseStore, input_items_page
from nexus_mlx.server.responses import Completion
from nexus_mlx.server.responses_api_request import parse_responses_request, responses_error
from nexus_mlx.server.stream import ReplyAssembler

log = logging.getLogger("nexus_mlx.server")
DISCONNECT_POLL_S = 0.25
_END = object()  # the stream queue's end marker


def _error(err: ApiError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _internal(exc: BaseException) -> ApiError:
    if isinstance(exc, (NexusError, ValueError)):  # a request the checks let through
        if not isinstance(exc, NexusError):  # a ValueError may be our bug: leave a trace
            log.warning("answered 400 for a ValueError", exc_info=exc)
        return ApiError(400, str(exc))
    log.exception("generation failed", exc_info=exc)
    return ApiError(500, f"the server failed while generating: {type(exc).__name__}: {exc}",
                    type="server_error")


@dataclass(frozen=True)
class Api:
    """One API over the engine: how its body is read, and how its reply is answered."""

    parse: Callable[[Any], Any]  # body -> its request, or an ApiError
    chats: Callable[[Any], list[ChatRequest]]  # its request -> what the engine serves, in order
    answer: Callable[[Any, ReplyAssembler, Prepared], Answer]
    error: Callable[[ApiError], ApiError] = lambda e: e  # the engine's error, in its field names


CHAT = Api(parse_chat_request, lambda r: [r], lambda r, assembler, _: ChatAnswer(r, assembler))
COMPLETIONS = Api(parse_completions_request, lambda r: r.chats(),
                  lambda r, assembler, prepared: CompletionsAnswer(r, assembler,
                                                                   prepared.prompt_text))


def responses_api(store: ResponseStore) -> Api:
    """The Responses API over ``store``: what ``previous_response_id`` continues, and where
    finished responses are kept."""
    def previous(response_id: str) -> tuple[Any, ...] | None:
        found = store.get(response_id)
        return None if found is None else found.items

    return Api(lambda body: parse_responses_request(body, previous), lambda r: [r.chat],
               lambda r, assembler, _: ResponsesAnswer(r, assembler, store), responses_error)


class GenerationHandler:
    """``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` (see the module
    docstring)."""

    def __init__(self, api: Api, engine: Engine, model_names: list[str],
                 executor: Executor) -> None:
        self.api, self.engine, self.model_names, self.executor = api, engine, model_names, executor

    async def handle(self, request: Request) -> Response:
        arrived = time.perf_counter()
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError) as exc:  # too deeply nested: RecursionError
            return _error(ApiError(400, f"the request body is not valid JSON: {exc}"))
        parsed = self.api.parse(body)
        if isinstance(parsed, ApiError):
            return _error(parsed)
        chats = self.api.chats(parsed)
        model = chats[0].model
        if model not in self.model_names:
            return _error(ApiError(404, f"The model `{model}` does not exist; this "
                                   f"server serves {self.model_names}", "model",
                                   "model_not_found"))
        loop = asyncio.get_running_loop()
        prepareds: list[Prepared] = []
        for part, chat in enumerate(chats):  # every part checked before any generation
            try:
                prepared = await loop.run_in_executor(self.executor, self.engine.prepare, chat,
                                                      arrived)
            except Exception as exc:
                return _error(_internal(exc))
            if isinstance(prepared, ApiError):
                named = self.api.error(prepared)
                if len(chats) > 1:  # which of a batch's prompts
                    named = replace(named, message=f"prompt {part}: {named.message}")
                return _error(named)
            prepareds.append(prepared)
        jobs = [(p, choice) for p in prepareds for choice in range(p.request.n)]
        assembler = _assembler(chats[0])
        answer = self.api.answer(parsed, assembler, prepareds[0])
        if chats[0].stream:
            return EventSourceResponse(self._events(jobs, assembler, answer), ping=15)
        return await self._whole(request, jobs, assembler, answer)

    async def _whole(self, request: Request, jobs: list[tuple[Prepared, int]],
                     assembler: ReplyAssembler, answer: Answer) -> Response:
        cancel = threading.Event()
        watcher = asyncio.create_task(_watch_disconnect(request, cancel))
        loop = asyncio.get_running_loop()
        body: dict[str, Any] = {}
        done: Completion | None = None
        try:
            for k, (prepared, choice) in enumerate(jobs):
                if k:
                    assembler = _next_assembler(answer, prepared)
                trace: list[Any] = []  # each id's log probabilities, then the text so far
                follow = trace.append if answer.follows_tokens else None
                done = await loop.run_in_executor(self.executor, self.engine.complete,
                                                  prepared, follow, cancel, follow, choice)
                if done is None:  # the client went away, or the server is stopping
                    break
                for item in trace:
                    _follow(answer, assembler, item)
                body = answer.whole(done, assembler.finish(done.reply.text, done.reply.ended))
        except Exception as exc:
            return _error(_internal(exc))
        finally:
            watcher.cancel()
        if done is None:
            if await request.is_disconnected():
                return _error(ApiError(499, "the client closed the request", type="cancelled"))
            return _error(ApiError(503, "the generation was cancelled: the server is stopping",
                                   type="server_error"))
        return JSONResponse(body)

    async def _events(self, jobs: list[tuple[Prepared, int]], assembler: ReplyAssembler,
                      answer: Answer) -> AsyncIterator[dict[str, str]]:
        cancel = threading.Event()
        try:
            for k, (prepared, choice) in enumerate(jobs):
                if k:
                    assembler = _next_assembler(answer, prepared)
                for event in answer.opening():
                    yield event
                async for event in self._choice_events(prepared, assembler, answer, cancel,
                                                       choice):
                    yield event
                if cancel.is_set():  # the choice failed: its events ended the stream
                    return
        finally:
            cancel.set()  # a no-op after a full reply; stops a generation the client left

    async def _choice_events(self, prepared: Prepared, assembler: ReplyAssembler,
                             answer: Answer, cancel: threading.Event, choice: int
                             ) -> AsyncIterator[dict[str, str]]:
        """One choice's events, as it is generated; ``cancel`` is set when it failed."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[Any] = asyncio.Queue()

        def push(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(updates.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody is listening
                cancel.set()

        def run() -> Completion | None:
            try:
                return self.engine.complete(prepared, push, cancel, push, choice)
            finally:
                push(_END)

        job = loop.run_in_executor(self.executor, run)
        job.add_done_callback(lambda f: f.cancelled() or f.exception())  # always retrieved
        while (item := await updates.get()) is not _END:
            for event in _follow(answer, assembler, item):
                yield event
        done: Completion | None = None
        try:
            done = await job
        except Exception as exc:
            failure = answer.failure(_internal(exc))
        else:  # None: cancelled while the client listens, so the server is stopping
            failure = [] if done is not None else answer.failure(ApiError(
                503, "the generation was cancelled: the server is stopping",
                type="server_error"))
        if done is None:
            cancel.set()
            for event in failure:
                yield event
            return
        for event in [*answer.deltas(assembler.finish(done.reply.text, done.reply.ended)),
                      *answer.closing(done)]:
            yield event


def _assembler(chat: ChatRequest) -> ReplyAssembler:
    return ReplyAssembler(calls=chat.calls_allowed, stop=chat.stop)


def _next_assembler(answer: Answer, prepared: Prepared) -> ReplyAssembler:
    """A new assembler for the answer's next choice (of ``prepared``)."""
    assembler = _assembler(prepared.request)
    answer.next_choice(assembler, prepared)
    return assembler


def _follow(answer: Answer, assembler: ReplyAssembler, item: Any) -> list[dict[str, str]]:
    """The events of one thing the engine reported: an id's log probabilities (a dict, before
    its text), or the reply's text so far."""
    if isinstance(item, dict):
        answer.logprob(item)
        return []
    return answer.deltas(assembler.feed(item))


async def _watch_disconnect(request: Request, cancel: threading.Event) -> None:
    while not cancel.is_set():
        if await request.is_disconnected():
            cancel.set()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


def _int_param(value: str | None, default: int, name: str) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ArgumentError(f"{name} must be an integer, got {value!r:.40}") from None


def build_app(engine: Engine, model_names: list[str], executor: Executor,
              store: ResponseStore | None = None) -> Starlette:
    """The Starlette app (see the module docstring); ``store``: a default one if None."""
    started = R.now()
    store = ResponseStore() if store is None else store
    chat = GenerationHandler(CHAT, engine, model_names, executor)
    completions = GenerationHandler(COMPLETIONS, engine, model_names, executor)
    responses = GenerationHandler(responses_api(store), engine, model_names, executor)

    async def models(request: Request) -> Response:
        return JSONResponse(R.models_body(model_names, started))

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in model_names:
            return _error(ApiError(404, f"The model `{name}` does not exist", "model",
                                   "model_not_found"))
        return JSONResponse(R.model_body(name, started))

    async def stored(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        if request.method == "DELETE" and store.delete(response_id):
            return JSONResponse({"id": response_id, "object": "response.deleted",
                                 "deleted": True})
        found = store.get(response_id) if request.method == "GET" else None
        if found is None:
            return _error(ApiError(404, f"Response with id {response_id!r:.80} not found.",
                                   "response_id", "not_found"))
        return JSONResponse(found.body)

    async def input_items(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        found = store.get(response_id)
        if found is None:
            return _error(ApiError(404, f"Response with id {response_id!r:.80} not found.",
                                   "response_id", "not_found"))
        query = request.query_params
        try:
            limit = _int_param(query.get("limit"), DEFAULT_PAGE_ITEMS, "limit")
            page = input_items_page(found, query.get("after"), limit,
                                    query.get("order", "desc"))
        except ArgumentError as exc:
            return _error(ApiError(400, str(exc)))
        return JSONResponse(page)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "models": model_names, **engine.stats(),
                             "stored_responses": len(store)})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        headers = exc.headers if isinstance(exc, HTTPException) else None  # 405: Allow
        return _error(ApiError(status, f"{request.method} {request.url.path}: {detail}"), headers)

    routes = [
        Route("/v1/chat/completions", chat.handle, methods=["POST"]),
        Route("/v1/completions", completions.handle, methods=["POST"]),
        Route("/v1/responses", responses.handle, methods=["POST"]),
        Route("/v1/responses/{response_id}", stored, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
