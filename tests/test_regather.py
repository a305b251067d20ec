"""One-gather rebuilds of a cache's rows: moved runs re-anchored (layer-0 keys equal a fresh
prefill's, which depend only on token and position), values untouched, blanks written by the
next forward pass, bad arguments refused with the cache unchanged, restore exact."""

from __future__ import annotations

import numpy as np
import pytest
from cache_oracle import snapshot as bytes_of
from tiny_models import VOCAB, tiny_model

from nexus_mlx.errors import CacheError, PositionError
from nexus_mlx.kv.regather import regather, restore, snapshot
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
