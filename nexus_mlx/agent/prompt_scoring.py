"""The log probabilities of a prompt's own tokens under the model (teacher forcing).

Contract: ``prompt_logprobs(model, ids, top, vocab_size)`` returns one
:class:`~.session_report.TokenLogprob` per id after the first: ``ids[i]``'s log probability
under the model's next-token distribution after ``ids[:i]`` (raw logits, log-softmaxed in
float32: no sampler, processor or constraint, since nothing was drawn), with the ``top`` most
likely ids below ``vocab_size`` (:func:`~.session_report.token_logprob`). It is what the
completions API's ``echo`` with ``logprobs`` returns, and what evaluation harnesses score a
continuation by. One forward pass over a scratch cache computes the prompt's hidden states (the
live session is not touched: the prompt's rows are computed again); the output head runs
:data:`SCORE_CHUNK` rows at a time, so the ``(T, V)`` logits never exist at once. It knows
nothing about sessions, requests or HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.agent.session_report import TokenLogprob, token_logprob
from nexus_mlx.errors import ArgumentError
from nexus_mlx.models.forward import forward_hidden, lm_head, make_cache

SCORE_CHUNK = 64  # prompt rows whose logits exist at once (Qwen's vocabulary: 39 MB)


def prompt_logprobs(model: nn.Module, ids: Sequence[int] | np.ndarray, top: int,
                    vocab_size: int) -> list[TokenLogprob]:
    """The log probabilities of ``ids[1:]`` (module docstring); [] for a one-id prompt."""
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    if arr.size == 0:
        raise ArgumentError("a prompt to score needs at least one token")
    if arr.size == 1:
        return []
    hidden = forward_hidden(model, arr[:-1], make_cache(model, max_tokens=arr.size))
    out: list[TokenLogprob] = []
    for start in range(0, arr.size - 1, SCORE_CHUNK):
        logits = lm_head(model, hidden[:, start:start + SCORE_CHUNK])[0]  # (rows, V)
        mx.eval(logits)
        targets = arr[start + 1:start + 1 + SCORE_CHUNK]
        out.extend(token_logprob(logits[i], int(token), top, vocab_size)
                   for i, token in enumerate(targets))
    return out
