"""Rebuilding a cache's live rows in one gather: moved runs, dropped rows, blank rows to fill.

Contract: ``regather(cache, sources, positions)`` replaces the live rows of ``cache``: new row
``r`` is a copy of old row ``sources[r]`` placed at ``positions[r]`` (its key re-rotated from the
old position to the new one, its value unchanged, its token id kept), or a blank row when
``sources[r] == -1`` (token id unknown, to be written by the next forward pass at that position).
``n_past`` becomes ``len(sources)``. Everything is validated first (sources live and distinct,
positions distinct and inside the model's limit); the new K/V go into fresh arrays, so the old
ones are never written, and :func:`snapshot` / :func:`restore` put a cache back exactly as it
was (the old arrays are only referenced, not copied). It is the primitive a session uses to
delete, insert and move spans in one step; it runs no model.

Keys are re-rotated once per row, by the difference between its new and old positions, in
float64 angles (within one float32 rounding of a fresh rotation; see :mod:`.rope`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import CacheError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.checks import check_positions, int_array
from nexus_mlx.kv.rope import reanchor


@dataclass(frozen=True)
class CacheState:
    """What :func:`restore` needs to put a cache back (references, not copies)."""

    n_past: int
    capacity: int
    positions: np.ndarray
    tokens: np.ndarray
    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]


def snapshot(cache: NexusCache) -> CacheState:
    """The cache's state; valid for :func:`restore` while nothing writes its current arrays in
    place (after :func:`regather` nothing does: it makes new ones)."""
    return CacheState(cache.n_past, cache.capacity, cache._positions.copy(),
                      cache._tokens.copy(), tuple(cache._keys), tuple(cache._values))


def restore(cache: NexusCache, state: CacheState) -> None:
    """Put ``cache`` back to ``state``."""
    cache.n_past, cache.capacity = state.n_past, state.capacity
    cache._positions, cache._tokens = state.positions.copy(), state.tokens.copy()
    cache._keys, cache._values = list(state.keys), list(state.values)


def _moves(sources: np.ndarray, positions: np.ndarray, old_positions: np.ndarray
           ) -> list[tuple[int, int, int]]:
    """Maximal runs ``(r0, r1, delta)`` of copied rows that move by the same ``delta``."""
    runs: list[tuple[int, int, int]] = []
    for r, src in enumerate(sources):
        if src < 0:
            continue
        delta = int(positions[r] - old_positions[src])
        if runs and runs[-1][1] == r and runs[-1][2] == delta:
            runs[-1] = (runs[-1][0], r + 1, delta)
        else:
            runs.append((r, r + 1, delta))
    return [run for run in runs if run[2] != 0]


def regather(cache: NexusCache, sources: Sequence[int] | np.ndarray,
             positions: Sequence[int] | np.ndarray) -> None:
    """Rebuild the live rows as described in the module docstring."""
    src = int_array(sources, "sources", CacheError)
    pos = int_array(positions, "positions", CacheError)
    if src.size != pos.size:
        raise CacheError(f"{src.size} sources for {pos.size} positions")
    copied = src[src >= 0]
    if (src < -1).any() or (copied.size and copied.max() >= cache.n_past):
        raise CacheError(f"sources must be live rows in [0, {cache.n_past}) or -1 (blank)")
    if np.unique(copied).size != copied.size:
        raise CacheError("a live row may be copied only once")
    if not cache._keys and copied.size:
        raise CacheError("an empty cache has no rows to copy")
    check_positions(pos, cache.position_limit)
    if np.unique(pos).size != pos.size:
        raise CacheError("the new rows' positions must be distinct")
    n = int(src.size)
    capacity = max(cache.step, math.ceil(max(n, 1) / cache.step) * cache.step)
    if cache.max_tokens is not None and n > cache.max_tokens:
        raise CacheError(f"{n} rows needed but the cache holds at most {cache.max_tokens}")
    if cache.max_tokens is not None:
        capacity = min(capacity, cache.max_tokens)
    runs = _moves(src, pos, cache._positions)
    index = np.zeros(capacity, dtype=np.int32)  # rows past n (and blanks) copy row 0: overwritten
    index[:n] = np.where(src >= 0, src, 0)
    idx = mx.array(index)
    v_axis = -1 if cache.v_layout == "transposed" else 2
    keys, values = [], []
    for layer, spec in enumerate(cache.rope_specs):
        k = mx.take(cache._keys[layer], idx, axis=2)  # (1, H, capacity, D), a new array
        for r0, r1, delta in runs:
            k[:, :, r0:r1, :] = reanchor(k[:, :, r0:r1, :], delta, spec)
        keys.append(k)
        values.append(mx.take(cache._values[layer], idx, axis=v_axis))
    mx.eval(keys, values)
    tokens = np.full(capacity, -1, np.int64)
    tokens[:n] = np.where(src >= 0, cache._tokens[np.maximum(src, 0)], -1)
    new_positions = np.zeros(capacity, np.int64)
    new_positions[:n] = pos
    cache._keys, cache._values = keys, values
    cache._tokens, cache._positions = tokens, new_positions
    cache.n_past, cache.capacity = n, capacity
