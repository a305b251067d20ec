"""A live session: one KV cache per conversation, kept across requests and edited in place.

Contract: ``Session(model, tokenizer, policy="repair", budget=5.0)`` owns a
:class:`~nexus_mlx.kv.cache.NexusCache` and the token ids it encodes (rows ``0..n-1`` always hold
positions ``0..n-1``). ``step(messages, tools=None)`` renders the conversation with the model's
own chat template (the assistant's turn opened), aligns it with the cached ids
(:func:`~nexus_mlx.agent.alignment.plan_edit`) and turns the difference into cache operations:

- ``append``: the cache holds a prefix of the request: only the new tokens are prefilled.
- ``repair`` (policy ``repair``): after the common prefix, the longest reused run of the old
  sequence moves to its new position in one gather (:func:`~nexus_mlx.kv.regather.regather`:
  deleted rows dropped, blank rows left for the inserted tokens, the run's keys re-anchored as a
  splice does, paper 1), the inserted tokens are computed into the blanks, and ``budget``
  percent of the run's rows (at least one when nothing follows it) are recomputed on the
  allocator's choice (SUR by default, paper 2) in the same packed forward pass as the tail.
- ``truncate``: the request is a prefix of the cache: later rows are dropped (exact).
- ``reencode``: everything after the common prefix is prefilled again — every non-append edit
  under policy ``exact`` (mlx-lm's prefix-cache behaviour, for audits), or when no reused run is
  at least ``min_reuse`` tokens (the report says why).

Every step returns a :class:`StepReport` (tokens reused / spliced / repaired / computed /
deleted, the path and why, seconds per stage; with ``debug=True`` also the next-token KL and
top-1 agreement against a fresh prefill of the same ids). ``generate(messages, tools)`` steps,
then decodes from the live cache; the reply's tokens stay cached, so the next request that
carries the reply back is an append. Under policy ``exact`` every step's logits equal a fresh
prefill's (fp32 rounding); under ``repair`` the reused block keeps the stale-context residual
that its recomputed rows reduce.

Failure: a request that cannot be rendered, is empty, or would pass the model's context raises
(:class:`ArgumentError`) before the cache is touched; an error during the cache operations
restores the previous rows exactly (a repair builds new arrays, a re-encode saves the rows it
overwrites). One re-entrant
lock serialises the steps of a session; several sessions may share one loaded model. It does not
route, call tools or parse their results (the agent loop does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.agent.alignment import EditPlan, plan_edit
from nexus_mlx.decode.call_format import (
    ParsedCall,
    ParsedTurn,
    checked_calls,
    function_of,
    normalized_messages,
    parse_tool_calls,
    renders_tools,
    response_schema,
    textual_messages,
    turn_constraint,
)
from nexus_mlx.decode.generate import greedy
from nexus_mlx.decode.name_fsm import mask_logits
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import MAX_POSITION
from nexus_mlx.kv.regather import regather, restore, snapshot
from nexus_mlx.metrics import next_token_kl, top1_agreement
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.tokenizer import chat_ids, eos_token_ids
from nexus_mlx.refresh.allocators import AllocationRequest, checked_selection, get_allocator
from nexus_mlx.refresh.budget import budget_tokens
from nexus_mlx.refresh.edit import Edit

Policy = Literal["exact", "repair"]
POLICIES: tuple[str, ...] = ("exact", "repair")
# allocators that read only the stale block's text and the query (not a dirty twin cache)
SESSION_ALLOCATORS: tuple[str, ...] = ("sur", "dense_tokens", "single_window", "bm25_units",
                                       "random_units")
Sampler = Callable[[mx.array], mx.array]
PREFILL_CHUNK = 512  # tokens per forward call when prefilling (as mlx-lm's prefill_step_size)
Message = Mapping[str, Any]


@dataclass
class StepReport:
    path: str  # "append", "repair", "truncate" or "reencode"
    reason: str  # why this path was taken
    prompt_tokens: int  # the request's rendered length
    reused: int  # rows kept untouched (the common prefix)
    spliced: int  # rows moved with re-anchored keys (the reused block)
    repaired: int  # spliced rows recomputed
    computed: int  # new tokens prefilled
    deleted: int  # old rows dropped
    timings: dict[str, float] = field(default_factory=dict)
    kl: float | None = None  # debug: KL(fresh prefill || session) of the next token
    top1: bool | None = None  # debug: whether their argmaxes agree


@dataclass
class Reply:
    text: str  # everything generated, end-of-turn id and stop string removed
    tokens: list[int]  # the sampled ids (the last one is not in the cache)
    finish_reason: str  # "stop", "stop_string", "tool_calls" or "length"
    report: StepReport
    ttft_s: float
    decode_s: float
    content: str = ""  # the prose outside tool calls
    tool_calls: list[ParsedCall] = field(default_factory=list)
    call_errors: list[str] = field(default_factory=list)  # calls that did not parse


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
    ) -> None:
        if policy not in POLICIES:
            raise ArgumentError(f"policy {policy!r} is not one of {POLICIES}")
        if allocator not in SESSION_ALLOCATORS:
            raise ArgumentError(f"allocator {allocator!r} cannot repair a session; use one of "
                                f"{SESSION_ALLOCATORS}")
        budget_tokens(1, budget)  # validates the percentage (bools rejected there)
        self.model, self.tokenizer = model, tokenizer
        self.policy, self.budget, self.allocator = policy, float(budget), allocator
        self.min_reuse, self.debug = min_reuse, debug
        limit = model_plan(model).max_position
        self.max_positions = int(limit) if limit is not None else MAX_POSITION + 1
        self.cache = make_cache(model)
        self.lock = threading.RLock()
        self._last_logits: mx.array | None = None  # (V,) after the last cached token
        self.eos_token_ids = set(eos_token_ids(tokenizer))
        self.native_tools = renders_tools(tokenizer)

    # ---- state --------------------------------------------------------------------------
    @property
    def tokens(self) -> np.ndarray:
        """The ids the cache encodes, in position order (a copy)."""
        return self.cache.tokens[: self.cache.n_past].copy()

    def reset(self) -> None:
        with self.lock:
            self.cache = make_cache(self.model)
            self._last_logits = None

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
            if self.native_tools and (tools or _has_tool_turns(msgs)):
                ids = self.tokenizer.apply_chat_template(
                    msgs, tools=tools or None, add_generation_prompt=True, tokenize=True)
                return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
            if tools or _has_tool_turns(msgs):
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
        return self.step_ids(self.render(messages, tools))

    def step_ids(self, ids: Sequence[int] | np.ndarray) -> StepReport:
        """:meth:`step` on token ids already rendered."""
        new = np.asarray(ids, dtype=np.int64).reshape(-1)
        if new.size == 0:
            raise ArgumentError("the request renders to no tokens")
        if new.size > self.max_positions:
            raise ArgumentError(f"the request is {new.size} tokens; the model's context holds "
                                f"{self.max_positions}")
        vocab = model_plan(self.model).vocab_size
        if new.min() < 0 or new.max() >= vocab:
            raise ArgumentError(f"token ids must be in [0, {vocab})")
        with self.lock:
            plan = plan_edit(self.tokens, new, self.min_reuse)
            report = self._apply(plan, new)
            if self.debug:
                self._compare_with_prefill(new, report)
            return report

    def _apply(self, plan: EditPlan, new: np.ndarray) -> StepReport:
        start = time.perf_counter()
        if plan.kind == "append" and plan.prefix < new.size:
            self._prefill(new[plan.prefix:])
            return self._report("append", "the cache holds a prefix of the request", plan, new,
                                computed=new.size - plan.prefix, start=start)
        if plan.kind == "append":  # the same ids again: recompute the last one for its logits
            self._reencode(new, new.size - 1)
            return self._report("append", "identical request: the last token recomputed", plan,
                                new, computed=1, start=start)
        if plan.kind == "reuse" and self.policy == "repair":
            return self._repair(plan, new, start)
        if plan.prefix == new.size:  # the request is a prefix of the cache: a truncation
            self._reencode(new, new.size - 1)
            return self._report("truncate", "the request is a prefix of the cache: later rows "
                                "dropped, the last token recomputed", plan, new, computed=1,
                                start=start)
        reason = ("policy 'exact' re-encodes every non-append edit" if self.policy == "exact"
                  else f"no run of >= {self.min_reuse} cached tokens reappears after the edit")
        self._reencode(new, plan.prefix)
        return self._report("reencode", reason, plan, new, computed=new.size - plan.prefix,
                            start=start)

    def _report(self, path: str, reason: str, plan: EditPlan, new: np.ndarray, *, computed: int,
                start: float, spliced: int = 0, repaired: int = 0,
                timings: dict[str, float] | None = None) -> StepReport:
        kept = new.size - computed - spliced  # rows neither recomputed nor moved
        stages = dict(timings or {})
        stages["total"] = time.perf_counter() - start
        return StepReport(path, reason, int(new.size), int(kept), spliced, repaired, computed,
                          int(plan.old_length - kept - spliced), stages)

    # ---- cache operations ---------------------------------------------------------------
    def _prefill(self, ids: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Compute ``ids`` into ``rows`` at those positions (default: appended), in chunks of
        :data:`PREFILL_CHUNK` (bounded attention memory); keeps the last token's logits."""
        rows = np.arange(self.cache.n_past, self.cache.n_past + ids.size) if rows is None else rows
        for start in range(0, ids.size, PREFILL_CHUNK):
            chunk = slice(start, start + PREFILL_CHUNK)
            logits = forward(self.model, ids[chunk], self.cache, positions=rows[chunk],
                             rows=rows[chunk], logits="last")
            self.cache.evaluate()
        self._last_logits = logits[0, -1]
        mx.eval(self._last_logits)

    def _reencode(self, new: np.ndarray, keep: int) -> None:
        """Keep rows ``[0, keep)`` and prefill the rest; the overwritten rows come back on a
        failure (the cache's transaction saves copies of just those rows)."""
        with self.cache.transaction(np.arange(keep, self.cache.n_past)):
            self.cache.trim(keep)
            self._prefill(new[keep:])

    def _repair(self, plan: EditPlan, new: np.ndarray, start: float) -> StepReport:
        timings: dict[str, float] = {}
        i, j, length, p = plan.block_old, plan.block_new, plan.block_length, plan.prefix
        tail = new[j + length:]
        state = snapshot(self.cache)  # regather writes fresh arrays: restoring is exact
        try:
            t0 = time.perf_counter()
            sources = np.concatenate([np.arange(p), np.full(j - p, -1), np.arange(i, i + length)])
            regather(self.cache, sources, np.arange(j + length))  # keys re-anchored by j - i
            timings["move"] = time.perf_counter() - t0
            if j > p:
                t0 = time.perf_counter()
                self._prefill(new[p:j], np.arange(p, j))  # into the blank rows
                timings["prefill_inserted"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            rows = self._choose_rows(j, length, new, tail)
            timings["selection"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            self._refresh_with_tail(rows, tail)
            timings["refresh_and_tail"] = time.perf_counter() - t0
        except BaseException:
            restore(self.cache, state)
            raise
        reason = (f"{plan.deleted} rows deleted, {plan.inserted} inserted; {length} reused rows "
                  f"re-anchored by {plan.delta:+d}, {rows.size} recomputed")
        return self._report("repair", reason, plan, new,
                            computed=int(plan.inserted + tail.size), start=start,
                            spliced=length, repaired=int(rows.size), timings=timings)

    def _choose_rows(self, j: int, length: int, new: np.ndarray, tail: np.ndarray) -> np.ndarray:
        """Rows of the spliced block to recompute: the allocator's budget, plus the block's last
        row when nothing follows it (its logits are the next token's)."""
        b = budget_tokens(length, self.budget)
        query = tail if tail.size else new[max(0, j - 64):j]
        if b and query.size:
            request = AllocationRequest(self.model, self.cache, self.cache, Edit(j, j), query, b,
                                        self.tokenizer)
            selected = checked_selection(get_allocator(self.allocator)(request), length, b,
                                         self.allocator)
        else:
            selected = np.zeros(0, np.int64)
        if not tail.size:
            selected = np.union1d(selected, [length - 1])
        return (selected + j).astype(np.int64)

    def _refresh_with_tail(self, rows: np.ndarray, tail: np.ndarray) -> None:
        """One packed forward pass: the recomputed rows and the tail (its first
        :data:`PREFILL_CHUNK` tokens; the rest is prefilled after) advance through each layer
        together (fresh K/V written before attention)."""
        if tail.size > PREFILL_CHUNK:
            self._refresh_with_tail(rows, tail[:PREFILL_CHUNK])
            self._prefill(tail[PREFILL_CHUNK:])
            return
        n = self.cache.n_past
        tokens = np.concatenate([self.cache.tokens[rows], tail])
        positions = np.concatenate([self.cache.positions[rows], np.arange(n, n + tail.size)])
        targets = np.concatenate([rows, np.arange(n, n + tail.size)])
        if tokens.size == 0:
            return
        logits = forward(self.model, tokens, self.cache, positions=positions, rows=targets,
                         logits="last")
        self.cache.evaluate()
        self._last_logits = logits[0, -1]
        mx.eval(self._last_logits)

    def _compare_with_prefill(self, new: np.ndarray, report: StepReport) -> None:
        fresh = forward(self.model, new, make_cache(self.model), logits="last")[0, -1]
        assert self._last_logits is not None
        report.kl = next_token_kl(fresh, self._last_logits)
        report.top1 = top1_agreement(fresh, self._last_logits)

    # ---- generation ---------------------------------------------------------------------
    def next_token_logits(self) -> mx.array:
        """Logits ``(V,)`` of the token after the cached ones."""
        if self._last_logits is None:
            raise ArgumentError("the session holds nothing yet: call step() first")
        return self._last_logits

    def generate(
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
        on_token: Callable[[int, str], None] | None = None,
    ) -> Reply:
        """Step to the request, then decode up to ``max_tokens`` ids (greedy by default) from
        the live cache under the turn's constraint (``tool_choice`` over ``tools``, or a
        ``response_format``), stopping at an end-of-turn id or a ``stop`` string (neither is
        returned). ``on_token(id, text_so_far)`` is called after each id (for streaming)."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ArgumentError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        constraint = turn_constraint(self.tokenizer, tools or (), tool_choice, parallel_tool_calls,
                                     response_format, self.eos_token_ids)
        with self.lock:
            start = time.perf_counter()
            report = self.step(messages, tools)
            out, finish, ttft = self._decode(constraint, max_tokens, tuple(stop), sampler or greedy,
                                             on_token, start)
            decode_s = time.perf_counter() - start - ttft
        text = self.tokenizer.decode(out[:-1] if finish == "stop" else out)
        text = _cut_at_stop(text, stop)
        calls_allowed = (bool(tools) and tool_choice != "none"
                         and (response_format is None or response_schema(response_format) is None))
        names = [function_of(tool)["name"] for tool in tools or ()]
        parsed = parse_tool_calls(text, names) if calls_allowed else ParsedTurn(text.strip())
        parsed = checked_calls(parsed, tools or ())
        if parsed.calls:
            finish = "tool_calls" if finish != "length" else finish
        return Reply(text, out, finish, report, ttft, decode_s, parsed.content, parsed.calls,
                     parsed.errors)

    def _decode(self, constraint: Any, max_tokens: int, stop: tuple[str, ...], sample: Sampler,
                on_token: Callable[[int, str], None] | None, start: float
                ) -> tuple[list[int], str, float]:
        logits = self.next_token_logits()
        out: list[int] = []
        ttft = 0.0
        while True:
            mask = constraint.allowed() if constraint is not None else None
            row = logits[None]
            if mask is not None:
                row = mask_logits(row, mx.array(mask))
            logprobs = row - mx.logsumexp(row, axis=-1, keepdims=True)
            token = int(np.asarray(sample(logprobs)).reshape(-1)[0])
            if not out:
                ttft = time.perf_counter() - start
            out.append(token)
            if constraint is not None:
                constraint.accept(token)
            if token in self.eos_token_ids:
                return out, "stop", ttft
            if on_token is not None or stop:
                text = self.tokenizer.decode(out)
                if on_token is not None:
                    on_token(token, text)
                if stop and _cut_at_stop(text, stop) != text:
                    return out, "stop_string", ttft
            if len(out) >= max_tokens or self.cache.n_past + 1 >= self.max_positions:
                return out, "length", ttft
            logits = forward(self.model, [token], self.cache, logits="last")[0, -1]
            mx.eval(logits)
            self._last_logits = logits


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


def _has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
