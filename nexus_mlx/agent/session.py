"""A live session: one KV cache per conversation, kept across requests and edited in place.

Contract: ``Session(model, tokenizer, policy="repair", budget=5.0)`` owns a
:class:`~nexus_mlx.kv.cache.NexusCache` and the token ids it encodes (rows ``0..n-1`` always hold
positions ``0..n-1``). ``step(messages, tools=None)`` renders the conversation with the model's
own chat template (the assistant's turn opened), aligns it with the cached ids
(:func:`~nexus_mlx.agent.alignment.plan_edit`) and turns the difference into cache operations:

- ``append``: the cache holds a prefix of the request: only the new tokens are prefilled.
- ``repair`` (policy ``repair``): after the common prefix, the runs of the old sequence that
  reappear (:class:`~nexus_mlx.agent.alignment.Run`: a message or tool definition kept, moved or
  reordered) move to their new positions in one copy (:func:`~nexus_mlx.kv.regather.regather`:
  deleted rows dropped, blank rows left for the inserted tokens, the runs' keys re-anchored as a
  splice does, paper 1). Then one packed forward pass computes the inserted tokens, the tail
  and ``budget`` percent of the stale rows (the allocator's choice for the new tokens as the
  query, SUR by default, paper 2; and the last row when nothing after it is new): all of them
  advance through each layer together, fresh K/V written before attention.
- ``truncate``: the request is a prefix of the cache: later rows are dropped (exact).
- ``reencode``: everything after the common prefix is prefilled again — every non-append edit
  under policy ``exact`` (mlx-lm's prefix-cache behaviour, for audits), when no reused run is
  at least ``min_reuse`` tokens, or when the repair would compute at least
  :data:`REENCODE_SHARE` of the rows the re-encode computes (a large budget over a short
  suffix: the re-encode is then exact and no slower). The report says why.

A moved row that is not recomputed stays *stale* (its K/V saw another context) until a later
step recomputes it: every later step under policy ``repair`` (appends included) recomputes
``budget`` percent of the remaining stale rows in the same pass as its new tokens, chosen for
that step's tokens, so a conversation heals as it goes; :attr:`Session.stale_rows` counts them.
The close-call guard (``guard`` nats, :data:`DEFAULT_GUARD` by default; 0 or None turns it off)
never lets a close call be decided on stale rows: when rows are stale and the next token's top
two logits (after a step or a decoded token; under the turn's constraint) are within ``guard``
of each other, every stale row is healed first in one pass and the token is chosen from exact
logits (``StepReport.guarded`` / ``Reply.guarded`` count the rows).

Every step returns a :class:`StepReport` (tokens reused / spliced / repaired / computed /
deleted, the path and why, seconds per stage; with ``debug=True`` also the next-token KL and
top-1 agreement against a fresh prefill of the same ids). ``generate(messages, tools)`` steps,
then decodes from the live cache (``complete(prompt_ids)`` does so for raw ids: no template, no
turn; :mod:`~nexus_mlx.agent.session_decode`: where the reply copies the conversation,
``draft_tokens`` ids are drafted and verified per pass, the same reply sooner; 0 turns it off;
a greedy id is picked by the model's certified head where it can prove it,
:mod:`~nexus_mlx.decode.certified_head`, without the full output projection, the same reply
sooner; ``certified_head=False`` turns it off); the reply's tokens stay cached, so the next
request that carries the reply back is an append. ``generate_steps`` / ``complete_steps``: the
same as generators of turns (they yield between tokens; a long append to an exact cache takes a
turn per chunk, :func:`~nexus_mlx.agent.session_decode.step_in_turns`). Under policy ``exact``
every step's logits equal a prefill's (fp32 rounding); under ``repair`` the reused block keeps
the stale-context residual that its recomputed rows reduce.

Failure: a request that cannot be rendered, is empty, or would pass the model's context raises
(:class:`ArgumentError`) before the cache is touched; an error during the cache operations
restores the previous rows exactly (a repair builds new arrays, a re-encode saves the rows it
overwrites). One re-entrant lock serialises a session's steps; sessions may share one model.
It does not route, call tools or parse their results (the agent loop does).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx._platform.mlx_thread import blocking
from nexus_mlx.agent.alignment import EditPlan, check_min_reuse, plan_edit
from nexus_mlx.agent.cache_editor import CacheEditor, Fill
from nexus_mlx.agent.session_decode import check_max_tokens, decode_turn, step_in_turns, turn_reply
from nexus_mlx.agent.session_report import Reply as Reply  # re-exported
from nexus_mlx.agent.session_report import StepReport as StepReport  # re-exported
from nexus_mlx.agent.session_report import TokenLogprob as TokenLogprob  # re-exported
from nexus_mlx.agent.tool_blocks import ToolBlocks
from nexus_mlx.decode.call_format import (
    has_tool_turns,
    normalized_messages,
    renders_tools,
    textual_messages,
)
from nexus_mlx.decode.certified_head import HeadRow, full_logits
from nexus_mlx.decode.generate import LogitsProcessor, greedy
from nexus_mlx.decode.lookahead import DEFAULT_DRAFT_TOKENS, checked_draft_tokens
from nexus_mlx.decode.prediction import Prediction, prediction_of
from nexus_mlx.decode.restraint import DEFAULT_OPTIONAL_MARGIN
from nexus_mlx.decode.tool_call import quoted_text
from nexus_mlx.decode.turn_constraint import turn_constraint
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import MAX_POSITION, NexusCache
from nexus_mlx.kv.regather import restore, snapshot
from nexus_mlx.metrics import next_token_kl, top1_agreement, top2_margin
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.tokenizer import chat_ids, eos_token_ids
from nexus_mlx.refresh.budget import budget_tokens

REENCODE_SHARE = 0.75
"""A repair that would compute at least this share of a re-encode's rows re-encodes instead.
Measured on SmolLM2 (``results/agent_session_budget_sweep.json``, trajectory 0's delete): repairs
computing 85 / 149 / 252 rows took 479 / 722 / 1,144 ms, the re-encode of 277 rows 922 ms; the
repair's time crosses the re-encode's near 200 rows, about three quarters of them."""
DEFAULT_GUARD = 1.0
"""The close-call guard's default threshold in nats (a top-2 gap under 1 nat: odds under e to
1). Replayed over the 20-trajectory Qwen session run (``results/guard_sweep_qwen20.json``, from
the unguarded margin shards), repair at 5% over the 59 edits at depths >= 1K: first 16 greedy
tokens equal to re-prefill's on all 59 and calls identical on 40 of 40, TTFT 8.3x / 3.9x / 3.8x
lower than the prefix cache's (tools / delete / edit; 3.5x / 3.5x / 3.0x with the heals while
decoding); it fires on about 70% of them. Real guard-1.0 runs of the same 20 trajectories
(``results/agent_session_qwen20_t*_guard1.json``) agree: 59 of 59, calls 39 of 39, TTFT 8.3x /
4.0x / 3.9x. 0.35 is faster (16.7x / 4.3x / 6.4x) and lets one reply and one call through."""
Policy = Literal["exact", "repair"]
POLICIES: tuple[str, ...] = ("exact", "repair")
# allocators that read only the stale block's text and the query (not a dirty twin cache)
SESSION_ALLOCATORS: tuple[str, ...] = ("sur", "dense_tokens", "single_window", "bm25_units",
                                       "random_units")
Sampler = Callable[[mx.array], mx.array]
Message = Mapping[str, Any]


class Session:
    """One conversation's live cache; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        policy: Policy = "repair",
        budget: float = 5.0,
        allocator: str = "sur",
        min_reuse: int = 64,
        debug: bool = False,
        blocks: ToolBlocks | None = None,
        guard: float | None = DEFAULT_GUARD,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS,
        certified_head: bool = True,
    ) -> None:
        if policy not in POLICIES:
            raise ArgumentError(f"policy {policy!r} is not one of {POLICIES}")
        if allocator not in SESSION_ALLOCATORS:
            raise ArgumentError(f"allocator {allocator!r} cannot repair a session; use one of "
                                f"{SESSION_ALLOCATORS}")
        budget_tokens(1, budget)  # validates the percentage (bools rejected there)
        check_min_reuse(min_reuse)
        if guard is not None and (isinstance(guard, bool) or not isinstance(guard, (int, float))
                                  or not 0 <= guard < float("inf")):
            raise ArgumentError(f"guard must be a finite number of nats >= 0 or None, got "
                                f"{guard!r}")
        self.model, self.tokenizer = model, tokenizer
        self.policy, self.budget, self.allocator = policy, float(budget), allocator
        self.min_reuse, self.debug = min_reuse, debug
        self.guard = float(guard) if guard else None  # see the module docstring; 0: off
        self.draft_tokens = checked_draft_tokens(draft_tokens)  # drafts per decode pass; 0: off
        limit = model_plan(model).max_position
        self.max_positions = int(limit) if limit is not None else MAX_POSITION + 1
        if blocks is not None:
            blocks.check_model(model)
        self.blocks = blocks  # compiled tool definitions shared with other sessions, if any
        self.certified_head = bool(certified_head)  # greedy ids without the full head
        self.editor = CacheEditor(model, tokenizer, allocator, self.certified_head)
        self.lock = threading.RLock()
        self.eos_token_ids = set(eos_token_ids(tokenizer))
        self.native_tools = renders_tools(tokenizer)

    # ---- state --------------------------------------------------------------------------
    @property
    def cache(self) -> NexusCache:
        """The live cache (row ``r`` holds position ``r``)."""
        return self.editor.cache

    @cache.setter
    def cache(self, cache: NexusCache) -> None:
        self.editor.cache = cache

    @property
    def stale_rows(self) -> int:
        """Rows that differ from a fresh prefill's: moved or spliced and not recomputed since,
        or computed on top of such rows (see :mod:`.cache_editor`)."""
        with self.lock:
            return int(self.editor.flags().sum())

    @property
    def tokens(self) -> np.ndarray:
        """The ids the cache encodes, in position order (a copy)."""
        with self.lock:
            return self.cache.tokens[: self.cache.n_past].copy()

    def reset(self) -> None:
        with self.lock:
            self.editor = CacheEditor(self.model, self.tokenizer, self.allocator,
                                      self.certified_head)

    def copy_prefix(self, source: Session | NexusCache, rows: int) -> None:
        """Start from a copy of ``source``'s first ``rows`` rows instead of from nothing: another
        session's over the same model (K/V, ids, stale flags) or a cache of exact rows this model
        computed from position 0 (a prompt scorer's). No logits are copied: the next step
        computes at least its last row."""
        session = source if isinstance(source, Session) else None
        if session is not None and session.model is not self.model:
            raise ArgumentError("copy_prefix needs a session of the same loaded model")
        cache = source.cache if isinstance(source, Session) else source
        cache.check_compatible(self.cache.rope_specs, self.cache.n_kv_heads, self.cache.head_dim)
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= cache.n_past:
            raise ArgumentError(f"rows must be an integer in [0, {cache.n_past}], got {rows!r}")
        with session.lock if session is not None else contextlib.nullcontext():
            copy = cache.fork(0, rows)
            flags = session.editor.flags()[:rows] if session else np.zeros(rows, bool)
        with self.lock:
            self.reset()
            self.cache = copy
            self.editor.set_flags(flags)

    # ---- rendering ----------------------------------------------------------------------
    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
               ) -> list[int]:
        """The request's token ids through the model's chat template, the assistant's turn
        opened. Tools, assistant tool calls and tool results go through the template when it
        renders tools, else through :func:`~nexus_mlx.decode.call_format.textual_messages`
        (the same call format, as plain text). Raises :class:`ArgumentError` for a request the
        template cannot render."""
        if not messages:
            raise ArgumentError("a request needs at least one message")
        msgs = normalized_messages(messages)
        tools = [dict(t) for t in tools or ()]
        try:
            if self.native_tools and (tools or has_tool_turns(msgs)):
                ids = self.tokenizer.apply_chat_template(
                    msgs, tools=tools or None, add_generation_prompt=True, tokenize=True)
                return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
            if tools or has_tool_turns(msgs):
                msgs = textual_messages(msgs, tools)
            return chat_ids(self.tokenizer, msgs)
        except ArgumentError:
            raise
        except Exception as exc:  # jinja raises plain exceptions on messages it cannot render
            raise ArgumentError(f"the chat template cannot render this request: {exc}") from exc

    # ---- one step -----------------------------------------------------------------------
    def step(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
             ) -> StepReport:
        """Bring the cache to the rendered request; its next-token logits are kept."""
        return self.step_ids(self.render(messages, tools), tools)

    def step_ids(self, ids: Sequence[int] | np.ndarray,
                 tools: Sequence[Mapping[str, Any]] | None = None) -> StepReport:
        """:meth:`step` on token ids already rendered (``tools``: the request's tools, whose
        compiled blocks may be spliced when the session has :attr:`blocks`)."""
        new = self.checked_ids(ids)
        with self.lock:
            plan = plan_edit(self.tokens, new, self.min_reuse)
            report = self._apply(plan, new, [dict(t) for t in tools or ()])
            start = time.perf_counter()
            report.guarded = self._heal_before_close_call(self.editor.logits)
            if report.guarded:
                report.timings["guard"] = time.perf_counter() - start
                report.timings["total"] += report.timings["guard"]
                report.stale = self.stale_rows
            if self.debug:
                self._compare_with_prefill(new, report)
            return report

    def checked_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``ids`` as int64, or ArgumentError: none, more than the context, outside the vocab."""
        new = np.asarray(ids, dtype=np.int64).reshape(-1)
        if new.size == 0:
            raise ArgumentError("the request renders to no tokens")
        if new.size > self.max_positions:
            raise ArgumentError(f"the request is {new.size} tokens; the model's context holds "
                                f"{self.max_positions}")
        vocab = model_plan(self.model).vocab_size
        if new.min() < 0 or new.max() >= vocab:
            raise ArgumentError(f"token ids must be in [0, {vocab})")
        return new

    def _apply(self, plan: EditPlan, new: np.ndarray, tools: list[dict[str, Any]]
               ) -> StepReport:
        start = time.perf_counter()
        if plan.kind == "reuse" and self.policy == "repair":
            rows, reencode = self._repair_rows(plan, new), new.size - plan.prefix
            if rows < REENCODE_SHARE * reencode:
                return self._repair(plan, new, tools, start)
            path, keep = "reencode", plan.prefix
            reason = (f"a repair would compute {rows} rows, a re-encode {reencode} (>= "
                      f"{REENCODE_SHARE:.0%} of them): re-encoded instead")
        elif plan.kind == "append" and plan.prefix < new.size:
            path, keep, reason = "append", plan.prefix, "the cache holds a prefix of the request"
        elif plan.kind == "append":  # the same ids again: recompute the last one for its logits
            path, keep, reason = "append", new.size - 1, "identical request: last token recomputed"
        elif plan.prefix == new.size:
            path, keep, reason = ("truncate", new.size - 1, "the request is a prefix of the "
                                  "cache: later rows dropped, the last token recomputed")
        else:
            path, keep = "reencode", plan.prefix
            reason = ("policy 'exact' re-encodes every non-append edit" if self.policy == "exact"
                      else f"no run of >= {self.min_reuse} cached tokens reappears after the edit")
        fill = self._edit(new, tools, keep=keep)
        return self._report(path, reason, plan, new, fill, start)

    def _repair_rows(self, plan: EditPlan, new: np.ndarray) -> int:
        """Rows the repair path would compute for ``plan`` (one that reuses runs): the new
        tokens, the budget's share of the rows stale after the move, and the last row if it is
        not new."""
        sources = plan.sources()
        stale = int(self.editor.flags_after_move(sources).sum())
        fresh = int((sources == -1).sum()) + new.size - sources.size
        last_fresh = new.size > sources.size or sources[-1] == -1
        return fresh + budget_tokens(stale, self.budget) + (0 if last_fresh else 1)

    def _repair(self, plan: EditPlan, new: np.ndarray, tools: list[dict[str, Any]],
                start: float) -> StepReport:
        timings: dict[str, float] = {}
        fill = self._edit(new, tools, sources=plan.sources(), timings=timings)
        moved = [run for run in plan.runs if run.delta]
        reason = (f"{plan.deleted} rows deleted, {plan.inserted} inserted; {plan.reused} rows "
                  f"reused in {len(plan.runs)} runs ({len(moved)} re-anchored); {fill.repaired} "
                  f"inexact rows recomputed with the new tokens in one pass")
        return self._report("repair", reason, plan, new, fill, start, moved=plan.reused,
                            timings=timings)

    def _edit(self, new: np.ndarray, tools: list[dict[str, Any]], *, keep: int | None = None,
              sources: np.ndarray | None = None, timings: dict[str, float] | None = None
              ) -> Fill:
        """Move rows by ``sources`` (or trim to ``keep`` rows), then fill the rest of ``new``;
        on any failure the cache, its flags and logits are put back exactly (a move builds new
        arrays, so the old ones are restored; otherwise the cache's transaction saves the rows
        the fill may overwrite)."""
        editor, timings = self.editor, {} if timings is None else timings
        extra = editor.state()
        keep = editor.cache.n_past if keep is None else keep
        if sources is not None:
            state = snapshot(editor.cache)
            guard: Any = contextlib.nullcontext()
        else:
            inexact = editor.inexact_rows()
            guard = editor.cache.transaction(np.union1d(np.arange(keep, editor.cache.n_past),
                                                        inexact[inexact < keep]))
        try:
            with guard:
                t0 = time.perf_counter()
                if sources is not None:
                    editor.move(sources)
                    fresh = np.concatenate([np.flatnonzero(sources == -1),
                                            np.arange(sources.size, new.size)])
                else:
                    editor.trim(keep)
                    fresh = np.arange(keep, new.size)
                timings["move"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                repair = self.policy == "repair"
                fill = editor.fill(new, fresh, self.budget if repair else 0.0, tools=tools,
                                   blocks=self.blocks if repair else None)
                timings["packed_pass"] = time.perf_counter() - t0
                return fill
        except BaseException:
            if sources is not None:
                restore(editor.cache, state)
            editor.restore_state(extra)
            raise

    def _report(self, path: str, reason: str, plan: EditPlan, new: np.ndarray, fill: Fill,
                start: float, *, moved: int = 0, timings: dict[str, float] | None = None
                ) -> StepReport:
        spliced = moved + fill.spliced
        kept = new.size - fill.computed - spliced  # rows neither moved nor computed afresh
        stages = dict(timings or {})
        stages["total"] = time.perf_counter() - start
        return StepReport(path, reason, int(new.size), int(kept), spliced, fill.repaired,
                          fill.computed, int(plan.old_length - kept - moved), stages,
                          stale=self.stale_rows, from_blocks=fill.spliced)

    def heal(self, max_rows: int | None = None) -> int:
        """Recompute stale rows (all, or the first ``max_rows`` in position order) and the last
        row in one packed pass; returns how many stale rows. Meant for idle time between
        requests (while tools run, or after a server's reply): healing every stale row makes
        the cache equal a fresh prefill of its ids."""
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int)
                                     or max_rows < 0):
            raise ArgumentError(f"max_rows must be an integer >= 0, got {max_rows!r}")
        with self.lock:
            extra = self.editor.state()
            try:
                with self.cache.transaction(self.editor.heal_rows(max_rows)):
                    return self.editor.heal(max_rows)
            except BaseException:
                self.editor.restore_state(extra)
                raise

    def _heal_before_close_call(self, logits: mx.array | None) -> int:
        """Heal every stale row when ``logits`` are a close call (see ``guard``); returns the
        stale rows healed (0: not a close call, no stale rows, or no guard)."""
        return self.heal() if self.close_call(logits) else 0

    def close_call(self, logits: mx.array | None) -> bool:
        """Whether the guard heals before a token is chosen from ``logits``: rows are stale
        and their top two are within ``guard`` nats."""
        if self.guard is None or logits is None or not self.editor.inexact_rows().size:
            return False
        return bool(top2_margin(logits) < self.guard)

    def _compare_with_prefill(self, new: np.ndarray, report: StepReport) -> None:
        fresh = forward(self.model, new, make_cache(self.model), logits="last")[0, -1]
        mine = self.next_token_logits()
        report.kl = next_token_kl(fresh, mine)
        report.top1 = top1_agreement(fresh, mine)

    # ---- generation ---------------------------------------------------------------------
    def next_row(self) -> HeadRow | mx.array:
        """The row of the token after the cached ones: its logits ``(V,)``, or after a decoded
        token a :class:`~nexus_mlx.decode.certified_head.HeadRow` (logits computed when read)."""
        with self.lock:
            if self.editor.next_row is None:
                raise ArgumentError("the session holds nothing yet: call step() first")
            return self.editor.next_row

    def next_token_logits(self) -> mx.array:
        """Logits ``(V,)`` of the token after the cached ones."""
        return full_logits(self.next_row())

    def advance(self, token: int) -> mx.array:
        """Append one token (a decoded one) to the cache; returns the next token's logits. A
        token decoded over stale rows is stale too (:meth:`heal` recomputes it; so does
        ``guard`` when the next token is a close call)."""
        with self.lock:
            logits = self.editor.advance(token)
            return self.next_token_logits() if self._heal_before_close_call(logits) else logits

    def generate_steps(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        tool_choice: str | Mapping[str, Any] = "auto",
        parallel_tool_calls: bool = True,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        sampler: Sampler | None = None,
        logits_processors: Sequence[LogitsProcessor] = (),
        on_token: Callable[[int, str], None] | None = None,
        optional_margin: float = DEFAULT_OPTIONAL_MARGIN,
        ground_optional: bool = True,
        logprobs: int | None = None,
        on_logprob: Callable[[TokenLogprob], None] | None = None,
        prediction: str | Sequence[int] | Prediction | None = None,
    ) -> Generator[None, None, Reply]:
        """Step to the request, then decode up to ``max_tokens`` ids (greedy by default) from
        the live cache under the turn's constraint (``tool_choice`` over ``tools``, or a
        ``response_format``), stopping at an end-of-turn id or a ``stop`` string (neither is
        returned). ``logits_processors`` (mlx-lm's ``(ids so far, logits (1, V)) -> logits``) run
        before the constraint's mask. ``on_token(id, text_so_far)`` is called after each id (for
        streaming). ``optional_margin``: the restraint on optional call arguments
        (:class:`~nexus_mlx.decode.turn_constraint.TurnConstraint`; 0: off). ``ground_optional``:
        drop from each call the optional arguments the conversation's text does not support
        (:func:`~nexus_mlx.decode.call_format.grounded_calls`; the reply's ``text`` keeps what
        the model wrote). ``logprobs`` (0 to 20): record the
        :class:`~.session_report.TokenLogprob` of each id but the end-of-turn one, with that many
        alternatives, in ``reply.logprobs``, and hand each to ``on_logprob`` as it is chosen.
        ``prediction`` (text, ids, or a fresh :class:`~nexus_mlx.decode.prediction.Prediction`
        to set its drafts' length): what the reply is expected to repeat, drafted ahead and
        verified: the same reply, sooner where it holds (``reply.drafts.predicted``,
        ``.predicted_accepted``). ``generate_steps``: the same as turns (module docstring)."""
        check_max_tokens(max_tokens)
        constraint = turn_constraint(self.tokenizer, tools or (), tool_choice, parallel_tool_calls,
                                     response_format, self.eos_token_ids, optional_margin)
        calls = bool(tools and tool_choice != "none")  # whether the reply's text may hold calls
        reply = yield from decode_turn(
            self, lambda: step_in_turns(self, self.render(messages, tools), tools), constraint,
            calls, max_tokens, tuple(stop), sampler or greedy, tuple(logits_processors),
            on_token, logprobs, on_logprob, prediction_of(prediction, self.tokenizer))
        return turn_reply(reply, tools or (), constraint, calls,
                          quoted_text(messages) if ground_optional else None)

    generate = blocking(generate_steps, "generate")

    def complete_steps(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        *,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        sampler: Sampler | None = None,
        logits_processors: Sequence[LogitsProcessor] = (),
        on_token: Callable[[int, str], None] | None = None,
        logprobs: int | None = None,
        on_logprob: Callable[[TokenLogprob], None] | None = None,
    ) -> Generator[None, None, Reply]:
        """Step to raw token ids (no chat template) and continue them as :meth:`generate` does
        without a turn's constraint; ``reply.content`` is the text as generated (not stripped),
        never read as calls. ``complete_steps``: the same as turns."""
        check_max_tokens(max_tokens)
        reply = yield from decode_turn(
            self, lambda: step_in_turns(self, prompt_ids, None), None, False, max_tokens,
            tuple(stop), sampler or greedy, tuple(logits_processors), on_token, logprobs,
            on_logprob, None)
        return replace(reply, content=reply.text)

    complete = blocking(complete_steps, "complete")
