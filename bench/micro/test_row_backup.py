"""What a re-encode's transaction saves before it overwrites a cache's suffix: a backup of rows
``[100, depth)`` of every layer at depth 2,048 or 8,000, SmolLM2-135M's K/V geometry, copied as
slices (``sliced``, the default) or gathered row by row (``gathered``, what every backup did
before; forced with ``MAX_RUNS = 0``). Compare the two modes' medians at one depth.

Reference, before timing: both modes put the rows back bit for bit after they are overwritten.
"""

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.kv import row_backup as row_backup_module
from nexus_mlx.kv.row_backup import RowBackup
from nexus_mlx.models.forward import forward, make_cache

FIRST = 100
MODES = {"sliced": row_backup_module.MAX_RUNS, "gathered": 0}


@pytest.mark.parametrize("depth", [2048, 8000])
@pytest.mark.parametrize("mode", list(MODES))
def test_row_backup(benchmark, copy_model, monkeypatch, depth, mode):
    cache = make_cache(copy_model)
    ids = np.random.default_rng(depth).integers(0, copy_model.args.vocab_size, depth)
    mx.eval(forward(copy_model, ids, cache, logits="last"))
    cache.evaluate()
    rows = np.arange(FIRST, depth)
    transposed = cache.v_layout == "transposed"
    for max_runs in MODES.values():
        monkeypatch.setattr(row_backup_module, "MAX_RUNS", max_runs)
        keys, values = list(cache._keys), list(cache._values)
        want = [np.array(a) for a in keys + values]
        backup = RowBackup.save(keys, values, rows, transposed)
        for layer in range(len(keys)):
            keys[layer] = mx.zeros_like(keys[layer])
            values[layer] = mx.zeros_like(values[layer])
        backup.put_back(keys, values)
        axes = [2] * len(keys) + [3 if transposed else 2] * len(values)
        for got, full, axis in zip(keys + values, want, axes, strict=True):
            assert np.array_equal(np.take(np.array(got), rows, axis), np.take(full, rows, axis))

    monkeypatch.setattr(row_backup_module, "MAX_RUNS", MODES[mode])
    benchmark.extra_info.update({"depth": depth, "rows": int(rows.size), "mode": mode})
    benchmark.pedantic(RowBackup.save, args=(cache._keys, cache._values, rows, transposed),
                       rounds=10, warmup_rounds=1)
