"""Text-structured allocators of paper 2: SUR and four controls on the same relevance and units.

Every allocator here returns exactly ``request.budget`` sorted distinct suffix indices for any
budget in ``[0, S]``. Those that need units or text read ``request.tokenizer`` (an
:class:`ArgumentError` if it is None). Relevance ``r`` is :func:`token_relevance` of the suffix
against ``request.query_tokens``; units are :func:`units_from_text` of the decoded suffix.

- ``sur`` (Semantic-Unit Refresh): unit score = mean of its top-4 ``r`` (all of them if fewer);
  units ranked by score (ties: the higher mean ``r`` over the whole unit, then the earlier unit;
  see :mod:`nexus_mlx.sur.select` for why) and admitted whole while they fit; the remainder
  ``w`` goes to the width-``w`` window of the next ranked unit maximising the sum of the
  forward-decay envelope ``u_t = max(exp(r_t - r_max), exp(-1/16) u_{t-1})``, ``u_0 = 0``, over
  that unit (``r_max`` its largest ``r``; the argmax does not depend on it). Earliest window wins ties.
  Right after the best-ranked unit it admits the seam: the first ``seam`` suffix rows, right
  after the edit (option ``seam``, default ``SEAM_ROWS`` = 4; ``seam=0`` is the paper's rule
  exactly). See :mod:`nexus_mlx.sur.select` for why.
- ``dense_tokens``: the ``B`` tokens of highest ``r`` (earlier wins ties).
- ``single_window``: the contiguous width-``B`` window of highest total ``r`` (earliest wins ties).
- ``bm25_units``: units ranked by BM25 against the query (k1 = 1.2, b = 0.75; terms: maximal
  ASCII-alphanumeric runs, lowercased; document length in terms; idf
  ``ln(1 + (N - df + 0.5) / (df + 0.5))``; each distinct query term counted once), admitted
  whole while they fit, the remainder filled with the *prefix* of the next ranked unit.
- ``random_units``: units in the order of ``default_rng(request.seed).permutation(U)``, the same
  admit / prefix-fill rule.

It does not compute anything through the model's layers and does not modify either cache.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.models.tokenizer import token_char_spans
from nexus_mlx.refresh.allocators import AllocationRequest, register, top_k_positions
from nexus_mlx.sur.relevance import token_relevance
from nexus_mlx.sur.select import SEAM_ROWS, admit_units, best_window, rank, sur_select
from nexus_mlx.sur.units import Units, units_from_text

BM25_K1 = 1.2
BM25_B = 0.75
_TERM = re.compile(r"[A-Za-z0-9]+")

# ----------------------------------------------------------------------------- shared pieces


def _text_units(request: AllocationRequest, name: str) -> tuple[str, np.ndarray, Units]:
    if request.tokenizer is None:
        raise ArgumentError(f"allocator {name!r} reads the suffix text: pass tokenizer=... to repair()")
    text, spans = token_char_spans(request.tokenizer, request.suffix_tokens)
    return text, spans, units_from_text(text, spans)


def _relevance(request: AllocationRequest) -> np.ndarray:
    return token_relevance(request.model, request.suffix_tokens, request.query_tokens)


def _prefix(_unit: int, _width: int) -> int:
    return 0


# ----------------------------------------------------------------------------- BM25


def terms(text: str) -> list[str]:
    """Maximal ASCII-alphanumeric runs of ``text``, lowercased."""
    return [t.lower() for t in _TERM.findall(text)]


def bm25(docs: list[list[str]], query: list[str], k1: float = BM25_K1, b: float = BM25_B) -> np.ndarray:
    """BM25 of each document (a list of terms) against the distinct query terms, ``(N,)``."""
    n = len(docs)
    lengths = np.array([len(d) for d in docs], dtype=np.float64)  # (N,)
    scores = np.zeros(n, dtype=np.float64)
    if n == 0 or lengths.sum() == 0:
        return scores
    norm = k1 * (1 - b + b * lengths / lengths.mean())  # (N,)
    counts = [Counter(d) for d in docs]
    for term in sorted(set(query)):
        tf = np.array([c[term] for c in counts], dtype=np.float64)  # (N,)
        df = int(np.count_nonzero(tf))
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        scores += idf * tf * (k1 + 1) / (tf + norm)
    return scores


# ----------------------------------------------------------------------------- allocators


@register("sur")
def sur(request: AllocationRequest) -> np.ndarray:
    if request.tokenizer is None:
        raise ArgumentError("allocator 'sur' reads the suffix text: pass tokenizer=... to repair()")
    return sur_select(request.model, request.tokenizer, request.suffix_tokens,
                      request.query_tokens, request.budget,
                      seam=request.options.get("seam", SEAM_ROWS))


@register("dense_tokens")
def dense_tokens(request: AllocationRequest) -> np.ndarray:
    return top_k_positions(_relevance(request), request.budget)


@register("single_window")
def single_window(request: AllocationRequest) -> np.ndarray:
    if request.budget == 0:
        return np.zeros(0, np.int64)
    start = best_window(_relevance(request), request.budget)
    return np.arange(start, start + request.budget)


@register("bm25_units")
def bm25_units(request: AllocationRequest) -> np.ndarray:
    text, spans, units = _text_units(request, "bm25_units")
    docs = [terms(text[spans[a, 0] : spans[b - 1, 1]]) for a, b in units.ranges]
    query_text, _ = token_char_spans(request.tokenizer, request.query_tokens)
    return admit_units(units, rank(bm25(docs, terms(query_text))), request.budget, _prefix)


@register("random_units")
def random_units(request: AllocationRequest) -> np.ndarray:
    _, _, units = _text_units(request, "random_units")
    order = np.random.default_rng(request.seed).permutation(len(units))
    return admit_units(units, order, request.budget, _prefix)
