"""Repair core: exact budgets, edit operators against a fresh re-prefill, packed executor equal
to the sequential reference, and the repair API's contract and rejections."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import VOCAB, tiny_model

from nexus_mlx.errors import ArgumentError, CacheError, TokenError
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.refresh import (
    Edit,
    budget_tokens,
    dirty,
    intervals,
    refresh_packed,
    refresh_sequential,
    repair,
    replay,
    reprefill,
    shift,
)
from nexus_mlx.refresh.allocators import ALLOCATORS, register

TOL = 1e-4
TOKENS = np.random.default_rng(0).integers(0, VOCAB, 40)
EDIT = Edit(10, 16)
QUERY = [3, 4, 5]


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.fixture(params=["llama", "gemma2", "gemma3"])
def model(request):
    return tiny_model(request.param)


def _filled(model):
    cache = make_cache(model)
    forward(model, TOKENS, cache)
    cache.evaluate()
    return cache


def _next_logits(model, cache):
    return np.array(forward(model, QUERY, cache.copy())[0])


@given(s=st.integers(0, 10_000), b=st.fractions(0, 100))
def test_budget_is_exact(s, b):
    got = budget_tokens(s, float(b))
    assert got == min(s, math.ceil(s * Fraction(float(b)) / 100))


def test_budget_examples_and_errors():
    assert budget_tokens(1000, 2) == 20 and budget_tokens(1001, 2) == 21
    assert budget_tokens(7, 0) == 0 and budget_tokens(7, 100) == 7
    for bad in (-0.1, 100.5, float("nan"), "5"):
        with pytest.raises(ArgumentError):
            budget_tokens(10, bad)


def test_intervals():
    assert intervals([1, 2, 3, 7, 9, 10]) == [(1, 4), (7, 8), (9, 11)]
    assert intervals([]) == []


def test_replay_equals_reprefill(model):
    cache = _filled(model)
    gold = reprefill(model, cache, EDIT)
    replayed = replay(model, cache, EDIT)
    assert np.array_equal(replayed.tokens, gold.tokens)
    assert np.array_equal(replayed.positions, gold.positions)
    for layer in range(gold.num_layers):
        assert _diff(replayed.keys(layer), gold.keys(layer)) <= TOL
        assert _diff(replayed.values(layer), gold.values(layer)) <= TOL
    assert _diff(_next_logits(model, replayed), _next_logits(model, gold)) <= TOL


def test_shift_and_dirty_differ_from_gold_but_are_well_formed(model):
    cache = _filled(model)
    shifted, untouched = shift(cache, EDIT), dirty(cache, EDIT)
    gold = reprefill(model, cache, EDIT)
    # well formed: Shift holds exactly p + s at positions 0..33, Dirty is p + e + s unchanged
    edited = np.concatenate([TOKENS[:10], TOKENS[16:]])
    assert shifted.n_past == gold.n_past == 34
    assert np.array_equal(shifted.positions, np.arange(34)) and np.array_equal(shifted.tokens, edited)
    assert np.array_equal(gold.tokens, edited)
    assert untouched.n_past == 40 and np.array_equal(untouched.tokens, TOKENS)
    assert np.array_equal(untouched.positions, np.arange(40))
    for layer in range(gold.num_layers):
        # the prefix never saw e: identical to the gold cache in both
        for stale in (shifted, untouched):
            assert _diff(stale.keys(layer)[:, :, :10], gold.keys(layer)[:, :, :10]) <= TOL
            assert _diff(stale.values(layer)[:, :, :10], gold.values(layer)[:, :, :10]) <= TOL
    # layer 0's K/V depend only on token and position: Shift's re-rotation is exact there,
    # and Dirty's suffix values (position-free) equal the gold's too
    assert _diff(shifted.keys(0)[:, :, 10:], gold.keys(0)[:, :, 10:]) <= TOL
    assert _diff(shifted.values(0)[:, :, 10:], gold.values(0)[:, :, 10:]) <= TOL
    assert _diff(untouched.values(0)[:, :, 16:], gold.values(0)[:, :, 10:]) <= TOL
    # but from layer 1 on the suffix still encodes e: both differ from the gold
    for layer in range(1, gold.num_layers):
        for stale, start in ((shifted, 10), (untouched, 16)):
            assert _diff(stale.keys(layer)[:, :, start:], gold.keys(layer)[:, :, 10:]) > 100 * TOL
            assert _diff(stale.values(layer)[:, :, start:], gold.values(layer)[:, :, 10:]) > 100 * TOL
    want = _next_logits(model, gold)
    assert _diff(_next_logits(model, shifted), want) > 100 * TOL
    assert _diff(_next_logits(model, untouched), want) > 100 * TOL


@pytest.mark.parametrize("rows", [[16, 17, 18, 25, 30, 31, 33], [10], list(range(10, 34, 3))])
def test_packed_equals_sequential(model, rows):
    shifted = shift(_filled(model), EDIT)
    a, b = shifted.copy(), shifted.copy()
    refresh_packed(model, a, rows)
    refresh_sequential(model, b, rows)
    untouched = np.setdiff1d(np.arange(34), rows)
    for layer in range(a.num_layers):
        assert _diff(a.keys(layer), b.keys(layer)) <= TOL
        assert _diff(a.values(layer), b.values(layer)) <= TOL
        ka, ks = np.array(a.keys(layer)), np.array(shifted.keys(layer))
        assert np.array_equal(ka[:, :, untouched], ks[:, :, untouched])  # bit-identical
    assert _diff(_next_logits(model, a), _next_logits(model, b)) <= TOL


def test_repair_api_contract():
    model = tiny_model("llama")
    cache = _filled(model)
    before = np.array(cache.keys(1))
    result = repair(model, cache, EDIT, QUERY, budget=25, allocator="legolink")
    assert result.suffix_length == 24 and result.budget_tokens == 6
    assert result.selected.tolist() == list(range(6))  # shallowest in their (single) chunk
    assert result.rows.tolist() == list(range(10, 16)) and result.intervals == [(10, 16)]
    assert set(result.timings) == {"shift", "selection", "refresh"}
    assert np.array_equal(np.array(cache.keys(1)), before) and cache.n_past == 40  # untouched
    full = repair(model, cache, EDIT, QUERY, budget=100, allocator="oracle")
    gold = reprefill(model, cache, EDIT)
    assert _diff(_next_logits(model, full.cache), _next_logits(model, gold)) <= TOL
    repair(model, cache, EDIT, QUERY, budget=0, allocator="oracle", in_place=True)
    assert cache.n_past == 34


def _suffix_deviation(shifted, gold, start: int) -> np.ndarray:
    """Per suffix row, the all-layer squared K/V distance between two caches, in float64."""
    total = np.zeros(gold.n_past - start)
    for layer in range(gold.num_layers):
        for a, b in ((shifted.keys(layer), gold.keys(layer)),
                     (shifted.values(layer), gold.values(layer))):
            d = np.asarray(a, np.float64)[0, :, start:] - np.asarray(b, np.float64)[0, :, start:]
            total += (d * d).sum(axis=(0, 2))  # (H, S, D) -> (S,)
    return total


@pytest.mark.parametrize("budget, picks", [(20, 5), (10, 3)])
def test_oracle_picks_the_most_deviant_rows(budget, picks):
    """The oracle's picks are the suffix rows whose stale K/V lie farthest from the gold
    re-prefill (computed here independently), not merely the right number of them."""
    model = tiny_model("llama")
    cache = _filled(model)
    result = repair(model, cache, EDIT, QUERY, budget=budget, allocator="oracle")
    assert result.budget_tokens == picks
    deviation = _suffix_deviation(shift(cache, EDIT), reprefill(model, cache, EDIT), EDIT.p0)
    expected = np.sort(np.argsort(-deviation, kind="stable")[:picks])
    assert result.selected.tolist() == expected.tolist()
    others = np.setdiff1d(np.arange(deviation.size), result.selected)
    assert deviation[result.selected].min() > deviation[others].max()
    assert result.selected.tolist() != list(range(picks))  # not just the rows nearest the edit


def test_bad_requests():
    model = tiny_model("llama")
    cache = _filled(model)
    with pytest.raises(CacheError):
        repair(model, cache, Edit(30, 50), QUERY)
    with pytest.raises(CacheError):
        repair(model, cache, Edit(5, 5), QUERY)
    with pytest.raises(ArgumentError):
        repair(model, cache, EDIT, QUERY, budget=120, allocator="legolink")
    with pytest.raises(TokenError):
        repair(model, cache, EDIT, [], allocator="legolink")
    with pytest.raises(ArgumentError, match="unknown allocator"):
        repair(model, cache, EDIT, QUERY, allocator="nope")
    with pytest.raises(CacheError, match="executor"):
        repair(model, cache, EDIT, QUERY, allocator="legolink", executor="turbo")
    assert cache.n_past == 40


def test_contract_breaking_allocator_is_caught():
    if "test_greedy_bad" not in ALLOCATORS:
        register("test_greedy_bad")(lambda req: np.arange(req.budget + 1))
    model = tiny_model("llama")
    with pytest.raises(ArgumentError, match="returned 4 positions for budget 3"):
        repair(model, _filled(model), EDIT, QUERY, budget=10, allocator="test_greedy_bad")
