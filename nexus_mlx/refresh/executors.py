"""Executors: recompute chosen cache rows in place through all layers.

Contract: ``refresh(model, cache, rows, executor)`` recomputes the K/V of the given live rows
(sorted, distinct) from their token ids and positions; every recomputed query attends, by
absolute position, to the full causal mixed cache — fresh rows and reused ones alike. Rows not
selected stay bit-identical. Two executors with equal results (fp32, within float rounding):

- ``sequential``: the reference. Each maximal interval of consecutive rows is forwarded in
  order, through all layers, against the evolving cache.
- ``packed``: all selected rows are gathered once and advance through each layer together; their
  fresh K/V are written before that layer's attention (one forward call). Its cost is flat in
  the number of intervals.

Both evaluate the cache before returning (they are executors). They do not choose rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import CacheError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import forward
from nexus_mlx.refresh.budget import intervals

Executor = Literal["packed", "sequential"]
EXECUTORS: tuple[str, ...] = ("packed", "sequential")


def _checked_rows(cache: NexusCache, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(rows, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= cache.n_past):
        raise CacheError(f"rows to refresh must lie in [0, n_past={cache.n_past})")
    if arr.size > 1 and not np.all(np.diff(arr) > 0):
        raise CacheError("rows to refresh must be sorted and distinct")
    tokens = cache.tokens[arr]
    if (tokens < 0).any():
        raise CacheError("some rows to refresh have no token ids")
    return arr


def refresh_packed(model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray) -> None:
    """Recompute ``rows`` in one layer-major pass."""
    arr = _checked_rows(cache, rows)
    if arr.size:
        forward(model, cache.tokens[arr], cache, positions=cache.positions[arr], rows=arr,
                logits="last")
        cache.evaluate()


def refresh_sequential(model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray) -> None:
    """Recompute ``rows`` interval by interval, in order."""
    arr = _checked_rows(cache, rows)
    tokens, positions = cache.tokens, cache.positions
    for start, stop in intervals(arr):
        forward(model, tokens[start:stop], cache, positions=positions[start:stop],
                rows=np.arange(start, stop), logits="last")
        cache.evaluate()


def refresh(
    model: nn.Module, cache: NexusCache, rows: Sequence[int] | np.ndarray, executor: str = "packed"
) -> None:
    """Dispatch to the named executor."""
    if executor == "packed":
        refresh_packed(model, cache, rows)
    elif executor == "sequential":
        refresh_sequential(model, cache, rows)
    else:
        raise CacheError(f"executor {executor!r} is not one of {EXECUTORS}")
