"""NexusCache operations: equivalence with fresh prefills, layouts, mlx-lm round trips, and
failed operations that leave the cache byte-identical."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from tiny_models import VOCAB, tiny_model

from nexus_mlx.errors import CacheError, PositionError
from nexus_mlx.kv import cache as cache_module
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import RopeSpec
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n)


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) if np.asarray(a).size else 0.0


def _snapshot(cache: NexusCache):
    mx.eval(cache._keys, cache._values)
    return (
        cache.n_past,
        cache.capacity,
        cache.positions.tobytes(),
        [np.array(k).tobytes() for k in cache._keys],
        [np.array(v).tobytes() for v in cache._values],
    )


@pytest.fixture(params=["llama", "gemma2", "gemma3"])
def model(request):
    return tiny_model(request.param)


def _filled(model, n: int = 20, seed: int = 0) -> tuple[NexusCache, np.ndarray]:
    cache = make_cache(model)
    tokens = _tokens(n, seed)
    forward(model, tokens, cache)
    return cache, tokens


def test_shift_equals_prefill_at_shifted_positions(model):
    """RoPE attention sees only relative positions, so a whole-cache shift by d must equal a
    fresh prefill of the same tokens starting at position d, in every layer."""
    cache, tokens = _filled(model)
    cache.shift(0, cache.n_past, 333)
    fresh = make_cache(model)
    forward(model, tokens, fresh, positions=np.arange(333, 333 + tokens.size))
    assert np.array_equal(cache.positions, fresh.positions)
    for layer in range(cache.num_layers):
        assert _diff(cache.keys(layer), fresh.keys(layer)) <= TOL
        assert _diff(cache.values(layer), fresh.values(layer)) <= TOL
    nxt = [5]
    assert _diff(forward(model, nxt, cache), forward(model, nxt, fresh)) <= TOL


def test_shift_back_and_forth_restores_keys(model):
    cache, _ = _filled(model)
    before = [np.array(cache.keys(i)) for i in range(cache.num_layers)]
    cache.shift(4, 12, 1000)
    cache.shift(4, 12, -1000)
    for i, k in enumerate(before):
        assert _diff(cache.keys(i), k) <= 1e-5


def test_remove_tail_equals_prefill_of_prefix(model):
    cache, tokens = _filled(model)
    cache.remove(12, 20)
    fresh = make_cache(model)
    forward(model, tokens[:12], fresh)
    nxt = _tokens(3, 9)
    assert _diff(forward(model, nxt, cache), forward(model, nxt, fresh)) <= TOL


def test_remove_middle_keeps_rows_and_positions(model):
    cache, tokens = _filled(model)
    assert np.array_equal(cache.tokens, tokens)
    keys = [np.array(cache.keys(i)) for i in range(cache.num_layers)]
    values = [np.array(cache.values(i)) for i in range(cache.num_layers)]
    cache.remove(5, 9)
    assert cache.n_past == 16
    assert cache.positions.tolist() == list(range(5)) + list(range(9, 20))
    keep = np.r_[0:5, 9:20]
    assert np.array_equal(cache.tokens, tokens[keep])
    for i in range(cache.num_layers):
        assert np.array_equal(np.array(cache.keys(i)), keys[i][:, :, keep])
        assert np.array_equal(np.array(cache.values(i)), values[i][:, :, keep])


def test_remove_then_shift_gives_contiguous_positions(model):
    """Paper 2's Shift operator: delete e = [5, 9) and move the suffix down by |e|."""
    cache, _ = _filled(model)
    cache.remove(5, 9)
    cache.shift(5, cache.n_past, -4)
    assert np.array_equal(cache.positions, np.arange(16))
    cache.to_mlx_lm(model)  # contiguous again, so mlx-lm accepts it


def test_trim_and_fork(model):
    cache, tokens = _filled(model)
    part = cache.fork(3, 11)
    assert part.n_past == 8 and part.positions.tolist() == list(range(3, 11))
    assert np.array_equal(part.tokens, tokens[3:11])
    for i in range(cache.num_layers):
        assert np.array_equal(np.array(part.keys(i)), np.array(cache.keys(i))[:, :, 3:11])
    whole = cache.copy()
    forward(model, [1, 2], whole)  # the copy evolves on its own
    assert cache.n_past == 20 and whole.n_past == 22
    cache.trim(10)
    fresh = make_cache(model)
    forward(model, tokens[:10], fresh)
    assert _diff(forward(model, [7], cache), forward(model, [7], fresh)) <= TOL


def test_transposed_layout_stores_token_innermost():
    model = tiny_model("gemma2")
    cache, _ = _filled(model)
    assert cache.v_layout == "transposed"
    stored = cache.stored_values(0)
    assert stored.shape == (1, cache.n_kv_heads, cache.head_dim, 20)
    assert np.array_equal(np.array(stored).swapaxes(-1, -2), np.array(cache.values(0)))


def test_write_precomputed_rows_matches_forward(model):
    """K/V copied out of one cache and written into another reproduce its logits."""
    cache, tokens = _filled(model)
    other = make_cache(model)
    other.write(
        cache.positions,
        [cache.keys(i) for i in range(cache.num_layers)],
        [cache.values(i) for i in range(cache.num_layers)],
    )
    assert (other.tokens == -1).all()
    assert _diff(forward(model, [3], cache), forward(model, [3], other)) <= 1e-6


