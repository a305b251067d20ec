"""Plan -> apply on every cache-mutating operation, and what repeated shifts make exact.

One test per reported bug (each failed before the fix): a splice past the model's position
limit, or onto positions live rows hold, was applied (or half applied) instead of refused;
``shift(..., True)`` and ``repair(budget=True)`` took the bool as 1. Then: refused operations
leave the cache byte-identical (whole storage, positions, token ids, n_past), failures while
applying are rolled back by ``NexusCache.transaction``, and the shift exactness contract of
``nexus_mlx.kv.cache``: one shift is within one float32 rotation's rounding of a fresh rotation
at any distance, repeated shifts drift (but stay under ``n * 2**-22 * max|K|``).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from cache_oracle import fresh_prefill, live_snapshot, max_diff, snapshot
from tiny_models import VOCAB, tiny_model

import nexus_mlx.blocks.splicing as splicing
import nexus_mlx.refresh.executors as executors
from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.errors import ArgumentError, CacheError, PositionError
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.refresh import Edit, budget_tokens, refresh_sequential, repair, shift
from nexus_mlx.refresh.allocators import ALLOCATORS, register

TOL = 1e-4
LIMIT = 4096  # the tiny models' max_position_embeddings
rng = np.random.default_rng(7)
HISTORY = rng.integers(0, VOCAB, 23)
SCHEMA = rng.integers(0, VOCAB, 16).tolist()
EDIT = Edit(5, 9)
QUERY = [3, 4, 5]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def block(model):
    return compile_block(model, None, SCHEMA)


def _filled(model, tokens=HISTORY):
    cache = make_cache(model)
    forward(model, tokens, cache)
    cache.evaluate()
    return cache


def _still_usable(model, cache):
    """The cache continues like a fresh prefill of what it claims to hold."""
    fresh, _ = fresh_prefill(model, cache)
    assert max_diff(forward(model, [5], cache.copy()), forward(model, [5], fresh)) <= TOL


# ---- bug 1: splice validated its positions only after writing ----------------------------
@pytest.mark.parametrize("curve", [Curve(), None], ids=["repaired", "bare"])
def test_splice_past_the_model_limit_is_refused_before_writing(model, block, curve):
    cache = _filled(model)
    before = snapshot(cache)
    with pytest.raises(PositionError, match="max_position_embeddings=4096"):
        splice(model, cache, block, at=5000, curve=curve)
    assert snapshot(cache) == before
    _still_usable(model, cache)


def test_splice_may_end_exactly_at_the_limit(model, block):
    cache = _filled(model)
    with pytest.raises(PositionError):
        splice(model, cache, block, at=LIMIT - len(SCHEMA) + 1, curve=None)
    result = splice(model, cache, block, at=LIMIT - len(SCHEMA), curve=None)
    assert cache.positions.max() == LIMIT - 1 and result.rows == (23, 39)


def test_splice_at_9000_on_the_default_model_is_refused(default_model):
    model, tokenizer = default_model
    blk = compile_block(model, tokenizer, "create_issue(owner: string, repo: string, title: string)")
    cache = make_cache(model)
    forward(model, tokenizer.encode("You are a helpful assistant. " * 4)[:23], cache)
    before = snapshot(cache)
    for curve in (Curve(), None):
        with pytest.raises(PositionError, match="8192"):
            splice(model, cache, blk, at=9000, curve=curve)
        assert snapshot(cache) == before
    forward(model, [42], cache)  # later forwards still work
    assert cache.n_past == 24


@pytest.mark.parametrize("at", [0, 10, 22])
def test_splice_onto_live_positions_is_refused(model, block, at):
    cache = _filled(model)
    before = snapshot(cache)
    with pytest.raises(PositionError, match="more than one live row"):
        splice(model, cache, block, at=at)
    assert snapshot(cache) == before


def test_splice_into_a_gap_is_allowed(model):
    small = compile_block(model, None, SCHEMA[:4])
    cache = _filled(model)
    cache.remove(5, 9)  # positions 5..8 are free now
    result = splice(model, cache, small, at=5, curve=None)
    assert result.rows == (19, 23)
    assert sorted(cache.positions.tolist()) == list(range(23))


@pytest.mark.parametrize("at", [True, 3.0, "4"])
def test_splice_rejects_non_integer_at(model, block, at):
    cache = _filled(model)
    before = snapshot(cache)
    with pytest.raises(ArgumentError, match="at must be an integer"):
        splice(model, cache, block, at=at)
    assert snapshot(cache) == before


def test_splice_failing_while_applying_is_rolled_back(model, block, monkeypatch):
    """Nothing validation can foresee (here: the seam repair's forward raising) may leave the
    block half written."""
    cache = make_cache(model)
    forward(model, rng.integers(0, VOCAB, 300), cache)  # deep: the curve asks for a repair
    cache.evaluate()
    before = live_snapshot(cache)

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(splicing, "forward", broken)
    with pytest.raises(RuntimeError, match="injected"):
        splice(model, cache, block)
    assert live_snapshot(cache) == before


# ---- bug 2: bools were taken as integers -------------------------------------------------
@pytest.mark.parametrize(
    "op",
    [
        lambda c: c.shift(0, c.n_past, True),
        lambda c: c.shift(0, c.n_past, False),
        lambda c: c.shift(True, 5, 3),
        lambda c: c.remove(False, True),
        lambda c: c.trim(True),
        lambda c: c.fork(True, 4),
        lambda c: c.reserve(True),
    ],
)
def test_bool_cache_arguments_are_refused(model, op):
    cache = _filled(model)
    before = snapshot(cache)
    with pytest.raises(CacheError, match="bool"):
        op(cache)
    assert snapshot(cache) == before


@pytest.mark.parametrize("in_place", [False, True])
def test_bool_repair_budget_is_refused(model, in_place):
    cache = _filled(model)
    before = snapshot(cache)
    with pytest.raises(ArgumentError, match="bool"):
        repair(model, cache, EDIT, QUERY, budget=True, allocator="legolink", in_place=in_place)
    assert snapshot(cache) == before
    with pytest.raises(ArgumentError, match="bool"):
        budget_tokens(10, True)


def test_bool_edit_bounds_are_refused(model):
    cache = _filled(model)
    with pytest.raises(CacheError, match="bool"):
        shift(cache, Edit(True, 5))


# ---- refused operations leave the cache byte-identical -----------------------------------
@pytest.mark.parametrize(
    "op, error",
    [
        (lambda c: c.shift(0, c.n_past, LIMIT), PositionError),  # past the model's limit
        (lambda c: c.shift(18, 20, 3), PositionError),  # onto live positions
        (lambda c: c.shift(0, 5, 5), PositionError),
        (lambda c: c.plan_write(None, [3]), PositionError),  # position already live
        (lambda c: c.plan_write(None, [30, 30]), PositionError),
        (lambda c: c.plan_write(None, [LIMIT]), PositionError),
        (lambda c: c.plan_write([True], [40]), CacheError),
        (lambda c: c.plan_write(None, [np.True_]), PositionError),
        (lambda c: c.write([40], [mx.zeros((1, 2, 1, 16))] * 2, [mx.zeros((1, 2, 1, 16))] * 2,
                           tokens=[1.5]), CacheError),
        (lambda c: c.write([40], [mx.zeros((1, 2, 1, 16))] * 2, [mx.zeros((1, 2, 1, 16))] * 2,
                           tokens=[-7]), CacheError),
    ],
)
def test_refused_cache_operations_change_nothing(model, op, error):
    cache = _filled(model)
    before = snapshot(cache)
    with pytest.raises(error):
        op(cache)
    assert snapshot(cache) == before


def test_shift_may_fill_a_gap(model):
    cache = _filled(model)
    cache.remove(5, 9)
    cache.shift(5, cache.n_past, -4)  # paper 2's Shift: into the freed positions
    assert cache.positions.tolist() == list(range(19))


def test_refused_repairs_change_nothing(model):
    if "test_atomic_raises" not in ALLOCATORS:
        @register("test_atomic_raises")
        def _raises(request):
            raise RuntimeError("allocator failure")

    cache = _filled(model)
    before = snapshot(cache)
    for kwargs, error in [
        ({"budget": 50, "allocator": "test_atomic_raises"}, RuntimeError),
        ({"budget": 50, "allocator": "legolink", "executor": "turbo"}, CacheError),
        ({"budget": 50, "allocator": "legolink", "in_place": 1}, ArgumentError),
        ({"budget": float("nan"), "allocator": "legolink"}, ArgumentError),
    ]:
        for in_place in (False, True):
            args = {"in_place": in_place, **kwargs}
            with pytest.raises(error):
                repair(model, cache, EDIT, QUERY, **args)
            assert snapshot(cache) == before, kwargs
    with pytest.raises(CacheError):
        repair(model, cache, Edit(20, 30), QUERY, allocator="legolink", in_place=True)
    assert snapshot(cache) == before


def test_in_place_repair_returns_the_input_cache(model):
    cache = _filled(model)
    result = repair(model, cache, EDIT, QUERY, budget=100, allocator="legolink", in_place=True)
    assert result.cache is cache and cache.n_past == 19
    _still_usable(model, cache)


def test_refresh_failing_midway_is_rolled_back(model, monkeypatch):
    """The sequential executor runs one forward per interval; a failure in the second must not
    leave the first interval recomputed."""
    stale = shift(_filled(model), EDIT)  # suffix rows encode the deleted span: recompute differs
    before = live_snapshot(stale)
    calls = []
    real = executors.forward

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(executors, "forward", second_fails)
    with pytest.raises(RuntimeError, match="injected"):
        refresh_sequential(model, stale, [6, 7, 15, 16])
    assert len(calls) == 2
    assert live_snapshot(stale) == before


def test_refresh_rejects_bad_rows_before_writing(model):
    cache = _filled(model)
    shape = (1, cache.n_kv_heads, 1, cache.head_dim)
    cache.write([23], [mx.zeros(shape)] * 2, [mx.zeros(shape)] * 2, tokens=[VOCAB + 3])
    before = snapshot(cache)
    for rows, error in [([2, 23], Exception), ([1.0, 2.0], CacheError), ([True], CacheError),
                        ([3, 2], CacheError), ([24], CacheError)]:
        with pytest.raises(error):
            refresh_sequential(model, cache, rows)
        assert snapshot(cache) == before


def test_transaction_restores_overwritten_rows_and_growth(model):
    cache = make_cache(model)
    cache.step = 8
    forward(model, HISTORY[:8], cache)  # capacity exactly 8: the next append grows storage
    cache.evaluate()
    before = live_snapshot(cache)
    with pytest.raises(RuntimeError), cache.transaction([2, 3]):
        forward(model, [1, 2], cache, positions=[2, 3], rows=[2, 3])  # overwrite in place
        forward(model, HISTORY[8:], cache)  # grow
        cache.evaluate()
        raise RuntimeError("abort")
    assert live_snapshot(cache) == before and cache.capacity == 8


# ---- what shifts make exact ---------------------------------------------------------------
def _rounding(cache) -> float:
    """One float32 rounding of the largest rotated pair: 2**-22 * max|K| over all layers."""
    return 2.0**-22 * max(float(mx.abs(cache.keys(i)).max()) for i in range(cache.num_layers))


@pytest.mark.parametrize("delta", [1, 7, 1000, LIMIT - 23])
def test_one_shift_is_within_one_rounding_at_any_distance(model, delta):
    """A whole-cache shift equals a prefill at the shifted positions (RoPE is relative): the
    keys of every layer differ by about one rounding however far they move."""
    cache = _filled(model)
    cache.shift(0, cache.n_past, delta)
    fresh = make_cache(model)
    forward(model, HISTORY, fresh, positions=np.arange(delta, delta + 23))
    assert np.array_equal(cache.positions, fresh.positions)
    for layer in range(cache.num_layers):
        assert max_diff(cache.keys(layer), fresh.keys(layer)) <= 4 * _rounding(cache)


def test_values_and_unmoved_rows_are_bit_exact_under_shift(model):
    cache = _filled(model)
    keys = [np.array(cache.keys(i)) for i in range(cache.num_layers)]
    values = [np.array(cache.values(i)) for i in range(cache.num_layers)]
    cache.shift(10, 23, 100)
    for i in range(cache.num_layers):
        assert np.array_equal(np.array(cache.values(i)), values[i])
        assert np.array_equal(np.array(cache.keys(i))[:, :, :10], keys[i][:, :, :10])


def test_repeated_shifts_drift_within_the_documented_bound(model):
    """100 round trips of +7 / -7 are 200 float32 rotations of the stored keys: they do not
    compose exactly (the drift exceeds a single rounding) but stay under n * 2**-22 * max|K|."""
    cache = _filled(model)
    original = [np.array(cache.keys(i)) for i in range(cache.num_layers)]
    one = _rounding(cache)
    for _ in range(100):
        cache.shift(0, cache.n_past, 7)
        cache.shift(0, cache.n_past, -7)
    assert np.array_equal(cache.positions, np.arange(23))  # positions are exact integers
    drift = max(max_diff(cache.keys(i), original[i]) for i in range(cache.num_layers))
    assert 4 * one < drift <= 200 * one


def test_reanchoring_from_the_stored_anchor_is_within_one_rounding(model, block):
    """A compiled block re-anchored once from m0 to 3000 lands within one rounding of a fresh
    rotation at 3000 (layer 0, which depends on token and position only)."""
    cache = make_cache(model)
    splice(model, cache, block, at=3000, curve=None)
    fresh = make_cache(model)
    forward(model, SCHEMA, fresh, positions=np.arange(3000, 3016))
    assert max_diff(cache.keys(0), fresh.keys(0)) <= 4 * _rounding(cache)
    assert max_diff(cache.values(0), fresh.values(0)) <= 1e-6
