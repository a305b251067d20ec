"""Executors: recompute chosen cache rows in place through all layers.

Contract: ``refresh(model, cache, rows, executor)`` recomputes the K/V of the given live rows
(sorted, distinct) from their token ids and positions; every recomputed query attends, by
absolute position, to the full causal mixed cache — fresh rows and reused ones alike. Rows not
selected stay bit-identical. Two executors with equal results (fp32, within float rounding):

- ``sequential``: the reference. Each maximal interval of consecutive rows is forwarded in
  order, through all layers, against the evolving cache.
- ``packed``: all selected rows are gathered once and advance through each layer together; their
  fresh K/V are written before that layer's attention (one forward call; past ``PREFILL_CHUNK``
  rows it runs in chunks in position order, which is the same computation since no chunk can see
  a later one's rows). Its cost is flat in the number of intervals: the weights are traversed once
  per chunk, attention covers only the rows some selected query can see.

Everything is validated before the first row is written: the executor name, the cache against
the model, the rows (integers, not bools; sorted, distinct, live), their token ids (known and
inside the vocabulary) and positions (inside the model's limit). The recompute then runs in
``cache.transaction(rows)``, so a failure no check could foresee puts the rows back: a failed
refresh leaves the cache as it was. Both evaluate the cache before returning (they are
executors). They do not choose rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import CacheError, PositionError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, token_ids
from nexus_mlx.refresh.budget import intervals

Executor = Literal["packed", "sequential"]
EXECUTORS: tuple[str, ...] = ("packed", "sequential")


def _checked_rows(model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """The rows as sorted int64 after every check a forward over them would make."""
    plan = model_plan(model)
    cache.check_compatible(plan.rope_specs, plan.n_kv_heads, plan.head_dim)
    raw = np.asarray(rows).reshape(-1)
    if raw.size and not np.issubdtype(raw.dtype, np.integer):
        raise CacheError(f"rows to refresh must be integers, got dtype {raw.dtype}")
    arr = raw.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= cache.n_past):
        raise CacheError(f"rows to refresh must lie in [0, n_past={cache.n_past})")
    if arr.size > 1 and not np.all(np.diff(arr) > 0):
        raise CacheError("rows to refresh must be sorted and distinct")
    tokens = cache.tokens[arr]
    if (tokens < 0).any():
        raise CacheError("some rows to refresh have no token ids")
    if tokens.size:
        token_ids(tokens, plan.vocab_size)  # TokenError for ids outside the vocabulary
    positions = cache.positions[arr]
    if positions.size and plan.max_position is not None and positions.max() >= plan.max_position:
        raise PositionError(
            f"row position {int(positions.max())} is beyond the model's "
            f"max_position_embeddings={plan.max_position}"
        )
    return arr


def _packed(model: nn.Module, cache: NexusCache, arr: np.ndarray) -> None:
    if arr.size:
        forward(model, cache.tokens[arr], cache, positions=cache.positions[arr], rows=arr,
                logits="last")
        cache.evaluate()


def _sequential(model: nn.Module, cache: NexusCache, arr: np.ndarray) -> None:
    tokens, positions = cache.tokens, cache.positions
    for start, stop in intervals(arr):
        forward(model, tokens[start:stop], cache, positions=positions[start:stop],
                rows=np.arange(start, stop), logits="last")
        cache.evaluate()


_RUNNERS = {"packed": _packed, "sequential": _sequential}


def refresh_packed(model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray) -> None:
    """Recompute ``rows`` in one layer-major pass."""
    refresh(model, cache, rows, "packed")


def refresh_sequential(model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray) -> None:
    """Recompute ``rows`` interval by interval, in order."""
    refresh(model, cache, rows, "sequential")


def refresh(
    model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray, executor: str = "packed"
) -> None:
    """Validate everything, then recompute ``rows`` with the named executor."""
    if not isinstance(executor, str) or executor not in _RUNNERS:
        raise CacheError(f"executor {executor!r} is not one of {EXECUTORS}")
    arr = _checked_rows(model, cache, rows)
    if arr.size == 0:
        return
    with cache.transaction(arr):
        _RUNNERS[executor](model, cache, arr)
