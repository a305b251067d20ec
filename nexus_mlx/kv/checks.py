"""Argument checks the cache makes before it plans a write or a shift (pure functions).

Contract: ``is_int`` accepts Python and NumPy integers but not bools; ``int_array`` turns rows,
positions or token ids into a flat int64 array and refuses floats and bools; ``check_positions``
refuses positions outside ``[0, limit)``; ``check_distinct`` refuses new positions that repeat
or that a kept live row already holds; ``checked_tokens`` validates token ids (-1 = unknown).
Each raises a :mod:`nexus_mlx.errors` exception naming the offending values.

It knows nothing about K/V storage, models or RoPE.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np

from nexus_mlx.errors import CacheError, PositionError


def is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    """A Python or NumPy integer, not a bool (``True`` is not a row, a position or a delta)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def int_array(values: Any, what: str, error: type[Exception]) -> np.ndarray:
    """``values`` as a flat int64 array; floats and bools raise ``error`` naming ``what``."""
    arr = np.asarray(values).reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise error(f"{what} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def check_positions(pos: np.ndarray, limit: int, what: str = "position") -> None:
    """Raise :class:`PositionError` unless every position is in ``[0, limit)``."""
    if pos.size and (pos.min() < 0 or pos.max() >= limit):
        bad = pos[(pos < 0) | (pos >= limit)][0]
        raise PositionError(
            f"{what} {int(bad)} is outside [0, {limit}) (the cache's position_limit, "
            "the model's max_position_embeddings)"
        )


def check_distinct(kept: np.ndarray, new: np.ndarray) -> None:
    """Raise :class:`PositionError` unless ``new`` positions are distinct and avoid ``kept``."""
    if kept.size == 0 or (new.size and new.min() > kept.max()):
        combined = new  # appending after every live position: only ``new`` can collide
    else:
        combined = np.concatenate([kept, new])
    if combined.size < 2:
        return
    values, counts = np.unique(combined, return_counts=True)
    if (counts > 1).any():
        dup = values[counts > 1]
        raise PositionError(
            f"positions {dup[:8].tolist()}{'...' if dup.size > 8 else ''} would be held by "
            "more than one live row (live positions must be distinct)"
        )


def checked_tokens(tokens: Any, n: int) -> np.ndarray | None:
    """Token ids for ``n`` rows as int64 (None stays None), or :class:`CacheError`."""
    if tokens is None:
        return None
    ids = int_array(tokens, "token ids", CacheError)
    if ids.size != n:
        raise CacheError(f"{ids.size} token ids for {n} rows")
    if ids.size and ids.min() < -1:
        raise CacheError(f"token id {int(ids.min())} is negative (-1 marks an unknown id)")
    return ids
