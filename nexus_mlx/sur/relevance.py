"""Token relevance of the suffix to the query, from the model's frozen input embeddings (paper 2).

Contract: ``token_relevance(model, suffix, query) -> r`` of shape ``(S,)`` (float64) with
``r_i = max_j cos(E(s_i), E(q_j)) + 0.25 * [s_i in q]``, ``E`` the model's input embedding table
in float32 (a quantized table is dequantized, only for the rows asked for). The cosine is computed
in blocks of :data:`BLOCK` suffix tokens; a zero embedding row has cosine 0 with everything.
The table is read as stored: an architecture's embedding scale (Gemma) does not change a cosine.
A suffix token that occurs in the query has cosine exactly 1 (0 for a zero row), not float32's
rounding of it, so units that match the query equally tie exactly.

It does not know units, budgets or the text; it never runs the model's layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import TokenError

BLOCK = 1024
MATCH_BONUS = 0.25
_EPS = 1e-12


def embedding_rows(model: nn.Module, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the input embedding table as float32, ``(n, D)``; dequantized if needed."""
    table = model.model.embed_tokens
    rows = mx.array(ids.astype(np.int32))
    if "scales" in table:  # nn.QuantizedEmbedding
        biases = table["biases"][rows] if "biases" in table else None
        out = mx.dequantize(table.weight[rows], table.scales[rows], biases,
                            group_size=table.group_size, bits=table.bits,
                            mode=getattr(table, "mode", "affine"))
    else:
        out = table.weight[rows]
    return np.array(out.astype(mx.float32))  # (n, D)


def _vocab_size(model: nn.Module) -> int:
    return int(model.model.embed_tokens.weight.shape[0])


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)  # (n, 1)
    return x / np.maximum(norms, _EPS)


def _as_ids(tokens: Sequence[int] | np.ndarray, what: str, vocab: int) -> np.ndarray:
    ids = np.asarray(tokens).reshape(-1)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TokenError(f"{what} token ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    bad = ids[(ids < 0) | (ids >= vocab)]
    if bad.size:
        raise TokenError(f"{what} token id {int(bad[0])} is outside the vocabulary [0, {vocab})")
    return ids


def token_relevance(
    model: nn.Module,
    suffix: Sequence[int] | np.ndarray,
    query: Sequence[int] | np.ndarray,
    block: int = BLOCK,
) -> np.ndarray:
    """``r_i = max_j cos(E(s_i), E(q_j)) + 0.25 [s_i in q]`` for every suffix token, ``(S,)``."""
    vocab = _vocab_size(model)
    s_ids, q_ids = _as_ids(suffix, "suffix", vocab), _as_ids(query, "query", vocab)
    if q_ids.size == 0:
        raise TokenError("relevance needs at least one query token")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    rows, where = np.unique(np.concatenate([s_ids, q_ids]), return_inverse=True)
    table = _unit_rows(embedding_rows(model, rows))  # (R, D) unit rows of the tokens present
    s_where, q_where = where[: s_ids.size], where[s_ids.size :]
    q_vecs = table[q_where]  # (Q, D)
    r = np.empty(s_ids.size, dtype=np.float64)
    for start in range(0, s_ids.size, block):
        s_vecs = table[s_where[start : start + block]]  # (b, D)
        r[start : start + block] = (s_vecs @ q_vecs.T).max(axis=1)  # (b, Q) -> (b,)
    matched = np.isin(s_ids, q_ids)
    nonzero = (np.linalg.norm(table, axis=1) > 0.5)[s_where]  # unit rows: norm 1 or 0
    r = np.minimum(r, 1.0)
    r[matched & nonzero] = 1.0
    return r + MATCH_BONUS * matched
