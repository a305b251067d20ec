"""The server's model side: checked requests in, replies out, on the MLX thread.

Contract: ``Engine(model, tokenizer, policy=..., budget=..., max_sessions=...,
cache_budget=..., max_tokens=..., tool_blocks=True)`` owns one loaded model and a
:class:`SessionPool` of live sessions over it; under policy ``repair`` its sessions share
compiled tool blocks (:mod:`~nexus_mlx.agent.tool_blocks`, compiled at a tool's first sight, so
a reply never depends on other conversations' traffic), spliced where a request's tool
definitions are new to its session. Both calls block and are meant for worker threads:

- ``prepare(request)`` renders the conversation with the model's chat template (a raw
  ``prompt``, the completions API's, is encoded as it is, or its ids checked against the
  vocabulary, and laid out with its ``suffix`` between the model's fill-in-the-middle tokens
  when it has one; its text is kept for ``echo``) and checks what only the model can: that the
  template renders it, that it fits the context (with the asked
  ``max_tokens``: HTTP 400 ``context_length_exceeded``, as OpenAI answers), that the tools'
  schemas and the ``response_format`` compile to grammars. It returns a :class:`Prepared`
  request or an :class:`ApiError`; nothing is cached yet.
- With ``heal_after_reply=True`` (policy ``repair``), each reply queues a heal of its session's
  stale rows (:meth:`~nexus_mlx.agent.session.Session.heal`) on the MLX thread right after it
  is produced and before it is returned, so the next request of that conversation, queued later,
  finds an exact cache while the client was busy (running the tools the reply asked for);
  requests on other sessions may wait behind it. Healed rows and failed heals are counted in
  ``stats()``; a failed heal leaves the session as it was (its transaction) and is not the
  request's error. After a reply, when ``trim_heap_s`` seconds (default
  :data:`DEFAULT_TRIM_HEAP_S`; None: never) have passed since the last trim, a trim of the C
  heap (:func:`~nexus_mlx._platform.heap.trim_heap`) is queued on the MLX thread the same way:
  the free pages that many requests' allocations leave in glibc's heaps go back to the OS
  instead of growing the RSS turn by turn. Trims and their time are counted in ``stats()``,
  beside MLX's live arrays and its cache of freed buffers (bytes). Once no request has been in
  flight for ``idle_release_s`` seconds (default :data:`DEFAULT_IDLE_RELEASE_S`; None: never),
  the prompt scorer forgets its last prompt, MLX's buffer cache is cleared and the heap
  trimmed (with trims on), once per idle period (:mod:`.idle`; counted as ``idle_releases``).
  ``close()`` stops that watch. ``guard`` (nats; default
  :data:`~nexus_mlx.agent.session.DEFAULT_GUARD`; 0 or None: off) is the sessions' close-call
  guard: stale rows are healed before a token whose top two logits are that close
  (:class:`~nexus_mlx.agent.session.Session`).
- ``complete(prepared, on_text, cancel, on_logprob, choice)`` takes a pooled session (the one
  whose cache keeps the most of this conversation, :mod:`.pool`), generates (a raw prompt with
  :meth:`~nexus_mlx.agent.session.Session.complete`) under the request's constraint, sampler
  (greedy at temperature 0; ``choice``, default 0, picks the seed's stream:
  :func:`~.sampling.make_sampler`) and logits processors, calls ``on_logprob(entry)`` (with
  ``logprobs`` asked: :func:`~.responses.logprob_entry`) and then ``on_text(text_so_far)``
  after each token, and returns a :class:`Completion`, or None when ``cancel`` was set (the
  generation stops at the next token; the session keeps what it cached and goes back to the
  pool). A raw prompt asked to be scored (``score_prompt``: ``echo`` with ``logprobs``) is
  scored first by the engine's :class:`~nexus_mlx.agent.prompt_scoring.PromptScorer`, which
  reuses the last scored prompt's common prefix (rows counted in ``stats()``; the K/V it keeps
  counts in ``cache_budget`` beside the sessions', and is dropped when it alone passes it), its
  entries handed to ``on_logprob`` marked ``"prompt"``; with ``max_tokens`` 0 that is all: no
  session is taken and nothing is generated.
- With ``session_dir``, the pool's sessions outlive the process (:mod:`.session_store`): those
  saved there are restored when the engine is built, the changed ones are saved at each idle
  release (a checkpoint) and by ``save_sessions()`` (a server's stop); restored sessions and
  refused files are counted in ``stats()``. ``on_idle()``, when given, runs at each idle release
  after that save (a server saves its stored responses there).

Every MLX computation, tokenizer call included, runs on the process's MLX thread
(:mod:`nexus_mlx._platform.mlx_thread`), one at a time, in arrival order: requests on different
sessions overlap in waiting, parsing and streaming, not in model evaluation, so each reply is the
one a lone client would get. With ``interleave`` (the default) the replies being decoded take
turns there token by token (:func:`~nexus_mlx._platform.mlx_thread.drive_on_mlx_thread`): a
request that arrives while another reply is decoded has its prompt computed and its tokens
decoded between that reply's tokens, rather than after its last one; ``interleave=False``
decodes each reply to its end before the next request's turn. ``cancel_all()`` sets every
in-flight request's cancel event (server shutdown). It knows nothing about HTTP.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx._platform.heap import HeapTrimmer
from nexus_mlx._platform.mlx_thread import (
    drive_on_mlx_thread,
    run_on_mlx_thread,
    run_steps,
    submit_to_mlx_thread,
)
from nexus_mlx.agent.alignment import common_prefix
from nexus_mlx.agent.prompt_scoring import PromptScorer
from nexus_mlx.agent.session import (
    DEFAULT_GUARD,
    Policy,
    Reply,
    Session,
    StepReport,
    TokenLogprob,
)
from nexus_mlx.agent.session_file import template_digest
from nexus_mlx.agent.tool_blocks import ToolBlocks
from nexus_mlx.decode.certified_head import CertifiedHead
from nexus_mlx.decode.lookahead import DEFAULT_DRAFT_TOKENS
from nexus_mlx.decode.name_fsm import token_bytes, vocab_of
from nexus_mlx.decode.turn_constraint import turn_constraint
from nexus_mlx.errors import ArgumentError, ToolError
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.fim import fim_prompt
from nexus_mlx.server.idle import IdleRelease
from nexus_mlx.server.pool import SessionPool
from nexus_mlx.server.protocol import ApiError, ChatRequest
from nexus_mlx.server.responses import Completion, logprob_entry
from nexus_mlx.server.sampling import make_logits_processors, make_sampler
from nexus_mlx.server.session_store import SessionStore, StoreReport

DEFAULT_MAX_TOKENS = 512
DEFAULT_TRIM_HEAP_S = 10.0
DEFAULT_IDLE_RELEASE_S = 60.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    request: ChatRequest
    ids: np.ndarray  # the rendered conversation, the assistant's turn opened
    max_tokens: int
    arrived: float  # time.perf_counter() when the request arrived
    prompt_text: str = ""  # a raw prompt's text (what ``echo`` repeats); "" for a chat


class Engine:
    """See the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, *, policy: Policy = "repair",
                 budget: float = 5.0, max_sessions: int = 8, cache_budget: int = 2 << 30,
                 max_tokens: int = DEFAULT_MAX_TOKENS, tool_blocks: bool = True,
                 heal_after_reply: bool = False,
                 guard: float | None = DEFAULT_GUARD,
                 draft_tokens: int = DEFAULT_DRAFT_TOKENS,
                 trim_heap_s: float | None = DEFAULT_TRIM_HEAP_S,
                 idle_release_s: float | None = DEFAULT_IDLE_RELEASE_S,
                 session_dir: str | os.PathLike[str] | None = None,
                 on_idle: Callable[[], None] | None = None, interleave: bool = True) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ArgumentError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.model, self.tokenizer, self.max_tokens = model, tokenizer, max_tokens
        self.policy, self.budget, self.guard = policy, budget, guard
        self.draft_tokens, self.interleave = draft_tokens, bool(interleave)
        self.heal_after_reply = bool(heal_after_reply) and policy == "repair"
        try:
            self.trimmer = None if trim_heap_s is None else HeapTrimmer(trim_heap_s)
        except ValueError as exc:
            raise ArgumentError(f"trim_heap_s: {exc}") from None
        try:
            self.idle = None if idle_release_s is None else IdleRelease(
                idle_release_s, self._release_idle_memory, self._busy)
        except ValueError as exc:
            raise ArgumentError(f"idle_release_s: {exc}") from None
        # the renderer checks the policy and budget once; it never steps
        self.blocks: ToolBlocks | None = None
        self._renderer: Session = run_on_mlx_thread(self._new_session)
        if tool_blocks and policy == "repair":  # compiled at first sight: order-independent
            self.blocks = run_on_mlx_thread(lambda: ToolBlocks(
                model, self._renderer.render, template_digest(tokenizer), source="compile"))
        self.context = self._renderer.max_positions
        self._vocab_size = model_plan(model).vocab_size  # the logits' width
        run_on_mlx_thread(lambda: CertifiedHead.of(model))  # built now, not in a first reply
        self._scorer: PromptScorer | None = None  # raw prompts' scores (made on first use)
        self.pool = SessionPool(self._new_session, max_sessions=max_sessions,
                                cache_budget=cache_budget, run=run_on_mlx_thread,
                                held_elsewhere=lambda: self._scorer.nbytes if self._scorer else 0)
        self._lock = threading.Lock()
        self._inflight: set[threading.Event] = set()
        self.served = self.cancelled = self.failed = 0
        self.healed_rows = self.heal_failures = 0
        self.store = None if session_dir is None else SessionStore(session_dir)
        self.on_idle = on_idle  # what else the caller saves at an idle release
        self.restored, self.saved = StoreReport(), StoreReport()  # sessions from / to disk
        if self.store is not None:
            self.restored = run_on_mlx_thread(self.store.restore, self.pool, model, tokenizer,
                                              self._new_session)

    def _new_session(self) -> Session:
        return Session(self.model, self.tokenizer, policy=self.policy, budget=self.budget,
                       blocks=self.blocks, guard=self.guard, draft_tokens=self.draft_tokens)

    # ---- checking -----------------------------------------------------------------------
    def prepare(self, request: ChatRequest, arrived: float | None = None) -> Prepared | ApiError:
        arrived = time.perf_counter() if arrived is None else arrived
        return run_on_mlx_thread(self._prepare, request, arrived)

    def _prompt(self, request: ChatRequest) -> tuple[list[int], str] | ApiError:
        """The ids the request asks to continue and a raw prompt's text: the rendered
        conversation (the assistant's turn opened), or the raw prompt's ids as they are."""
        prompt = request.prompt
        if prompt is None:
            try:
                return self._renderer.render(request.messages, request.tools or None), ""
            except ArgumentError as exc:
                return ApiError(400, str(exc), "messages")
        if isinstance(prompt, str):
            ids, text = list(self.tokenizer.encode(prompt)), prompt
        else:
            outside = [i for i in prompt if not 0 <= i < self._vocab_size]
            if outside:
                return ApiError(400, f"the prompt names token ids outside the vocabulary (size "
                                f"{self._vocab_size}): {outside[:5]}", "prompt")
            ids, text = list(prompt), self.tokenizer.decode(list(prompt))
        if request.suffix:
            fim = fim_prompt(self.tokenizer, ids, request.suffix)
            if fim is None:
                return ApiError(400, "this model's vocabulary has no fill-in-the-middle tokens "
                                "(<|fim_prefix|>, <fim_prefix>, ...): it cannot take a suffix",
                                "suffix", "unsupported_value")
            return fim, text
        if not ids:
            return ApiError(400, "the prompt is empty: it encodes to no tokens", "prompt")
        return ids, text

    def _prepare(self, request: ChatRequest, arrived: float) -> Prepared | ApiError:
        prompt = self._prompt(request)
        if isinstance(prompt, ApiError):
            return prompt
        ids, prompt_text = prompt
        where = "messages" if request.prompt is None else "prompt"
        outside = sorted(i for i in request.logit_bias if i >= self._vocab_size)
        if outside:
            return ApiError(400, f"logit_bias names token ids outside the vocabulary "
                            f"(size {self._vocab_size}): {outside[:5]}", "logit_bias")
        n, limit = len(ids), self.context
        if n >= limit:
            return ApiError(400, f"This model's maximum context length is {limit} tokens. "
                            f"However, your {where} resulted in {n} tokens.", where,
                            "context_length_exceeded")
        if request.max_tokens is not None and n + request.max_tokens > limit:
            return ApiError(400, f"This model's maximum context length is {limit} tokens. "
                            f"However, you requested {n + request.max_tokens} tokens ({n} in "
                            f"the {where}, {request.max_tokens} in the completion).",
                            "max_tokens", "context_length_exceeded")
        eos = self._renderer.eos_token_ids
        for param, tools, choice, fmt in (
                ("tools", request.tools, request.tool_choice, None),
                ("response_format", (), "auto", request.response_format)):
            if not tools and fmt is None:
                continue
            try:
                turn_constraint(self.tokenizer, tools, choice, request.parallel_tool_calls, fmt,
                                eos)
            except (ToolError, ArgumentError) as exc:
                return ApiError(400, str(exc), param)
        max_tokens = (min(self.max_tokens, limit - n) if request.max_tokens is None
                      else request.max_tokens)
        return Prepared(request, np.asarray(ids, dtype=np.int64), max_tokens, arrived,
                        prompt_text)

    # ---- generating ---------------------------------------------------------------------
    def complete(self, prepared: Prepared, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None,
                 on_logprob: Callable[[dict[str, Any]], None] | None = None,
                 choice: int = 0) -> Completion | None:
        cancel = threading.Event() if cancel is None else cancel
        with self._lock:
            self._inflight.add(cancel)
        try:
            if prepared.max_tokens == 0:  # a raw prompt echoed (and scored): no session needed
                return self._echo_only(prepared, on_logprob)
            entry = self.pool.acquire(prepared.ids, cancel.is_set)
            if entry is None:
                self._count_cancelled()
                return None
            try:
                steps = self._generate(entry.session, prepared, on_text, cancel, on_logprob,
                                       choice)
                reply, started, logprobs, scored = (
                    drive_on_mlx_thread(steps) if self.interleave
                    else run_on_mlx_thread(run_steps, steps))
            except CancelledError:
                self._count_cancelled()
                return None
            except BaseException:
                with self._lock:
                    self.failed += 1
                raise
            else:
                if self.heal_after_reply:
                    self._heal_later(entry.session)
                if self.trimmer is not None and self.trimmer.claim():
                    submit_to_mlx_thread(self.trimmer.trim)
            finally:
                self.pool.release(entry)
            with self._lock:
                self.served += 1
            return Completion(reply, entry.id, started - prepared.arrived, logprobs, scored)
        finally:
            with self._lock:
                self._inflight.discard(cancel)
            if self.idle is not None:
                self.idle.activity()

    def _echo_only(self, prepared: Prepared,
                   on_logprob: Callable[[dict[str, Any]], None] | None) -> Completion:
        """A raw prompt returned as it is, scored when asked (``max_tokens`` 0): its
        report's path is ``"score"`` and it computed the prompt's rows only to score them."""
        started = time.perf_counter()
        score = prepared.request.score_prompt
        try:
            scored = (run_on_mlx_thread(self._scored_prompt, prepared, on_logprob) if score
                      else None)
            if score:
                run_on_mlx_thread(self._bound_scorer)
                self.pool.fit()
        except BaseException:
            with self._lock:
                self.failed += 1
            raise
        n = len(prepared.ids)
        report = StepReport("score", "max_tokens 0: the prompt echoed"
                            + (", scored in one pass" if score else ""),
                            n, 0, 0, 0, n if score else 0, 0)
        reply = Reply("", [], "length", report, time.perf_counter() - started, 0.0)
        with self._lock:
            self.served += 1
        return Completion(reply, None, started - prepared.arrived, None, scored)

    def _heal_later(self, session: Session) -> None:
        """Queue a heal of ``session`` on the MLX thread (ahead of any later request)."""
        submit_to_mlx_thread(session.heal).add_done_callback(self._healed)

    def _healed(self, future: Future[int]) -> None:
        exc = future.exception()
        with self._lock:
            if exc is None:
                self.healed_rows += int(future.result())
            else:
                self.heal_failures += 1
        if exc is not None:
            log.warning("healing a session after its reply failed: %s", exc)

    def _count_cancelled(self) -> None:
        with self._lock:
            self.cancelled += 1

    def _generate(self, session: Session, prepared: Prepared,
                  on_text: Callable[[str], None] | None, cancel: threading.Event,
                  on_logprob: Callable[[dict[str, Any]], None] | None, choice: int
                  ) -> Generator[None, None, tuple[Any, float, list[dict[str, Any]] | None,
                                                   list[dict[str, Any]] | None]]:
        """The request's reply, decoded by the session as steps (a yield between tokens), with
        when its first step began, its log probabilities and its scored prompt (MLX thread)."""
        started = time.perf_counter()
        if cancel.is_set():
            raise CancelledError("cancelled before it started")
        r = prepared.request
        scored = self._scored_prompt(prepared, on_logprob) if r.score_prompt else None

        def on_token(_token: int, text: str) -> None:
            if cancel.is_set():
                raise CancelledError("the client went away")
            if on_text is not None:
                on_text(text)

        entries: list[dict[str, Any]] = []

        def shape(scored: TokenLogprob) -> None:  # each id's entry, made once, sent as made
            entries.append(logprob_entry(scored, lambda t: token_bytes(self.tokenizer, t)))
            if on_logprob is not None:
                on_logprob(entries[-1])

        options: dict[str, Any] = dict(
            max_tokens=prepared.max_tokens, stop=r.stop,
            sampler=make_sampler(r.temperature, r.top_p, r.seed, choice), on_token=on_token,
            logits_processors=make_logits_processors(r.frequency_penalty, r.presence_penalty,
                                                     r.logit_bias),
            logprobs=r.top_logprobs if r.logprobs else None, on_logprob=shape)
        if r.prompt is not None:  # a raw completion: the ids as they are
            if scored is not None:
                self._seed_from_scorer(session, prepared.ids)
                self._bound_scorer()
            reply = yield from session.complete_steps(prepared.ids, **options)
        else:
            reply = yield from session.generate_steps(
                r.messages, r.tools or None, tool_choice=r.tool_choice,
                parallel_tool_calls=r.parallel_tool_calls, response_format=r.response_format,
                prediction=r.prediction, **options)
        return reply, started, entries if r.logprobs else None, scored

    def _seed_from_scorer(self, session: Session, ids: np.ndarray) -> None:
        """Give ``session`` the scorer's rows of ``ids`` where it keeps fewer of them, so a
        scored prompt that is then continued is computed once (the rows are exact)."""
        scorer = self._scorer
        if scorer is None or scorer.cache is None:
            return
        rows = scorer.rows_for(ids)
        if rows > common_prefix(session.tokens, ids):
            session.copy_prefix(scorer.cache, rows)

    def _bound_scorer(self) -> None:
        """Drop the scorer's kept prompt when it alone passes the cache budget (its bytes count
        in the budget beside the sessions'; MLX thread)."""
        if self._scorer is not None and self._scorer.nbytes > self.pool.cache_budget:
            self._scorer.forget()

    def _scored_prompt(self, prepared: Prepared,
                       on_logprob: Callable[[dict[str, Any]], None] | None
                       ) -> list[dict[str, Any]]:
        """A raw prompt's entries id by id (the first has no log probability), each handed to
        ``on_logprob`` marked ``"prompt": True`` before any reply id's."""
        ids, spell = prepared.ids, lambda t: token_bytes(self.tokenizer, t)
        first = spell(int(ids[0]))
        entries = [{"token": first.decode("utf-8", errors="replace"), "logprob": None,
                    "bytes": list(first), "top_logprobs": None}]
        if self._scorer is None:
            self._scorer = PromptScorer(self.model, vocab_of(self.tokenizer).size)
        scores = self._scorer.score(ids, prepared.request.top_logprobs)
        entries += [logprob_entry(s, spell) for s in scores]
        if on_logprob is not None:
            for entry in entries:
                on_logprob({**entry, "prompt": True})
        return entries

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._inflight)

    def _release_idle_memory(self) -> None:
        """The changed sessions saved (with a session directory), then the scorer's last prompt,
        MLX's cache of freed buffers and the C heap's free pages back (idle; MLX thread)."""
        def release() -> None:
            if self.store is not None:  # a checkpoint: a crash later loses only what follows
                self.saved = self.store.save(self.pool)
            if self.on_idle is not None:
                self.on_idle()
            if self._scorer is not None:
                self._scorer.forget()
            mx.clear_cache()
            if self.trimmer is not None:
                self.trimmer.trim()
        run_on_mlx_thread(release)

    def save_sessions(self) -> StoreReport:
        """Save the idle sessions that changed to the session directory (a server's stop)."""
        if self.store is not None:
            self.saved = run_on_mlx_thread(self.store.save, self.pool)
        return self.saved

    def close(self) -> None:
        """Stop watching for idle periods and let the session directory go (a server's stop,
        after :meth:`save_sessions`)."""
        if self.idle is not None:
            self.idle.close()
        if self.store is not None:
            self.store.close()

    def cancel_all(self) -> None:
        with self._lock:
            for event in self._inflight:
                event.set()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = {"served": self.served, "cancelled": self.cancelled, "failed": self.failed,
                      "in_flight": len(self._inflight), "healed_rows": self.healed_rows,
                      "heal_failures": self.heal_failures}
        scorer = self._scorer
        counts.update(scored_rows_reused=scorer.reused if scorer else 0,
                      scored_rows_computed=scorer.computed if scorer else 0,
                      sessions_restored=self.restored.sessions,
                      session_rows_restored=self.restored.rows,
                      session_files_refused=len(self.restored.refused))
        trims = self.trimmer.stats() if self.trimmer is not None else {}
        trims.update(self.idle.stats() if self.idle is not None else {})
        memory = {"mlx_active_bytes": mx.get_active_memory(),
                  "mlx_cache_bytes": mx.get_cache_memory()}
        return {**counts, **trims, **memory, **self.pool.stats()}
