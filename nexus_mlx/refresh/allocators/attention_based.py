"""Allocators that read attention probabilities: ProphetKV-, InfoFlow-, Cache-Craft- and A3-adapted.

Contract: each registered allocator returns exactly ``request.budget`` sorted, distinct suffix
indices, the top-B of a per-token score (ties: the earlier index wins) that
``<name>_scores(request)`` returns as ``(S,)`` float32. Attention is observed through the
engine's probe (``models.forward``) during scratch passes on copies or forks; neither cache in
the request is modified. Probabilities are cast to float32 before any reduction.

- ``prophetkv`` (ProphetKV-adapted, Wang et al., ICML 2026): the query tokens are appended after
  the suffix on a copy of the Shift cache and run through every layer; a suffix token's score
  is the attention it receives, averaged over query tokens, heads and layers. Departs from
  ProphetKV: one pass and one uniform average, where ProphetKV runs a dual-stage pipeline that
  fuses layer-wise attention metrics into its selection; the keys the query reads are the stale
  Shift-cache ones (as a decoder would read them), not independently prefilled RAG chunks.
- ``infoflow`` (InfoFlow-motivated): the same query-attention tensor ``(L, H, Q, S)``; the score
  is its L2 norm over layers, heads and query tokens, so attention concentrated in a few
  (layer, head, query) routes outweighs the same total spread thinly. Only the idea (rank
  context tokens by the information the query draws from them) is taken; no flow is propagated
  across layers.
- ``cachecraft`` (Cache-Craft-adapted, Agarwal et al., SIGMOD 2025): on a copy of the *dirty*
  cache the suffix is replayed in 64-token chunks (option ``chunk``) with the deleted span's
  keys still visible; a suffix token's score is the attention mass its queries put on the rows
  of ``e``, averaged over heads and layers. Departs from Cache-Craft: it measures each token's
  attention into the chunks before it when a chunk-cache is created, to predict how much the
  cache changes under a new prefix; here the changed context is exactly the deleted span and the
  measurement happens at repair time, a full pass over the suffix that costs about as much as
  Replay (Cache-Craft amortises it offline). No reuse/recompute-ratio planning: the budget is
  given.
- ``a3`` (A3-adapted, Zhou et al., 2025): a fresh two-layer prefill of ``p + s`` (the Shift
  cache's exact prefix forked, the suffix run through layers 0-1), then the query run through the
  same two layers after it; a suffix token's score is the layer-1 (second layer) attention from
  the query, averaged over heads and query tokens. Departs from A3: a shallow two-layer probe
  replaces its attention over the full model's precomputed chunk caches, and the attention is
  read against freshly computed shallow K/V, so that stale keys cannot bias the ranking.

It does not know text structure, tokenizers or which executor will recompute the rows.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import AttentionProbe, forward_hidden
from nexus_mlx.refresh.allocators import AllocationRequest
from nexus_mlx.refresh.allocators.kv_based import (
    check_layer,
    edited_prefill,
    positive_option,
    ranked,
)

CACHECRAFT_CHUNK = 64


def column_probe(sink: list[mx.array], start: int, stop: int) -> AttentionProbe:
    """A probe appending each layer's probabilities on key rows ``[start, stop)``,
    ``(H, T, stop - start)`` float32, to ``sink``."""

    def probe(layer: int, probs: mx.array) -> None:
        sink.append(probs[0, :, :, start:stop].astype(mx.float32))  # (H, T, K)

    return probe


def query_attention(
    model: nn.Module,
    scratch: NexusCache,
    query_tokens: np.ndarray,
    start: int,
    stop: int,
    num_layers: int | None = None,
) -> mx.array:
    """Attention ``(L, H, Q, stop - start)`` that ``query_tokens``, appended after ``scratch``
    (which this call extends), put on its rows ``[start, stop)`` in the first ``num_layers``."""
    seen: list[mx.array] = []
    forward_hidden(model, query_tokens, scratch, num_layers=num_layers,
                   probe=column_probe(seen, start, stop))
    return mx.stack(seen)  # (L, H, Q, S)


def shift_query_attention(request: AllocationRequest) -> mx.array:
    """All-layer query attention on the suffix rows of a copy of the Shift cache, ``(L, H, Q, S)``."""
    p0 = request.edit.p0
    return query_attention(request.model, request.shifted.copy(), request.query_tokens,
                           p0, p0 + request.suffix_length)


def prophetkv_scores(request: AllocationRequest) -> np.ndarray:
    """Mean over layers, heads and query tokens of the attention each suffix token receives."""
    return np.array(shift_query_attention(request).mean(axis=(0, 1, 2)))


def infoflow_scores(request: AllocationRequest) -> np.ndarray:
    """L2 norm over layers, heads and query tokens of the attention each suffix token receives."""
    att = shift_query_attention(request)  # (L, H, Q, S)
    return np.array(mx.sqrt((att * att).sum(axis=(0, 1, 2))))


def cachecraft_scores(request: AllocationRequest) -> np.ndarray:
    """Attention mass each dirty suffix query puts on the deleted rows, mean over heads/layers."""
    chunk = positive_option(request, "chunk", CACHECRAFT_CHUNK)
    p0, p1 = request.edit.p0, request.edit.p1
    scratch = request.dirty.copy()
    tokens, positions = scratch.tokens, scratch.positions
    out: list[np.ndarray] = []
    for first in range(p1, scratch.n_past, chunk):
        rows = np.arange(first, min(first + chunk, scratch.n_past))
        seen: list[mx.array] = []
        forward_hidden(request.model, tokens[rows], scratch, positions=positions[rows], rows=rows,
                       probe=column_probe(seen, p0, p1))
        mass = mx.stack(seen).sum(axis=-1)  # (L, H, T)
        out.append(np.array(mass.mean(axis=(0, 1))))  # evaluates this chunk
    return np.concatenate(out).astype(np.float32)


def a3_scores(request: AllocationRequest) -> np.ndarray:
    """Layer-1 query attention on the suffix of a fresh two-layer edited prefill, mean over
    heads and query tokens."""
    layer = check_layer(request.shifted)
    scratch, _ = edited_prefill(request, layer + 1)
    p0 = request.edit.p0
    att = query_attention(request.model, scratch, request.query_tokens, p0,
                          p0 + request.suffix_length, num_layers=layer + 1)  # (L', H, Q, S)
    return np.array(att[layer].mean(axis=(0, 1)))


ranked("prophetkv", prophetkv_scores)
ranked("infoflow", infoflow_scores)
ranked("cachecraft", cachecraft_scores)
ranked("a3", a3_scores)
