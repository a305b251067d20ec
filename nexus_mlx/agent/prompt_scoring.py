"""The log probabilities of a prompt's own tokens under the model (teacher forcing).

Contract: ``prompt_logprobs(model, ids, top, vocab_size)`` returns one
:class:`~.session_report.TokenLogprob` per id after the first: ``ids[i]``'s log probability under
the model's next-token distribution after ``ids[:i]`` (raw logits, log-softmaxed in float32: no
sampler, processor or constraint, since nothing was drawn), with the ``top`` most likely ids below
``vocab_size`` (:func:`~.session_report.token_logprobs`, a chunk of rows at a time). It is what the
completions API's ``echo`` with ``logprobs`` returns, and what evaluation harnesses score a
continuation by. One forward pass over a scratch cache computes the prompt's hidden states (a live
session is not touched: the prompt's rows are computed again); the output head runs
:data:`SCORE_CHUNK` rows at a time, so the ``(T, V)`` logits never exist at once.

:class:`PromptScorer` scores the same way and keeps the last prompt's K/V and scores: a prompt
that shares a prefix with it (the continuations of one context an evaluation harness scores
one after another, the same prompt for each of ``n`` choices) reuses the scores of the tokens
inside the prefix and computes only the rows from the prefix's last one on. The scores equal
a fresh scoring's up to float32 rounding. Its :attr:`~PromptScorer.cache` (and
:meth:`~PromptScorer.rows_for`) lets a session that goes on to continue the prompt start from
those rows instead of computing them again; :attr:`~PromptScorer.nbytes` is what that K/V takes
(an int another thread may read, for a memory budget). Not thread-safe (the server scores on its MLX
thread). It knows nothing about sessions, requests or HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.agent.alignment import common_prefix
from nexus_mlx.agent.session_report import TokenLogprob, token_logprobs
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import forward_hidden, lm_head, make_cache

SCORE_CHUNK = 64  # prompt rows whose logits exist at once (Qwen's vocabulary: 39 MB)


def _scores(model: nn.Module, hidden: mx.array, targets: np.ndarray, top: int,
            vocab_size: int) -> list[TokenLogprob]:
    """The scores of ``targets`` under the logits of ``hidden (1, len(targets), D)``."""
    out: list[TokenLogprob] = []
    for start in range(0, targets.size, SCORE_CHUNK):
        logits = lm_head(model, hidden[:, start:start + SCORE_CHUNK])[0]  # (rows, V)
        mx.eval(logits)
        out.extend(token_logprobs(logits, targets[start:start + SCORE_CHUNK], top, vocab_size))
    return out


def prompt_logprobs(model: nn.Module, ids: Sequence[int] | np.ndarray, top: int,
                    vocab_size: int) -> list[TokenLogprob]:
    """The log probabilities of ``ids[1:]`` (module docstring); [] for a one-id prompt."""
    return PromptScorer(model, vocab_size).score(ids, top)


class PromptScorer:
    """Scores prompts, reusing the last one's common prefix (module docstring)."""

    def __init__(self, model: nn.Module, vocab_size: int) -> None:
        self.model, self.vocab_size = model, vocab_size
        self._ids = np.zeros(0, np.int64)  # the last prompt scored
        self._top = -1  # its alternatives per id
        self._cache: NexusCache | None = None  # its rows but the last
        self._scores: list[TokenLogprob] = []
        self.reused = self.computed = 0  # rows, over every call
        self.nbytes = 0  # bytes of the kept K/V (set after each call)

    def score(self, ids: Sequence[int] | np.ndarray, top: int) -> list[TokenLogprob]:
        """:func:`prompt_logprobs` of ``ids`` with ``top`` alternatives per id."""
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            raise ArgumentError("a prompt to score needs at least one token")
        if arr.size == 1:
            return []
        same = common_prefix(self._ids, arr) if top == self._top else 0  # shared ids
        keep = max(same - 1, 0)  # rows whose hidden state feeds a score both prompts share
        if keep == arr.size - 1:  # the last prompt, or a prefix of it: every score is kept
            self.reused += keep
            return self._scores[:keep]
        cache = (self._cache.fork(0, keep) if keep and self._cache is not None
                 else make_cache(self.model))
        hidden = forward_hidden(self.model, arr[keep:-1], cache)
        scores = self._scores[:keep] + _scores(self.model, hidden, arr[keep + 1:], top,
                                               self.vocab_size)
        self._ids, self._top, self._cache, self._scores = arr, top, cache, scores
        self.reused, self.computed = self.reused + keep, self.computed + arr.size - 1 - keep
        self.nbytes = int(cache.nbytes)
        return list(scores)

    def forget(self) -> None:
        """Drop the last prompt (its K/V and scores); the counters stay."""
        self._ids, self._top, self._cache, self._scores = np.zeros(0, np.int64), -1, None, []
        self.nbytes = 0

    @property
    def cache(self) -> NexusCache | None:
        """The K/V of the last prompt scored but its last id (rows computed exactly from
        position 0; the scorer keeps writing it: fork it to keep a copy)."""
        return self._cache

    def rows_for(self, ids: Sequence[int] | np.ndarray) -> int:
        """How many leading rows of :attr:`cache` hold ids equal to ``ids``' (at most all but
        its last id: whoever continues ``ids`` computes that one)."""
        if self._cache is None:
            return 0
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        return common_prefix(self._ids[:-1], arr[:-1])
