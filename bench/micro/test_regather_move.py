"""A session's move step: one ``regather`` that deletes 132 rows 400 rows before the end of a
cache at depth 2,048 or 8,000 and shifts the 268 rows after them (keys re-anchored), in
SmolLM2-135M's K/V geometry (90 / 360 MB of K/V), built from joined slices (``sliced``, the
default) or by a row gather (``gathered``, what every rebuild did before; forced with
``MAX_SLICES = 0``). Compare the two modes' medians at the same depth from one run.

Reference, before timing: both modes give the same kept rows, bit for bit, in every layer, and
neither writes the arrays it copies from (a restore is exact).
"""

import numpy as np
import pytest
import mlx.core as mx

from nexus_mlx.kv import regather as regather_module
from nexus_mlx.kv.regather import regather, restore, snapshot
from nexus_mlx.models.forward import forward, make_cache

DELETED, TAIL = 132, 400
MODES = {"sliced": regather_module.MAX_SLICES, "gathered": 0}


def _filled(model, depth: int):
    cache = make_cache(model)
    ids = np.random.default_rng(depth).integers(0, model.args.vocab_size, depth)
    mx.eval(forward(model, ids, cache, logits="last"))
    cache.evaluate()
    return cache


def _rows(cache, kept: int) -> list[np.ndarray]:
    return [np.array(a)[:, :, :kept] for layer in range(cache.num_layers)
            for a in (cache.keys(layer), cache.values(layer))]


@pytest.mark.parametrize("depth", [2048, 8000])
@pytest.mark.parametrize("mode", list(MODES))
def test_regather_move(benchmark, copy_model, monkeypatch, depth, mode):
    cache = _filled(copy_model, depth)
    start = depth - TAIL
    sources = np.concatenate([np.arange(start), np.arange(start + DELETED, depth)])
    positions = np.arange(sources.size)
    state, before = snapshot(cache), _rows(cache, depth)
    built = {}
    for name, max_slices in MODES.items():
        monkeypatch.setattr(regather_module, "MAX_SLICES", max_slices)
        regather(cache, sources, positions)
        built[name] = _rows(cache, sources.size)
        restore(cache, state)
    for a, b in zip(built["sliced"], built["gathered"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_rows(cache, depth), before, strict=True):  # the old arrays never written
        np.testing.assert_array_equal(a, b)

    monkeypatch.setattr(regather_module, "MAX_SLICES", MODES[mode])

    def fresh():
        restore(cache, state)
        return (cache, sources, positions), {}

    benchmark.extra_info.update({"depth": depth, "deleted": DELETED, "moved": TAIL - DELETED,
                                 "mode": mode})
    benchmark.pedantic(regather, setup=fresh, rounds=10, warmup_rounds=1)
