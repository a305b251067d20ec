"""Row backups of a cache's K/V (what ``NexusCache.transaction`` saves): runs found exactly,
rows put back bit for bit after they were overwritten, whether copied as slices or gathered,
in both V layouts."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.kv import row_backup as row_backup_module
from nexus_mlx.kv.row_backup import RowBackup, row_runs

LAYERS, HEADS, CAPACITY, DIM = 3, 2, 40, 4


def test_row_runs_are_the_distinct_rows_in_maximal_runs():
    assert row_runs(np.array([5, 1, 2, 3, 3, 9, 10, 7])) == [(1, 4), (5, 6), (7, 8), (9, 11)]
    assert row_runs(np.array([], np.int64)) == []
    assert row_runs(np.array([0])) == [(0, 1)]


def _arrays(seed: int, transposed: bool) -> tuple[list[mx.array], list[mx.array]]:
    rng = np.random.default_rng(seed)
    keys = [mx.array(rng.normal(size=(1, HEADS, CAPACITY, DIM)).astype(np.float32))
            for _ in range(LAYERS)]
    v_shape = (1, HEADS, DIM, CAPACITY) if transposed else (1, HEADS, CAPACITY, DIM)
    values = [mx.array(rng.normal(size=v_shape).astype(np.float32)) for _ in range(LAYERS)]
    keys[0][0, 0, 3, 0] = -0.0  # a negative zero must come back as it was
    return keys, values


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("max_runs", [row_backup_module.MAX_RUNS, 64, 0])  # 0: always gathered
@pytest.mark.parametrize("rows", [[3, 4, 5, 20, 21, 39], list(range(0, 40, 2)), [7]])
def test_overwritten_rows_come_back_bit_for_bit(monkeypatch, transposed, max_runs, rows):
    monkeypatch.setattr(row_backup_module, "MAX_RUNS", max_runs)
    keys, values = _arrays(len(rows), transposed)
    before = [np.array(a) for a in keys + values]
    backup = RowBackup.save(keys, values, np.array(rows), transposed)
    assert (backup.gathered is not None) == (len(row_runs(np.array(rows))) > max_runs)
    v_axis = 3 if transposed else 2
    for layer in range(LAYERS):  # overwrite every row in place, as a failed write might
        keys[layer][:, :, :, :] = mx.full(keys[layer].shape, 7.0)
        values[layer][:, :, :, :] = mx.full(values[layer].shape, 7.0)
    mx.eval(keys, values)
    backup.put_back(keys, values)
    saved = np.zeros(CAPACITY, bool)
    saved[rows] = True
    for got, want, axis in zip([np.array(a) for a in keys + values], before,
                               [2] * LAYERS + [v_axis] * LAYERS, strict=True):
        assert np.array_equal(np.compress(saved, got, axis).view(np.uint32),
                              np.compress(saved, want, axis).view(np.uint32))
        assert (np.compress(~saved, got, axis) == 7.0).all()  # only the saved rows came back

