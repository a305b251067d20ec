"""One-copy rebuilds of a cache's rows: moved runs re-anchored (layer-0 keys equal a fresh
prefill's, which depend only on token and position), values untouched, blanks written by the
next forward pass, bad arguments refused with the cache unchanged, restore exact."""

from __future__ import annotations

import numpy as np
import pytest
from cache_oracle import snapshot as bytes_of
from tiny_models import VOCAB, tiny_model

from nexus_mlx.errors import CacheError, PositionError
from nexus_mlx.kv import regather as regather_module
from nexus_mlx.kv.regather import _pieces, regather, restore, snapshot
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4
IDS = np.random.default_rng(3).integers(0, VOCAB, 40)


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.array(a) - np.array(b))))


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_delete_insert_and_move_in_one_gather(model):
    cache = make_cache(model)
    forward(model, IDS, cache)
    values_before = np.array(cache.values(1))
    # keep [0, 10), drop [10, 15), two blanks, then the old rows [15, 40) two positions later
    sources = np.concatenate([np.arange(10), [-1, -1], np.arange(15, 40)])
    regather(cache, sources, np.arange(37))
    new_ids = np.concatenate([IDS[:10], [7, 8], IDS[15:]])
    assert cache.n_past == 37 and np.array_equal(cache.positions, np.arange(37))
    assert np.array_equal(cache.tokens[:10], IDS[:10]) and (cache.tokens[10:12] == -1).all()
    assert np.array_equal(np.array(cache.values(1))[:, :, 12:], values_before[:, :, 15:])
    forward(model, [7, 8], cache, positions=[10, 11], rows=[10, 11])
    fresh = make_cache(model)
    forward(model, new_ids, fresh)
    assert _diff(cache.keys(0), fresh.keys(0)) <= TOL  # every row: token + position only
    assert _diff(cache.keys(1)[:, :, :12], fresh.keys(1)[:, :, :12]) <= TOL  # exact rows
    assert _diff(cache.keys(1)[:, :, 12:], fresh.keys(1)[:, :, 12:]) > 1e-3  # stale rows


def test_bad_arguments_leave_the_cache_unchanged(model):
    cache = make_cache(model)
    forward(model, IDS, cache)
    before = bytes_of(cache)
    bad = [([0, 0], [0, 1], CacheError), ([0, 40], [0, 1], CacheError), ([0, -2], [0, 1], CacheError),
           ([0, 1], [0, 0], CacheError), ([0, 1], [0, 10**6], PositionError), ([0], [0, 1], CacheError)]
    for sources, positions, error in bad:
        with pytest.raises(error):
            regather(cache, sources, positions)
        assert bytes_of(cache) == before


def test_restore_is_exact(model):
    cache = make_cache(model)
    forward(model, IDS, cache)
    before, state = bytes_of(cache), snapshot(cache)
    regather(cache, np.arange(20, 40), np.arange(20))
    forward(model, IDS[:5], cache)
    restore(cache, state)
    assert bytes_of(cache) == before


def test_pieces_are_runs_of_consecutive_sources_then_zeros():
    sources = np.array([0, 1, 2, -1, -1, 7, 8, 3, -1])
    assert _pieces(sources, 12) == [(0, 3), (-1, 2), (7, 2), (3, 1), (-1, 4)]
    assert _pieces(np.arange(5), 5) == [(0, 5)]
    assert _pieces(np.array([], np.int64), 4) == [(-1, 4)]


@pytest.mark.parametrize("v_layout", ["row", "transposed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sliced_rebuild_equals_the_row_gather_and_never_writes_the_old_arrays(
        model, monkeypatch, v_layout, seed):
    rng = np.random.default_rng(seed)
    runs = [np.arange(a, b) for a, b in ((0, 8), (8, 14), (14, 25), (25, 40))]
    order = rng.permutation(len(runs))
    sources = np.concatenate([np.concatenate([runs[i], [-1] * int(rng.integers(0, 3))])
                              for i in order]).astype(np.int64)
    positions = np.arange(sources.size)
    built = {}
    for max_slices in (regather_module.MAX_SLICES, 0):  # 0: every rebuild gathers rows
        monkeypatch.setattr(regather_module, "MAX_SLICES", max_slices)
        cache = make_cache(model, v_layout=v_layout)
        forward(model, IDS, cache)
        before, state = bytes_of(cache), snapshot(cache)
        regather(cache, sources, positions)
        kept = sources >= 0
        built[max_slices] = [(np.array(cache.keys(layer))[:, :, kept],
                              np.array(cache.values(layer))[:, :, kept])
                             for layer in range(len(cache.rope_specs))]
        restore(cache, state)
        assert bytes_of(cache) == before
    sliced, gathered = built.values()
    for (k1, v1), (k2, v2) in zip(sliced, gathered, strict=True):
        assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
