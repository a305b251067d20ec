"""Budgeted selection of Semantic-Unit Refresh (paper 2) over any token span.

Contract: :func:`sur_select` returns exactly ``budget`` sorted distinct indices into ``tokens``
for any budget in ``[0, len(tokens)]``: unit score = mean of its top-4 token relevances (all of
them if fewer); units ranked by score (earlier wins ties) and admitted whole while they fit; the
remainder ``w`` goes to the width-``w`` window of the next ranked unit maximising the sum of the
forward-decay envelope ``u_t = max(exp(r_t - r_max), exp(-1/16) u_{t-1})``, ``u_0 = 0``, over
that unit (earliest window wins ties). The pieces (:func:`rank`, :func:`best_window`,
:func:`decay_envelope`, :func:`admit_units`, :func:`unit_scores`) are shared with the control
allocators. It reads the model's embedding table only; it runs no layer and touches no cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.models.tokenizer import token_char_spans
from nexus_mlx.sur.relevance import token_relevance
from nexus_mlx.sur.units import Units, units_from_text

TOP_TOKENS = 4
DECAY = math.exp(-1 / 16)

Fill = Callable[[int, int], int]  # (unit index, width) -> offset of the window inside the unit


def rank(scores: np.ndarray) -> np.ndarray:
    """Indices by descending score, earlier index first among equals."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.lexsort((np.arange(scores.size), -scores))


def best_window(values: np.ndarray, width: int) -> int:
    """Start of the width-``width`` window of ``values`` with the largest sum (earliest on ties)."""
    if not 0 < width <= values.size:
        raise ValueError(f"window width {width} must be in [1, {values.size}]")
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])  # (n + 1,)
    return int(np.argmax(sums[width:] - sums[:-width]))


def decay_envelope(r: np.ndarray, decay: float = DECAY) -> np.ndarray:
    """``u_t = max(exp(r_t - max r), decay * u_{t-1})`` with ``u_0 = 0``, ``(n,)``."""
    peaks = np.exp(np.asarray(r, dtype=np.float64) - np.max(r))
    u = np.empty_like(peaks)
    previous = 0.0
    for t, peak in enumerate(peaks):
        previous = max(peak, decay * previous)
        u[t] = previous
    return u


def admit_units(units: Units, order: np.ndarray, budget: int, fill: Fill) -> np.ndarray:
    """Whole units in ``order`` while they fit, then ``fill``'s window of the next for the rest."""
    picked: list[np.ndarray] = []
    left = budget
    for u in order:
        if left == 0:
            break
        a, b = units.ranges[u]
        width = min(b - a, left)
        offset = 0 if width == b - a else fill(int(u), width)
        picked.append(np.arange(a + offset, a + offset + width))
        left -= width
        if width < b - a:
            break
    out = np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)
    assert out.size == budget, f"admitted {out.size} positions for budget {budget}"
    return out


def unit_scores(r: np.ndarray, units: Units, top: int = TOP_TOKENS) -> np.ndarray:
    """Mean of each unit's ``top`` highest token scores, ``(U,)``."""
    return np.array([np.sort(r[a:b])[-top:].mean() for a, b in units.ranges], dtype=np.float64)


def sur_select(
    model: nn.Module, tokenizer: Any, tokens: np.ndarray, query_tokens: np.ndarray, budget: int
) -> np.ndarray:
    """Semantic-Unit Refresh over any token span: exactly ``budget`` sorted indices into
    ``tokens`` (used by the ``sur`` allocator and by query-directed splice repair)."""
    if tokenizer is None:
        raise ArgumentError("SUR reads the text of the tokens: a tokenizer is required")
    text, spans = token_char_spans(tokenizer, tokens)
    units = units_from_text(text, spans)
    r = token_relevance(model, tokens, query_tokens)

    def window(u: int, width: int) -> int:
        a, b = units.ranges[u]
        return best_window(decay_envelope(r[a:b]), width)

    return admit_units(units, rank(unit_scores(r, units)), budget, window)
