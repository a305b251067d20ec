"""``POST /v1/completions`` (OpenAI's legacy completions API): a raw prompt continued as is.

Contract: :func:`parse_completions_request` ``(body)`` returns a :class:`CompletionsRequest` (the
:class:`~.protocol.ChatRequest` the engine serves for each prompt, its ``prompt`` set and no
messages, plus ``echo`` and the legacy ``logprobs`` count) or an :class:`~.protocol.ApiError`
(HTTP 400 naming the field). A prompt is a string or token ids (a list of integers); ``prompt``
holds one, or a list of them (a batch: choice ``i * n + j`` is prompt ``i``'s ``j``-th, at most
:data:`~.protocol.MAX_CHOICES` in all). Each is continued without the chat template
(:meth:`~nexus_mlx.agent.session.Session.complete`) on a pooled live session, so a prompt that
extends an earlier one computes only its new tokens. ``max_tokens`` defaults to 16, as
OpenAI's, and may be 0 with ``echo`` (the prompt alone, scored with ``logprobs``: nothing is
generated and no session is taken); ``logprobs`` (0 to 20) asks for each generated token's log
probability with that many alternatives; ``echo`` puts the prompt's text before the
completion, and with ``logprobs`` the prompt's own tokens' log probabilities before the
generated ones' (the first token has none: :mod:`~nexus_mlx.agent.prompt_scoring`, what
evaluation harnesses score continuations by); ``temperature``, ``top_p``, ``seed``, ``stop``,
the penalties, ``logit_bias``, ``n``, ``stream`` and ``stream_options`` read as in chat
completions; ``best_of`` may equal ``n`` (no selection) and ``user`` changes nothing. A
non-empty ``suffix`` asks to fill in the middle between the prompt and it, with the model's FIM
tokens (:mod:`~nexus_mlx.models.fim`; a model without them answers 400 naming ``suffix``).
Refused by name: ``best_of`` above ``n`` (server-side selection) and ``echo`` with a
``suffix``.

:class:`CompletionsAnswer` presents a reply as a ``text_completion`` object, or its stream
chunks (the echoed prompt first, with its scores, so once the reply has begun; then the text
as it is generated, a last chunk with ``finish_reason``, a usage chunk with
``stream_options.include_usage``, ``data: [DONE]``);
``logprobs`` are ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, offsets
counted in characters of the choice's text. It knows nothing about HTTP or generation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nexus_mlx.errors import ArgumentError
from nexus_mlx.server import responses as R
from nexus_mlx.server.engine import Prepared
from nexus_mlx.server.protocol import (
    MAX_CHOICES,
    SAMPLING_CHECKS,
    SHARED_NO_OPS,
    ApiError,
    ChatRequest,
    check_bool,
    check_fields,
    check_positive_int,
    check_top_logprobs,
    head_problem,
    stream_options_problem,
)
from nexus_mlx.server.responses import Completion
from nexus_mlx.server.stream import Delta, ReplyAssembler

DEFAULT_MAX_TOKENS = 16  # OpenAI's, for this API
Prompt = str | tuple[int, ...]
Sse = dict[str, str]


@dataclass(frozen=True)
class CompletionsRequest:
    chat: ChatRequest  # what the engine serves for the first prompt: sampling, n, streaming
    prompts: tuple[Prompt, ...]  # every prompt, in order
    echo: bool = False

    @property
    def logprobs(self) -> int | None:
        """Alternatives per token; None: no log probabilities."""
        return self.chat.top_logprobs if self.chat.logprobs else None

    def chats(self) -> list[ChatRequest]:
        """What the engine serves, prompt by prompt."""
        return [replace(self.chat, prompt=p) for p in self.prompts]


def _one_prompt(value: Any) -> Prompt:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    raise ArgumentError(f"a prompt must be a string or a non-empty list of token ids, got "
                        f"{value!r:.80}")


def _prompts(value: Any) -> tuple[Prompt, ...]:
    """One prompt, or a list of them (strings, or lists of token ids)."""
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        return tuple(_one_prompt(p) for p in value)
    return (_one_prompt(value),)


def _suffix(value: Any) -> str:
    if not isinstance(value, str):
        raise ArgumentError(f"suffix must be a string, got {value!r:.80}")
    return value


def _max_tokens(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(f"max_tokens must be an integer >= 0, got {value!r}")
    return value


def parse_completions_request(body: Any) -> CompletionsRequest | ApiError:
    """The checked request, or its first problem (module docstring)."""
    known = {"model", "prompt", "max_tokens", "logprobs", "echo", "best_of", "suffix",
             *(key for key, _, _ in SAMPLING_CHECKS), *SHARED_NO_OPS}
    problem = head_problem(body, known, SHARED_NO_OPS, "prompt")
    if problem is not None:
        return problem
    values: dict[str, Any] = {"model": body["model"], "max_tokens": DEFAULT_MAX_TOKENS}
    problem = check_fields(body, [
        ("prompt", "prompts", _prompts),
        ("max_tokens", "max_tokens", _max_tokens),
        ("logprobs", "top_logprobs", lambda v: check_top_logprobs(v, "logprobs")),
        ("echo", "echo", lambda v: check_bool(v, "echo")),
        ("best_of", "best_of", lambda v: check_positive_int(v, "best_of")),
        ("suffix", "suffix", _suffix),
        *SAMPLING_CHECKS], values)
    if problem is None:
        problem = stream_options_problem(values) or _unsupported(values)
    if problem is not None:
        return problem
    echo, prompts = values.pop("echo", False), values.pop("prompts")
    values.pop("best_of", None)  # equal to n: no selection
    logprobs = values.get("top_logprobs")
    chat = ChatRequest(messages=[], prompt=prompts[0], logprobs=logprobs is not None,
                       score_prompt=echo and logprobs is not None, **values)
    return CompletionsRequest(chat, prompts, echo)


def _unsupported(values: Mapping[str, Any]) -> ApiError | None:
    """What the checked fields ask that this server cannot do, named."""
    n, best_of = values.get("n", 1), values.get("best_of")
    if len(values["prompts"]) * n > MAX_CHOICES:
        return ApiError(400, f"{len(values['prompts'])} prompts x n={n} choices is more than "
                        f"{MAX_CHOICES}", "prompt")
    if values["max_tokens"] == 0 and not values.get("echo"):
        return ApiError(400, "max_tokens=0 returns nothing without echo", "max_tokens")
    if best_of is not None and best_of < n:
        return ApiError(400, f"best_of must be at least n, got best_of={best_of}, n={n}",
                        "best_of")
    if best_of is not None and best_of > n:
        return ApiError(400, f"best_of={best_of} above n={n} (choosing the best of several "
                        "completions on the server) is not supported; ask for n choices",
                        "best_of", "unsupported_value")
    if values.get("suffix") and values.get("echo"):
        return ApiError(400, "echo cannot be used with a suffix", "echo")
    return None


def legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """Chat-shaped entries (:func:`~.responses.logprob_entry`) as this API's lists; the first
    token's text starts at character ``offset`` of the choice's text."""
    tokens = [e["token"] for e in entries]
    starts = []
    for token in tokens:
        starts.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [None if e["top_logprobs"] is None
                             else {t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in entries],
            "text_offset": starts}


class CompletionsAnswer:
    """``text_completion`` objects and stream chunks (module docstring)."""

    follows_tokens = False  # a whole answer's log probabilities are the reply's, in order

    def __init__(self, request: CompletionsRequest, assembler: ReplyAssembler,
                 prompt_text: str) -> None:
        self.r, self.assembler, self.prompt_text = request, assembler, prompt_text
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", R.now()
        self.index = 0  # the choice being answered
        self._choices: list[dict[str, Any]] = []
        self._dones: list[Completion] = []
        self._logprobs: list[dict[str, Any]] = []  # entries no chunk has carried yet
        self._prompt_logprobs: list[dict[str, Any]] = []  # a scored prompt's, for its echo
        self._echo_pending = request.echo  # the echo chunk comes before any other
        self._offset = 0  # where the next carried token starts in the choice's text
        self.total = len(request.prompts) * request.chat.n  # choices in all

    def next_choice(self, assembler: ReplyAssembler, prepared: Prepared) -> None:
        self.assembler, self.index, self._logprobs = assembler, self.index + 1, []
        self._prompt_logprobs, self._echo_pending, self._offset = [], self.r.echo, 0
        self.prompt_text = prepared.prompt_text

    def logprob(self, entry: dict[str, Any]) -> None:
        if entry.get("prompt"):
            self._prompt_logprobs.append({k: v for k, v in entry.items() if k != "prompt"})
        else:
            self._logprobs.append(entry)

    def _chunks(self, text: str, finish: str | None = None) -> list[Sse]:
        """The pending echo's chunk (the prompt and its scores), then this one."""
        out = []
        if self._echo_pending:
            self._echo_pending = False
            out.append(self._chunk(self.prompt_text, None, self._prompt_logprobs))
        return [*out, self._chunk(text, finish, self._logprobs)]

    def _chunk(self, text: str, finish: str | None, entries: list[dict[str, Any]]) -> Sse:
        carried = None
        if self.r.logprobs is not None:
            carried = legacy_logprobs(entries, self._offset)
            self._offset += sum(len(e["token"]) for e in entries)
        entries.clear()
        body = self._body([{"text": text, "index": self.index, "logprobs": carried,
                            "finish_reason": finish}])
        if self.r.chat.include_usage:
            body["usage"] = None
        return {"data": json.dumps(body)}

    def _body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A ``text_completion`` object (a stream chunk or the whole answer)."""
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.r.chat.model, "choices": choices, **extra}

    def opening(self) -> list[Sse]:
        return []  # the echo waits for the prompt's scores, which come with the reply

    def deltas(self, deltas: list[Delta]) -> list[Sse]:
        return [c for d in deltas if d.get("content") for c in self._chunks(d["content"])]

    def closing(self, done: Completion) -> list[Sse]:
        self._dones.append(done)
        out = self._chunks("", R.finish_reason(done.reply, False))
        if self.index + 1 < self.total:
            return out  # more choices follow
        if self.r.chat.include_usage:
            out.append({"data": json.dumps(self._body([], usage=R.usage(*self._dones)))})
        return [*out, {"data": "[DONE]"}]

    def failure(self, error: ApiError) -> list[Sse]:
        return [{"data": json.dumps(error.body())}]

    def whole(self, done: Completion, deltas: list[Delta]) -> dict[str, Any]:
        self._dones.append(done)
        echoed = self.prompt_text if self.r.echo else ""
        logprobs = None  # with echo, the prompt's scores come first
        if self.r.logprobs is not None:
            logprobs = legacy_logprobs([*(done.prompt_logprobs or []), *(done.logprobs or [])],
                                       0)
        self._choices.append({"text": echoed + self.assembler.content, "index": self.index,
                              "logprobs": logprobs,
                              "finish_reason": R.finish_reason(done.reply, False)})
        return self._body(self._choices, usage=R.usage(*self._dones))