@pytest.mark.parametrize("layout", ["row", "transposed"])
@pytest.mark.parametrize("max_slice_runs", [cache_module.MAX_SLICE_RUNS, 0, 64])  # 0: scatter
@pytest.mark.parametrize("rows", [[4, 5, 6], [9, 2, 3, 4, 15], list(range(0, 20, 2)),
                                  [19, 18, 17, 0]])
def test_overwritten_rows_hold_the_new_kv_whether_sliced_or_scattered(
        monkeypatch, layout, max_slice_runs, rows):
    """Rows in any order and any number of runs get exactly the written K/V; others keep
    theirs, bit for bit."""
    monkeypatch.setattr(cache_module, "MAX_SLICE_RUNS", max_slice_runs)
    rng = np.random.default_rng(len(rows))
    cache = NexusCache([RopeSpec(head_dim=4, dims=4, base=1e4)], 2, 4, v_layout=layout)
    old_k, old_v = (rng.normal(size=(1, 2, 20, 4)).astype(np.float32) for _ in range(2))
    cache.write(np.arange(20), [mx.array(old_k)], [mx.array(old_v)])
    plan = cache.plan_write(rows, np.array(rows) + 100)
    assert plan.runs[0][0] == 0 and plan.runs[-1][1] == len(rows)
    cache.commit_positions(plan, None)
    new_k, new_v = (rng.normal(size=(1, 2, len(rows), 4)).astype(np.float32) for _ in range(2))
    cache.write_layer(0, plan, mx.array(new_k), mx.array(new_v))
    want_k, want_v = old_k.copy(), old_v.copy()
    want_k[:, :, rows], want_v[:, :, rows] = new_k, new_v
    assert np.array_equal(np.array(cache.keys(0)), want_k)
    assert np.array_equal(np.array(cache.values(0)), want_v)


def test_capacity_grows_in_steps():
    model = tiny_model("llama")
    cache = make_cache(model)
    cache.step = 16
    forward(model, _tokens(20), cache)
    assert cache.capacity == 32
    assert cache.nbytes == 2 * 2 * (2 * 32 * 16) * 4  # layers * (K,V) * heads*cap*dim * fp32


def test_mlx_lm_round_trip(model):
    tokens = _tokens(20)
    prompt_cache = make_prompt_cache(model)
    model(mx.array(tokens[:-1])[None], cache=prompt_cache)
    template = make_cache(model)
    cache = NexusCache.from_mlx_lm(prompt_cache, template.rope_specs, v_layout=template.v_layout)
    ref = model(mx.array(tokens)[None])
    out = forward(model, tokens[-1:], cache)
    assert _diff(out[0, -1], ref[0, -1]) <= TOL


def test_rotated_mlx_lm_cache_is_refused():
    model = tiny_model("gemma3")  # sliding layers use RotatingKVCache(max_size=8)
    prompt_cache = make_prompt_cache(model)
    model(mx.array(_tokens(19))[None], cache=prompt_cache)
    model(mx.array([3])[None], cache=prompt_cache)  # trims the sliding layers to 8 rows
    with pytest.raises(CacheError, match="rotated"):
        NexusCache.from_mlx_lm(prompt_cache, make_cache(model).rope_specs)


def test_to_mlx_lm_rejects_non_contiguous_positions():
    model = tiny_model("llama")
    cache, _ = _filled(model)
    cache.remove(2, 4)
    with pytest.raises(CacheError, match="positions 0..n_past-1"):
        cache.to_mlx_lm(model)


@pytest.mark.parametrize(
    "op, error",
    [
        (lambda c: c.remove(5, 3), CacheError),
        (lambda c: c.remove(-1, 3), CacheError),
        (lambda c: c.remove(10, 21), CacheError),
        (lambda c: c.remove(1.5, 3), CacheError),
        (lambda c: c.shift(0, 5, -1), PositionError),
        (lambda c: c.shift(3, 30, 2), CacheError),
        (lambda c: c.shift(0, 3, 0.5), CacheError),
        (lambda c: c.trim(25), CacheError),
        (lambda c: c.fork(4, 2), CacheError),
        (lambda c: c.write([20, 21], [mx.zeros((1, 2, 2, 8))] * 2, [mx.zeros((1, 2, 2, 8))] * 2), CacheError),
        (lambda c: c.write([20], [mx.zeros((1, 2, 1, 16))], [mx.zeros((1, 2, 1, 16))]), CacheError),
        (lambda c: c.plan_write([3, 3], [1, 2]), CacheError),
        (lambda c: c.plan_write([30], [1]), CacheError),
        (lambda c: c.plan_write([20], [-4]), PositionError),
        (lambda c: c.reserve(10_000), CacheError),
    ],
)
def test_failed_operation_leaves_cache_byte_identical(op, error):
    model = tiny_model("llama")
    cache = make_cache(model, max_tokens=512)
    forward(model, _tokens(20), cache)
    before = _snapshot(cache)
    with pytest.raises(error) as info:
        op(cache)
    assert str(info.value)
    assert _snapshot(cache) == before


def test_constructor_rejects_bad_layout():
    with pytest.raises(CacheError, match="v_layout"):
        make_cache(tiny_model("llama"), v_layout="diagonal")
