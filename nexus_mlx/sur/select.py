"""Budgeted selection of Semantic-Unit Refresh (paper 2) over any token span.

Contract: :func:`sur_select` returns exactly ``budget`` sorted distinct indices into ``tokens``
for any budget in ``[0, len(tokens)]``: unit score = mean of its top-4 token relevances (all of
them if fewer); units ranked by score, ties to the higher mean relevance over the whole unit,
then to the earlier unit; with ``seam=n``, the first ``n`` indices form a unit of their own
placed right after the best-ranked one; admitted whole while they fit; the
remainder ``w`` goes to the width-``w`` window of the next ranked unit maximising the sum of the
forward-decay envelope ``u_t = max(exp(r_t - r_max), exp(-1/16) u_{t-1})``, ``u_0 = 0``, over
that unit (earliest window wins ties). The pieces (:func:`rank`, :func:`best_window`,
:func:`decay_envelope`, :func:`admit_units`, :func:`unit_scores`, :func:`unit_means`) are shared
with the control allocators. It reads the model's embedding table only; it runs no layer and
touches no cache.

Why the tie-break: the top-4 mean saturates. Any unit holding four tokens that occur in the query
scores the maximum 1.25, and stopwords ("the", "of", ",") put most paragraphs there; ranking those
by position alone passed over the unit that *is* about the query (Erasing-NIAH with the question
cached, Qwen2.5-Coder-0.5B, 20 cases: EM 0.55 of Replay at 5% before, 1.00 at 2% and 5% after;
``results/repair_niah_qwen_allocators.json``).

Why the seam (``sur_select(..., seam=n)``; the ``sur`` repair allocator's default is
``SEAM_ROWS`` = 4, ``seam=0`` is the paper's rule): the first rows after a deletion attended to
the deleted text as their nearest context, and no relevance score sees that. On Erasing-NIAH
with Qwen2.5-Coder-0.5B (40 cases at 1K and 2K), SUR recomputed the whole cached question and
still answered two codes on 2 cases ("3695, 3695"); the question plus the 4 rows after the edit
(20 rows) fixed both, where SUR's 58 rows had not. The seam is admitted right after the
best-ranked unit, so a budget too small for that unit is spent on it alone, as before; units
are ranked as they were without the seam (a unit the seam cuts keeps its whole score), so
where the best unit is the one right after the edit, the seam and it are that unit again. With
the seam SUR scores 0.85 / 0.875 at 2% / 5% (0.97 / 1.00 of Replay's 0.875; without it 0.825
at both) in ``results/repair_niah_qwen.json``.
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
SEAM_ROWS = 4  # the repair allocator's default seam (sur_select's own default is 0)

Fill = Callable[[int, int], int]  # (unit index, width) -> offset of the window inside the unit


def rank(scores: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices by descending score; among equal scores by descending ``tiebreak`` (if given),
    then earlier index first."""
    scores = np.asarray(scores, dtype=np.float64)
    keys: list[np.ndarray] = [np.arange(scores.size)]
    if tiebreak is not None:
        keys.append(-np.asarray(tiebreak, dtype=np.float64))
    return np.lexsort((*keys, -scores))


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


def unit_means(r: np.ndarray, units: Units) -> np.ndarray:
    """Mean relevance over each whole unit, ``(U,)``: SUR's tie-break."""
    return np.array([r[a:b].mean() for a, b in units.ranges], dtype=np.float64)


def checked_seam(seam: object) -> int:
    """``seam`` as a row count: a non-negative int (bools rejected), else an ArgumentError."""
    if isinstance(seam, bool) or not isinstance(seam, (int, np.integer)) or seam < 0:
        raise ArgumentError(f"seam must be a non-negative int (rows after the edit), got {seam!r}")
    return int(seam)


def with_seam(units: Units, width: int) -> tuple[Units, np.ndarray]:
    """``units`` with ``[0, width)`` made the first unit of its own (the units it overlaps cut at
    ``width``, those inside it gone), and each new unit's index in ``units`` (the seam's: 0).
    ``units`` itself for width 0."""
    if width <= 0:
        return units, np.arange(len(units))
    kept = [i for i, (_, b) in enumerate(units.ranges) if b > width]
    ranges = [(0, width)] + [(max(units.ranges[i][0], width), units.ranges[i][1]) for i in kept]
    containers = [units.containers[0]] + [units.containers[i] for i in kept]
    return Units(ranges, containers), np.array([0, *kept], dtype=np.int64)


def sur_select(
    model: nn.Module, tokenizer: Any, tokens: np.ndarray, query_tokens: np.ndarray, budget: int,
    seam: int = 0,
) -> np.ndarray:
    """Semantic-Unit Refresh over any token span: exactly ``budget`` sorted indices into
    ``tokens`` (used by the ``sur`` allocator and by query-directed splice repair). The first
    ``seam`` indices (the rows right after an edit) are admitted as one unit right after the
    best-ranked unit (see the module notes)."""
    if tokenizer is None:
        raise ArgumentError("SUR reads the text of the tokens: a tokenizer is required")
    seam_rows = min(checked_seam(seam), budget, len(tokens))
    text, spans = token_char_spans(tokenizer, tokens)
    units = units_from_text(text, spans)
    r = token_relevance(model, tokens, query_tokens)
    scores, means = unit_scores(r, units), unit_means(r, units)
    units, origin = with_seam(units, seam_rows)  # a cut unit ranks as the whole unit did

    def window(u: int, width: int) -> int:
        a, b = units.ranges[u]
        return best_window(decay_envelope(r[a:b]), width)

    order = rank(scores[origin], means[origin])
    if seam_rows and order[0] != 0:  # the seam right after the best unit, whatever its rank
        rest = order[order != 0]
        order = np.concatenate([rest[:1], [0], rest[1:]])
    return admit_units(units, order, budget, window)
