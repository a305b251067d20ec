"""The decode loop of :meth:`Session.generate <nexus_mlx.agent.session.Session.generate>` and
:meth:`Session.complete <nexus_mlx.agent.session.Session.complete>`.

Contract: ``decode_turn(session, step, ...)`` is a generator: it steps and decodes one reply under
the session's lock and returns it as a :class:`~.session_report.Reply` (text, ids, finish, timings,
log probabilities). It yields between decoding steps (a token, a run of forced ids, a heal), not
before the first token (the step's last turn and the first token are one run), so a caller may
run other work between tokens (:func:`~nexus_mlx._platform.mlx_thread.drive_on_mlx_thread`:
concurrent replies take turns) or run it to the end
(:func:`~nexus_mlx._platform.mlx_thread.run_steps`). ``decode_reply(session, constraint,
max_tokens, stop, calls, sample, processors, on_token, start, score=None)``, a generator too,
decodes from the session's live cache, after a step, one token at a time under the turn's
``constraint`` (None: free text): the logits processors, then the
constraint's mask, then the close-call guard (stale rows healed first, the token chosen from exact
logits), then the sampler and the constraint's restraint. Ids the constraint forces (a call's
opener and closer, JSON the grammar leaves no choice over: ``constraint.forced()``) are taken
without reading a row and fed in one pass (:data:`FEED_FORCED_RUNS`), unless ``score`` needs each
row. A greedy step that needs no logits beyond the best id (no processors, no ``score``, no
restraint to weigh) takes the id from the session's certified head when it proves it
(:mod:`~nexus_mlx.decode.certified_head`: the best allowed id, ahead of every other by the guard's
margin where rows are stale, so no close call is missed) and projects in full only when it cannot:
the same ids. It stops at an end-of-turn id (``"stop"``, the id returned last), a ``stop`` string
in the decoded text (``"stop_string"``; with ``calls``, the reply may hold tool calls, and a stop
string inside one does not count), ``max_tokens`` or the model's last position (``"length"``), and
returns ``(ids, finish, ttft_s, guarded_rows, drafts)`` (``drafts``: the
:class:`~nexus_mlx.decode.lookahead.LookaheadStats` of the reply). ``score(logits (V,), id)``, when
given, sees each chosen id but the end-of-turn one with the logits row it was drawn from (after the
processors and the mask), before ``on_token``. Every id but the last is then cached and the
session's next-token logits are those after it.

Tokens reach the cache through a :class:`~nexus_mlx.decode.lookahead.Lookahead` with the
session's ``draft_tokens``: where the reply copies its conversation (an argument quoted from
the request, an answer quoting a tool result) or follows its ``prediction``
(:class:`~nexus_mlx.decode.prediction.Prediction`, drafted first) the copy is drafted and
verified, several ids per forward pass; the ids chosen are those of one-id steps (up to float32
rounding), and drafts not confirmed are dropped before the guard heals and when the loop ends.
``step_in_turns(session, ids, tools)`` is ``session.step_ids(ids, tools)`` as a generator: a long
append to an exact cache (no stale rows, no tool blocks to splice, no debug comparison) is
prefilled one :data:`~nexus_mlx.agent.cache_editor.PREFILL_CHUNK` of rows per turn, a yield
between, through the same forward calls as one step (the same rows and logits); the report counts
every row the request computed. ``turn_reply(reply, tools, constraint, calls, grounding)`` reads
a turn's reply as content and checked tool calls (optional arguments ``grounding``'s text does
not support dropped; None: kept).
It holds no state of its own; ``decode_reply``'s caller holds the session's lock (across the
yields too: a session serves one reply at a time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from nexus_mlx.agent.alignment import common_prefix
from nexus_mlx.agent.cache_editor import PREFILL_CHUNK
from nexus_mlx.agent.session_report import LogprobRecorder, Reply, StepReport, TokenLogprob
from nexus_mlx.decode.call_format import ParsedTurn, checked_calls, cut_at_stop, grounded_calls
from nexus_mlx.decode.certified_head import HeadRow, full_logits
from nexus_mlx.decode.generate import LogitsProcessor, greedy
from nexus_mlx.decode.lookahead import Lookahead, LookaheadStats
from nexus_mlx.decode.name_fsm import mask_logits, vocab_of
from nexus_mlx.decode.prediction import Prediction
from nexus_mlx.decode.turn_constraint import parsed_turn
from nexus_mlx.errors import ArgumentError

if TYPE_CHECKING:
    from nexus_mlx.agent.session import Sampler, Session

FEED_FORCED_RUNS = True
"""Feed a run of ids the constraint forces (a call's opener and closer, the JSON the grammar
leaves no choice over) in one pass; False: one id per pass, as a sampled id (a baseline)."""


def check_max_tokens(max_tokens: Any) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ArgumentError(f"max_tokens must be a positive integer, got {max_tokens!r}")


def decode_turn(session: Session, step: Callable[[], Generator[None, None, StepReport]],
                constraint: Any, calls: bool,
                max_tokens: int, stop: tuple[str, ...], sample: Sampler,
                processors: tuple[LogitsProcessor, ...],
                on_token: Callable[[int, str], None] | None, logprobs: int | None,
                on_logprob: Callable[[TokenLogprob], None] | None,
                prediction: Prediction | None) -> Generator[None, None, Reply]:
    """``step()`` (the session's step to the request, as turns: :func:`step_in_turns`), then
    :func:`decode_reply`, under the session's lock: the reply's text (end-of-turn id and stop
    string removed), ids, finish, report, timings, guarded rows, drafts and, with ``logprobs``
    (alternatives per id), each id's :class:`TokenLogprob`; its content and calls are the
    caller's to read."""
    score = None if logprobs is None else LogprobRecorder(
        logprobs, vocab_of(session.tokenizer).size, on_logprob)
    with session.lock:
        start = time.perf_counter()
        report = yield from step()
        out, finish, ttft, guarded, drafts = yield from decode_reply(
            session, constraint, max_tokens, stop, calls, sample, processors, on_token, start,
            score, prediction)
        decode_s = time.perf_counter() - start - ttft
    text = session.tokenizer.decode(out[:-1] if finish == "stop" else out)
    return Reply(cut_at_stop(text, stop, calls), out, finish, report, ttft, decode_s,
                 guarded=guarded, drafts=drafts,
                 logprobs=None if score is None else score.scores)


def step_in_turns(session: Session, ids: Sequence[int] | np.ndarray,
                  tools: Sequence[Mapping[str, Any]] | None) -> Generator[None, None, StepReport]:
    """``session.step_ids(ids, tools)``, a long append in turns (module docstring). The request
    is checked before the first turn; a failure in a later turn leaves the earlier turns' rows
    (exact rows of a prefix of the request) and restores the rest as a step does."""
    ids = session.checked_ids(ids)
    ends = _append_turns(session, ids, tools)
    start, computed = time.perf_counter(), 0
    for end in ends:
        computed += session.step_ids(ids[:end]).computed
        yield
    report = session.step_ids(ids, tools)
    if ends:
        report.reused -= computed
        report.computed += computed
        report.timings["total"] = time.perf_counter() - start  # the turns' waits included
        report.reason += f"; prefilled in {len(ends) + 1} turns of up to {PREFILL_CHUNK} rows"
    return report


def _append_turns(session: Session, ids: np.ndarray,
                  tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
    """Where the turns before the last end (the packed pass's own chunk boundaries); none
    unless the step is an append of more than one chunk to an exact cache that splices
    nothing and is not compared with a prefill."""
    cached = session.tokens
    if ids.size - cached.size <= PREFILL_CHUNK or session.debug:
        return []
    if tools and session.blocks is not None and session.policy == "repair":
        return []
    if common_prefix(cached, ids) < cached.size or session.editor.inexact_rows().size:
        return []  # not an append (the step plans the edit), or stale rows to heal
    return list(range(cached.size + PREFILL_CHUNK, ids.size, PREFILL_CHUNK))


def turn_reply(reply: Reply, tools: Sequence[Mapping[str, Any]], constraint: Any, calls: bool,
               grounding: str | None) -> Reply:
    """``reply`` with its content, checked calls (grounded in ``grounding`` unless None), call
    errors and finish reason (``"tool_calls"`` where it holds calls and was not cut short)."""
    parsed = (parsed_turn(reply.text, tools, constraint, reply.ended) if calls
              else ParsedTurn(reply.text.strip()))
    parsed = checked_calls(parsed, tools)
    if grounding is not None and parsed.calls:
        parsed = grounded_calls(parsed, tools, grounding)
    finish = reply.finish_reason
    if parsed.calls and finish != "length":
        finish = "tool_calls"
    return replace(reply, finish_reason=finish, content=parsed.content, tool_calls=parsed.calls,
                   call_errors=parsed.errors)


def decode_reply(session: Session, constraint: Any, max_tokens: int, stop: tuple[str, ...],
                 calls: bool, sample: Sampler, processors: tuple[LogitsProcessor, ...],
                 on_token: Callable[[int, str], None] | None, start: float,
                 score: Callable[[mx.array, int], None] | None = None,
                 prediction: Prediction | None = None
                 ) -> Generator[None, None, tuple[list[int], str, float, int, LookaheadStats]]:
    """Decode one reply (module docstring)."""
    editor = session.editor
    lookahead = Lookahead(editor.advance_many, editor.drop, session.tokens,
                          max_draft=session.draft_tokens,
                          room=lambda: session.max_positions - 1 - session.cache.n_past,
                          prediction=prediction)
    try:
        decoded = yield from _decode(session, lookahead, constraint, max_tokens, stop, calls,
                                     sample, processors, on_token, start, score)
        return (*decoded, lookahead.stats)
    finally:
        lookahead.close()  # the cache ends at the last id fed, as without drafts


def _decode(session: Session, lookahead: Lookahead, constraint: Any, max_tokens: int,
            stop: tuple[str, ...], calls: bool, sample: Sampler,
            processors: tuple[LogitsProcessor, ...],
            on_token: Callable[[int, str], None] | None, start: float,
            score: Callable[[mx.array, int], None] | None
            ) -> Generator[None, None, tuple[list[int], str, float, int]]:
    nxt: Any = session.next_row()  # logits, or a certified head's row; raises when empty
    out: list[int] = []
    ttft, guarded = 0.0, 0
    proven = sample is greedy and not processors and score is None
    runs = FEED_FORCED_RUNS and constraint is not None and score is None
    while True:
        if out:  # a turn for other work between tokens (the first comes with the step)
            yield
        run = constraint.forced() if runs else []
        if run:  # ids the constraint leaves no choice over: no row read, one pass for all
            ttft = ttft if out else time.perf_counter() - start
            finish, nxt = _take_forced(session, lookahead, constraint, run, out, on_token, stop,
                                       calls, max_tokens)
            if finish is not None:
                return out, finish, ttft, guarded
            continue
        mask = constraint.allowed() if constraint is not None else None  # once per step
        token = _proven_best(session, nxt, constraint, mask) if proven else None
        row = None
        if token is None:
            row = _masked_row(full_logits(nxt), out, mask, processors)
            if session.close_call(row):  # decide this close call on exact logits
                lookahead.close()
                guarded += session.heal()
                nxt = session.next_row()
                continue
            logprobs = row - mx.logsumexp(row, axis=-1, keepdims=True)
            token = int(np.asarray(sample(logprobs)).reshape(-1)[0])
            if constraint is not None:
                token = constraint.restrain(token, row[0])
        if not out:
            ttft = time.perf_counter() - start
        out.append(token)
        if constraint is not None:
            constraint.accept(token)
        if score is not None and row is not None and token not in session.eos_token_ids:
            score(row[0], token)  # with a score, every row is projected
        finish = _finish(session, out, token, on_token, stop, calls, max_tokens,
                         session.cache.n_past - lookahead.ahead)
        if finish is not None:
            return out, finish, ttft, guarded
        nxt = lookahead.feed([token])


def _take_forced(session: Session, lookahead: Lookahead, constraint: Any, run: list[int],
                 out: list[int], on_token: Callable[[int, str], None] | None,
                 stop: tuple[str, ...], calls: bool, max_tokens: int) -> tuple[str | None, Any]:
    """Append the forced ``run`` to ``out`` (and the runs it leads to), then feed them in one
    pass: ``(None, the row after them)``, or ``(why the reply ends, None)`` with every id but
    the reply's last fed."""
    fed = session.cache.n_past - lookahead.ahead  # rows of the ids fed, drafts aside
    pending: list[int] = []
    while run:
        for token in run:
            out.append(token)
            constraint.accept(token)
            finish = _finish(session, out, token, on_token, stop, calls, max_tokens,
                             fed + len(pending))
            if finish is not None:
                if pending:
                    lookahead.feed(pending)
                return finish, None
            pending.append(token)
        run = constraint.forced()
    return None, lookahead.feed(pending)


def _finish(session: Session, out: list[int], token: int,
            on_token: Callable[[int, str], None] | None, stop: tuple[str, ...], calls: bool,
            max_tokens: int, fed: int) -> str | None:
    """Why the reply ends at ``token`` (its last id, not fed; ``fed``: the rows the cache will
    hold without it), or None: an end-of-turn id, a stop string, the length."""
    if token in session.eos_token_ids:
        return "stop"
    if on_token is not None or stop:
        text = session.tokenizer.decode(out)
        if on_token is not None:
            on_token(token, text)
        if stop and cut_at_stop(text, stop, calls) != text:
            return "stop_string"
    if len(out) >= max_tokens or fed + 1 >= session.max_positions:
        return "length"
    return None


def _proven_best(session: Session, nxt: Any, constraint: Any,
                 mask: np.ndarray | None) -> int | None:
    """The certified head's greedy id among the ``mask``'s ids for this step, or None (no head
    row, a restraint to weigh, or nothing certified): margin as wide as the guard's where rows
    are stale, so a certified id is never a close call."""
    if not isinstance(nxt, HeadRow):
        return None
    if constraint is not None and constraint.weighs_logits():
        return None  # the restraint compares this step's member logits
    stale = session.guard is not None and session.editor.inexact_rows().size > 0
    return nxt.best(mask, session.guard if stale else None)


def _masked_row(logits: mx.array, out: list[int], mask: np.ndarray | None,
                processors: tuple[LogitsProcessor, ...]) -> mx.array:
    """The next id's logits ``(1, V)`` after the processors and the constraint's ``mask``."""
    row = logits[None]
    for process in processors:
        row = process(mx.array(out, dtype=mx.int32), row)
    return mask_logits(row, mx.array(mask)) if mask is not None else row

