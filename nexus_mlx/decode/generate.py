"""The sampling loop over the nexus engine, with time-to-first-token and throughput.

Contract: ``generate_tokens(model, prompt_tokens, cache)`` prefills the prompt into ``cache``
through ``models.forward`` and yields sampled token ids one at a time until an end-of-sequence
id or ``max_tokens``; the cache then holds the prompt and every generated token but the last.
``generate``/``chat`` wrap it for text prompts and chat messages (``models.tokenizer.chat_ids``
renders the chat template) and return a :class:`Generation` with timings. Samplers and logits
processors are plain callables with mlx-lm's signatures (``sampler(logprobs (1, V)) -> (1,)``,
``processor(tokens, logits)``), so ``mlx_lm.sample_utils.make_sampler`` plugs in directly.
Greedy by default; ``greedy_continuation`` returns the greedy ids as a list (the one greedy
decode the CLI and the benchmarks share). Greedy decoding without processors or drafts picks
each id with the model's certified head where it has one
(:mod:`~nexus_mlx.decode.certified_head`: an INT8 scan whose error bound proves the id is the
full projection's argmax, the full projection where it cannot), so the ids are the same, sooner;
``certified_head=False`` turns it off. ``draft_tokens`` > 0 (off by default here) decodes with
copy drafts (:mod:`~nexus_mlx.decode.lookahead`): the same ids, fewer passes where the output
copies its context.

It evaluates arrays (it is the executor of a decode loop); it knows nothing about tools.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.decode.certified_head import CertifiedHead, HeadRow
from nexus_mlx.decode.lookahead import Lookahead
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import (
    decode_step,
    forward,
    forward_hidden,
    forward_last_hidden,
    forward_tail,
    lm_head,
    make_cache,
)
from nexus_mlx.models.tokenizer import chat_ids, eos_token_ids

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def greedy(logprobs: mx.array) -> mx.array:
    """Pick the most likely token: ``(1, V) -> (1,)``."""
    return mx.argmax(logprobs, axis=-1)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float = 0.0  # prompt submitted -> first token sampled
    decode_s: float = 0.0  # first token -> last token
    drafted_tokens: int = 0  # copy drafts forwarded (``draft_tokens`` > 0)
    accepted_tokens: int = 0  # of them, the ids sampled
    certified_tokens: int = 0  # ids the certified head picked without the full projection

    def tick(self, count: int, start: float, first: float) -> float:
        """Record the ``count``-th id (time since ``start`` for the first; the decode time
        since the first id, ``first``, after it) and return when the first id came."""
        now = time.perf_counter()
        if count == 1:
            self.ttft_s, first = now - start, now
        self.generated_tokens = count
        self.decode_s = now - first
        return first

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        later = self.generated_tokens - 1
        return later / self.decode_s if later > 0 and self.decode_s > 0 else 0.0


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stats: GenerationStats = field(default_factory=GenerationStats)


def _sample(
    logits: mx.array,
    history: list[int],
    sampler: Sampler,
    processors: Sequence[LogitsProcessor],
) -> mx.array:
    """The next token as a lazy ``(1,)`` array. The default greedy sampler without processors
    takes the argmax of the logits themselves (normalising cannot change it)."""
    logits = logits[:, -1, :]  # (1, V)
    if sampler is greedy and not processors:
        return greedy(logits)
    for process in processors:
        logits = process(mx.array(history), logits)
    return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


def _read(token: mx.array) -> int:
    return int(cast(int, token.item()))


def generate_tokens(
    model: nn.Module,
    prompt_tokens: Sequence[int],
    cache: NexusCache,
    *,
    max_tokens: int = 256,
    eos_token_ids: set[int] | None = None,
    sampler: Sampler | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
    stats: GenerationStats | None = None,
    draft_tokens: int = 0,
    certified_head: bool = True,
) -> Iterator[int]:
    """Prefill ``prompt_tokens`` into ``cache`` and yield up to ``max_tokens`` sampled ids.

    Without logits processors the loop is pipelined as mlx-lm's ``generate_step`` is: the next
    step is built on the still-lazy sampled token (``decode_step``) and started with
    ``mx.async_eval`` before the current token is read, so the host never waits between steps.
    A step started for a token that turns out to end the generation (an end-of-sequence id, or
    the consumer stopping) is taken back (``cache.trim``), so the cache ends as documented.
    Processors read the token history on the host, so with them every step is sequential.
    ``draft_tokens`` > 0 drafts up to that many ids per pass where the output copies its
    context (:mod:`~nexus_mlx.decode.lookahead`: the same ids, fewer passes where a copy is
    under way; a sequential loop, no pipelining). Greedy decoding otherwise goes through the
    model's certified head when it has one and ``certified_head`` is on (module docstring; a
    sequential loop too, the scan running on the host)."""
    sampler = sampler or greedy
    eos = eos_token_ids or set()
    stats = stats if stats is not None else GenerationStats()
    history = list(prompt_tokens)
    stats.prompt_tokens = len(history)
    start = time.perf_counter()
    if draft_tokens or logits_processors:
        yield from _stepwise(model, cache, history, sampler, logits_processors, max_tokens, eos,
                             stats, start, draft_tokens)
        return
    head = CertifiedHead.of(model) if certified_head and sampler is greedy else None
    if head is not None:
        yield from _certified_greedy(model, cache, history, head, max_tokens, eos, stats, start)
        return
    logits = forward(model, history, cache, logits="last")
    token = _sample(logits, history, sampler, logits_processors)
    mx.async_eval(token)
    pending = False  # a step for `token` is running: its row is cache row n_past - 1
    try:
        first = 0.0
        for count in range(1, max_tokens + 1):
            nxt = None
            if count < max_tokens:
                nxt = _sample(decode_step(model, token, cache), history, sampler, ())
                mx.async_eval(nxt)
                pending = True
            tok = _read(token)
            first = stats.tick(count, start, first)
            if pending:
                cache.record_tokens([cache.n_past - 1], [tok])
            yield tok
            if tok in eos or nxt is None:
                return
            history.append(tok)
            token, pending = nxt, False
    finally:
        if pending:  # the step of the last token must not stay in the cache
            cache.trim(cache.n_past - 1)


def _certified_greedy(
    model: nn.Module,
    cache: NexusCache,
    history: list[int],
    head: CertifiedHead,
    max_tokens: int,
    eos: set[int],
    stats: GenerationStats,
    start: float,
) -> Iterator[int]:
    """The greedy loop over the certified head: each id from the scan where its bound
    certifies it, else the argmax of the full projection."""
    hidden = forward_last_hidden(model, history, cache)
    first = 0.0
    for count in range(1, max_tokens + 1):
        top = head.top(hidden)
        if top is not None:
            tok = int(top.ids[0])
            stats.certified_tokens += 1
        else:
            tok = _read(greedy(lm_head(model, hidden)[:, -1, :]))
        first = stats.tick(count, start, first)
        yield tok
        if tok in eos or count == max_tokens:
            return
        history.append(tok)
        hidden = forward_last_hidden(model, [tok], cache)


def cache_lookahead(model: nn.Module, cache: NexusCache, draft_tokens: int,
                    head: CertifiedHead | None = None) -> Lookahead:
    """A :class:`~.lookahead.Lookahead` that appends to ``cache`` at its cursor (and trims
    rejected drafts), drafting at most ``draft_tokens`` ids and never past the model's
    positions. Its rows are logits ``(V,)``, or :class:`~.certified_head.HeadRow` s of
    ``head`` when one is given (a greedy decoder that reads the full logits only where the
    head cannot certify its id)."""
    limit = model_plan(model).max_position
    room = None if limit is None else (lambda: int(limit) - cache.next_position)
    return Lookahead(lambda ids, tail: next_rows(model, ids, cache, tail, head),
                     lambda n, _row: cache.trim(cache.n_past - n), [],
                     max_draft=draft_tokens, room=room)


def next_rows(model: nn.Module, tokens: Sequence[int], cache: NexusCache, tail: int,
              head: CertifiedHead | None = None) -> Sequence[HeadRow | mx.array]:
    """Append ``tokens`` at the cursor; the next-token rows of the last ``tail`` of them,
    evaluated: logits ``(V,)`` each, or :class:`~.certified_head.HeadRow` s of ``head``."""
    if head is None:
        logits = forward_tail(model, tokens, cache, tail)
        return [logits[i] for i in range(tail)]
    hidden = (forward_hidden(model, tokens, cache) if tail > 1
              else forward_last_hidden(model, tokens, cache))[:, -tail:]
    mx.eval(hidden)
    return [HeadRow(head, hidden[:, i: i + 1]) for i in range(tail)]


def _stepwise(
    model: nn.Module,
    cache: NexusCache,
    history: list[int],
    sampler: Sampler,
    processors: Sequence[LogitsProcessor],
    max_tokens: int,
    eos: set[int],
    stats: GenerationStats,
    start: float,
    draft_tokens: int,
) -> Iterator[int]:
    """The unpipelined loop (logits processors see every id on the host first), with copy drafts
    when ``draft_tokens`` > 0: every id goes through a :class:`~.lookahead.Lookahead`."""
    lookahead = cache_lookahead(model, cache, draft_tokens)
    try:
        logits = lookahead.feed(history)
        first = 0.0
        for count in range(1, max_tokens + 1):
            tok = _read(_sample(logits[None, None], history, sampler, processors))
            first = stats.tick(count, start, first)
            yield tok
            if tok in eos or count == max_tokens:
                return
            history.append(tok)
            logits = lookahead.feed([tok])
    finally:
        lookahead.close()  # the cache ends at the last id fed, as without drafts
        stats.drafted_tokens = lookahead.stats.drafted
        stats.accepted_tokens = lookahead.stats.accepted


def greedy_continuation(
    model: nn.Module,
    prompt_tokens: Sequence[int],
    cache: NexusCache,
    max_tokens: int,
    eos_token_ids: set[int] | None = None,
) -> list[int]:
    """The greedy ids after ``prompt_tokens``: :func:`generate_tokens` with the default sampler,
    up to ``max_tokens`` ids or through the first end-of-sequence id (kept, last). ``cache`` is
    advanced as ``generate_tokens`` leaves it; pass ``cache.copy()`` to keep the original."""
    return list(generate_tokens(model, [int(t) for t in prompt_tokens], cache,
                                max_tokens=max_tokens, eos_token_ids=eos_token_ids))


def generate(
    model: nn.Module,
    tokenizer: Any,
    prompt: str | Sequence[int],
    *,
    cache: NexusCache | None = None,
    max_tokens: int = 256,
    sampler: Sampler | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
    draft_tokens: int = 0,
) -> Generation:
    """Generate a completion of ``prompt`` (text or token ids); stops at end-of-sequence.
    ``draft_tokens``: as :func:`generate_tokens`'s."""
    tokens = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    cache = cache if cache is not None else make_cache(model)
    stats = GenerationStats()
    eos = set(eos_token_ids(tokenizer))
    out = list(
        generate_tokens(
            model, tokens, cache, max_tokens=max_tokens, eos_token_ids=eos, sampler=sampler,
            logits_processors=logits_processors, stats=stats, draft_tokens=draft_tokens,
        )
    )
    text_tokens = out[:-1] if out and out[-1] in eos else out
    return Generation(tokenizer.decode(text_tokens), out, stats)


def chat(
    model: nn.Module,
    tokenizer: Any,
    messages: Sequence[dict[str, str]] | str,
    **kwargs: Any,
) -> Generation:
    """One assistant turn for chat ``messages`` (a string is one user message), rendered by
    :func:`~nexus_mlx.models.tokenizer.chat_ids` (its plain fallback without a chat template)."""
    return generate(model, tokenizer, chat_ids(tokenizer, messages), **kwargs)
