"""Copies of some rows of a cache's K/V arrays, put back after a failed write.

Contract: :meth:`RowBackup.save` copies the given rows (any order, repeats allowed) of every
layer's K and V into buffers of their own, evaluated, so the cache's big arrays gain no extra
reference and can still be written in place; :meth:`RowBackup.put_back` writes the copies back
into the same rows of the arrays then in the cache (same shapes). Runs of consecutive rows are
copied as slices, at memory speed; past :data:`MAX_RUNS` runs the rows are gathered instead.
K is ``(1, H, capacity, D)``; V the same, or ``(1, H, D, capacity)`` when ``transposed``. It
knows nothing of positions, tokens or models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

MAX_RUNS = 4
"""Above this many runs of consecutive rows, a backup gathers rows instead of copying slices:
one gather per array costs about what 4 slice copies cost (SmolLM2 at 2,048 rows, 30 layers,
64 rows: 2.3 ms in 4 runs either way; in 16 runs 9.3 ms as slices, 3.0 ms gathered)."""


def intervals(rows: Sequence[int] | np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive values in sorted ``rows`` as ``[(start, stop), ...]``."""
    arr = np.asarray(rows, dtype=np.int64)
    if arr.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(arr) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [arr.size]])
    return [(int(arr[a]), int(arr[b - 1]) + 1) for a, b in zip(starts, stops, strict=True)]


def row_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """The distinct ``rows`` as maximal half-open runs ``(r0, r1)``, ascending."""
    return intervals(np.unique(rows))


def _rows_of(array: mx.array, axis: int, r0: int, r1: int) -> mx.array:
    index = [slice(None)] * array.ndim
    index[axis] = slice(r0, r1)
    return array[tuple(index)]


@dataclass
class RowBackup:
    """Saved rows: per layer, one (K, V) copy per run, or one gathered (K, V) per layer."""

    runs: list[tuple[int, int]]
    gathered: np.ndarray | None  # the distinct rows, when they were gathered
    saved: list[list[tuple[mx.array, mx.array]]]
    v_axis: int

    @classmethod
    def save(cls, keys: list[mx.array], values: list[mx.array], rows: np.ndarray,
             transposed: bool) -> RowBackup:
        v_axis = 3 if transposed else 2
        runs = row_runs(rows)
        if len(runs) > MAX_RUNS:
            distinct = np.unique(rows)
            idx = mx.array(distinct.astype(np.int32))
            saved = [[(mx.take(k, idx, axis=2), mx.take(v, idx, axis=v_axis))]
                     for k, v in zip(keys, values, strict=True)]
            backup = cls(runs, distinct, saved, v_axis)
        else:  # "* 1": an elementwise copy owns its buffer (a slice would pin the big one)
            saved = [[(_rows_of(k, 2, r0, r1) * 1, _rows_of(v, v_axis, r0, r1) * 1)
                      for r0, r1 in runs] for k, v in zip(keys, values, strict=True)]
            backup = cls(runs, None, saved, v_axis)
        mx.eval(backup.saved)
        return backup

    def put_back(self, keys: list[mx.array], values: list[mx.array]) -> None:
        """Write the saved rows into ``keys`` / ``values`` (replacing their list items)."""
        places = ([mx.array(self.gathered.astype(np.int32))] if self.gathered is not None
                  else [slice(r0, r1) for r0, r1 in self.runs])
        for layer, copies in enumerate(self.saved):
            k_new, v_new = keys[layer], values[layer]
            for place, (k, v) in zip(places, copies, strict=True):
                k_index: list[object] = [slice(None)] * k_new.ndim
                k_index[2] = place
                k_new[tuple(k_index)] = k
                v_index: list[object] = [slice(None)] * v_new.ndim
                v_index[self.v_axis] = place
                v_new[tuple(v_index)] = v
            keys[layer], values[layer] = k_new, v_new
        mx.eval(keys, values)
