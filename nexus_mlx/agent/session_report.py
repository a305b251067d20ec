"""What a live session reports: :class:`StepReport` for each step, :class:`Reply` for each
generation, :class:`TokenLogprob` for each generated id when asked (plain records;
:mod:`.session` fills them in and re-exports them; :func:`token_logprob` makes the last, and a
:class:`LogprobRecorder` keeps a reply's, checking how many alternatives were asked for)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.decode.lookahead import LookaheadStats
from nexus_mlx.errors import ArgumentError

MAX_TOP_LOGPROBS = 20  # alternatives per id that ``logprobs`` may ask for (as OpenAI's API)


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
    stale: int = 0  # rows left stale after the step (see Session.stale_rows)
    from_blocks: int = 0  # of the spliced rows, those placed from compiled tool blocks
    guarded: int = 0  # stale rows healed because the next token was a close call (``guard``)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated id's log probability under the distribution it was drawn from (the
    logits after the processors and the turn's constraint), and the ``top`` most likely ids
    there with theirs (ids the constraint ruled out never appear)."""

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


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
    guarded: int = 0  # stale rows healed while decoding, before a close call (``guard``)
    drafts: LookaheadStats = field(default_factory=LookaheadStats)  # copy drafts while decoding
    logprobs: list[TokenLogprob] | None = None  # per id of ``tokens`` but an end-of-turn one

    @property
    def ended(self) -> bool:
        """Whether the model ended its turn itself (not cut at ``max_tokens`` or the context)."""
        return self.finish_reason != "length"


def token_logprob(logits: mx.array, token: int, top: int, vocab_size: int) -> TokenLogprob:
    """``token``'s log probability under ``logits`` ``(V,)`` (the row it was drawn from,
    log-softmaxed in float32), with the ``top`` most likely allowed ids below ``vocab_size``
    (a head padded past the tokenizer has ids no text maps to), best first. A value that is
    not finite reads -9999.0, as OpenAI's API writes the unlikeliest."""
    return token_logprobs(logits[None], [token], top, vocab_size)[0]


def token_logprobs(logits: mx.array, tokens: Sequence[int] | np.ndarray, top: int,
                   vocab_size: int) -> list[TokenLogprob]:
    """:func:`token_logprob` of ``tokens[i]`` under row ``i`` of ``logits (R, V)``, each step
    one operation over all the rows."""
    rows = logits.astype(mx.float32)
    rows = rows - mx.logsumexp(rows, axis=-1, keepdims=True)  # (R, V)
    ids = mx.array(np.asarray(tokens, dtype=np.int32).reshape(-1, 1))
    chosen = np.asarray(mx.take_along_axis(rows, ids, axis=-1)).reshape(-1)
    picked = values = np.zeros((len(chosen), 0))
    if top:
        named = rows[:, :vocab_size]
        k = min(top, named.shape[-1])
        best = mx.argpartition(-named, k - 1, axis=-1)[:, :k]  # (R, k), unordered
        picked, values = np.asarray(best), np.asarray(mx.take_along_axis(named, best, axis=-1))
    out = []
    for i, token in enumerate(np.asarray(tokens).reshape(-1)):
        order = np.argsort(-values[i], kind="stable")
        alternatives = tuple((int(picked[i, j]), float(values[i, j])) for j in order
                             if np.isfinite(values[i, j]))
        lp = float(chosen[i])
        out.append(TokenLogprob(int(token), lp if math.isfinite(lp) else -9999.0, alternatives))
    return out


class LogprobRecorder:
    """``recorder(row, token)`` appends ``token``'s :class:`TokenLogprob` (``top`` alternatives,
    ids below ``vocab_size``) to ``scores`` and hands it to ``on_logprob``; ``top`` outside
    ``[0, MAX_TOP_LOGPROBS]`` is an :class:`ArgumentError`."""

    def __init__(self, top: int, vocab_size: int,
                 on_logprob: Callable[[TokenLogprob], None] | None = None) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ArgumentError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got "
                                f"{top!r}")
        self.top, self.vocab_size, self.on_logprob = top, vocab_size, on_logprob
        self.scores: list[TokenLogprob] = []

    def __call__(self, row: mx.array, token: int) -> None:
        self.scores.append(token_logprob(row, token, self.top, self.vocab_size))
        if self.on_logprob is not None:
            self.on_logprob(self.scores[-1])
