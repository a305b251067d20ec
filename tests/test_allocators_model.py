"""Prior-work-derived allocators (prophetkv, infoflow, cachecraft, cacheblend, a3, cachetune,
speccache): exact budgets for every B, caches left bit-identical, end-to-end repair, and one
check per allocator that its score reacts to what it claims to measure.

Two constructions make the reactions deterministic on random tiny models:
- an *identity-attention* rig: tokens A and B get private embedding directions that every
  layer's q/k projections map onto the lowest-frequency RoPE pair (nearly position-free), while
  all other tokens have q = k = 0 and attention/MLP outputs are zeroed. A query token then
  attends to the rows holding the same special token and uniformly elsewhere.
- the ``llama-sliding`` model, whose layer 0 attends only 8 positions back: a suffix token 7 or
  more positions past the seam never sees the deleted span before layer 1, so its layer-0
  output (layer-1 K/V, the first-third hidden state) is the same with or without the span.
"""

from __future__ import annotations

import math
from functools import cache

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_models import VOCAB, tiny_model

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.refresh import Edit, budget_tokens, repair, shift
from nexus_mlx.refresh.allocators import AllocationRequest, get_allocator
from nexus_mlx.refresh.allocators import attention_based as att
from nexus_mlx.refresh.allocators import kv_based as kvb

NAMES = ("prophetkv", "infoflow", "cachecraft", "cacheblend", "a3", "cachetune", "speccache")
MODELS = ("llama", "gemma2")
TOKENS = np.random.default_rng(1).integers(2, VOCAB, 56)  # ids 0 and 1 are the rig's specials
EDIT = Edit(12, 20)  # S = 36: two full 16-token spans and a short one
SUFFIX = len(TOKENS) - EDIT.p1
QUERY = np.array([5, 9, 17])
A, B = 0, 1  # special tokens of the identity-attention rig
RIG_DIMS = {A: 7, B: 6}  # head feature carrying each special direction (lowest RoPE frequencies)
SHARP = 1.5  # q/k gain: special-to-same-special score 16 * SHARP**2 * w**2 ~ 36


def _filled(model, tokens) -> NexusCache:
    cache = make_cache(model)
    forward(model, tokens, cache)
    cache.evaluate()
    return cache


def _request(model, dirty, edit, budget, query=QUERY, **options) -> AllocationRequest:
    return AllocationRequest(model, dirty, shift(dirty, edit), edit, np.asarray(query), budget,
                             options=options)


@cache
def _setup(name: str) -> tuple:
    model = tiny_model(name)
    dirty = _filled(model, TOKENS)
    return model, dirty, shift(dirty, EDIT)


def _snapshot(cache: NexusCache) -> tuple:
    layers = tuple(
        (np.array(cache.keys(i)).tobytes(), np.array(cache.stored_values(i)).tobytes())
        for i in range(cache.num_layers)
    )
    return cache.n_past, cache.positions.tobytes(), cache.tokens.tobytes(), layers


# ---- contract: exact budgets, caches untouched ----------------------------------------
@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=6, deadline=None)
@given(b=st.integers(0, SUFFIX))
@example(b=1)
@example(b=SUFFIX - 1)
def test_exact_budget_and_untouched_caches(name, model_name, b):
    model, dirty, shifted = _setup(model_name)
    before = (_snapshot(dirty), _snapshot(shifted))
    request = AllocationRequest(model, dirty, shifted, EDIT, QUERY, b)
    sel = np.asarray(get_allocator(name)(request))
    assert sel.shape == (b,) and np.issubdtype(sel.dtype, np.integer)
    assert np.all(np.diff(sel) > 0) and (b == 0 or (sel[0] >= 0 and sel[-1] < SUFFIX))
    assert (_snapshot(dirty), _snapshot(shifted)) == before


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("name", NAMES)
def test_end_to_end_repair(name, model_name):
    model, dirty, _ = _setup(model_name)
    before = _snapshot(dirty)
    result = repair(model, dirty, EDIT, QUERY.tolist(), budget=20, allocator=name)
    assert result.budget_tokens == budget_tokens(SUFFIX, 20) == result.selected.size == 8
    assert np.array_equal(result.rows, result.selected + EDIT.p0)
    assert result.cache.n_past == len(TOKENS) - EDIT.size
    assert _snapshot(dirty) == before


def test_scores_are_float32_per_suffix_token():
    model, dirty, shifted = _setup("gemma2")
    request = AllocationRequest(model, dirty, shifted, EDIT, QUERY, 4)
    for fn in (att.prophetkv_scores, att.infoflow_scores, att.cachecraft_scores, att.a3_scores,
               kvb.cacheblend_scores, kvb.cachetune_scores, kvb.speccache_scores):
        scores = fn(request)
        assert scores.shape == (SUFFIX,) and scores.dtype == np.float32, fn.__name__
        assert np.isfinite(scores).all(), fn.__name__


def test_bad_options():
    model, dirty, shifted = _setup("llama")
    with pytest.raises(ArgumentError, match="chunk"):
        att.cachecraft_scores(AllocationRequest(model, dirty, shifted, EDIT, QUERY, 3,
                                                options={"chunk": 0}))
    with pytest.raises(ArgumentError, match="span"):
        get_allocator("speccache")(AllocationRequest(model, dirty, shifted, EDIT, QUERY, 3,
                                                     options={"span": -2}))


# ---- the identity-attention rig -------------------------------------------------------
def _identity_attention_model(name: str):
    """Every layer attends A->A and B->B sharply and uniformly otherwise (see module doc)."""
    model = tiny_model(name)
    plan = model_plan(model)
    hidden, d = plan.hidden_size, plan.head_dim
    emb = np.array(model.model.embed_tokens.weight)
    emb[:, list(RIG_DIMS)] = 0.0
    for token in RIG_DIMS:
        emb[token] = 0.0
        emb[token, token] = math.sqrt(hidden)  # RMS 1: normalises to ~8 along its own axis
    model.model.embed_tokens.weight = mx.array(emb)
    for layer in model.layers:
        q = np.zeros((plan.n_heads * d, hidden), np.float32)
        k = np.zeros((plan.n_kv_heads * d, hidden), np.float32)
        for token, feature in RIG_DIMS.items():
            q[feature::d, token] = SHARP
            k[feature::d, token] = SHARP
        attn = layer.self_attn
        attn.q_proj.weight, attn.k_proj.weight = mx.array(q), mx.array(k)
        attn.o_proj.weight = mx.zeros_like(attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("name", ["prophetkv", "infoflow", "a3"])
def test_query_attention_prefers_the_suffix_token_matching_the_query(name, model_name):
    model = _identity_attention_model(model_name)
    tokens = TOKENS.copy()
    tokens[EDIT.p1 + 13], tokens[EDIT.p1 + 5] = A, B
    dirty = _filled(model, tokens)
    allocate = get_allocator(name)
    assert allocate(_request(model, dirty, EDIT, 1, query=[7, A, 8])).tolist() == [13]
    assert allocate(_request(model, dirty, EDIT, 1, query=[B])).tolist() == [5]
    scores = {"prophetkv": att.prophetkv_scores, "infoflow": att.infoflow_scores,
              "a3": att.a3_scores}[name](_request(model, dirty, EDIT, 1, query=[A]))
    assert scores[13] > 5 * np.median(scores)


def test_infoflow_and_prophetkv_read_the_same_attention():
    model, dirty, shifted = _setup("llama")
    request = AllocationRequest(model, dirty, shifted, EDIT, QUERY, 3)
    mean, l2 = att.prophetkv_scores(request), att.infoflow_scores(request)
    n = model_plan(model).num_layers * model_plan(model).n_heads * QUERY.size
    # entries in [0, 1]: sum / sqrt(n) <= L2 <= sum, with sum = n * mean
    assert np.all(mean * math.sqrt(n) <= l2 * (1 + 1e-5))
    assert np.all(l2 <= mean * n * (1 + 1e-5))


@pytest.mark.parametrize("model_name", MODELS)
def test_cachecraft_scores_attention_into_the_deleted_span(model_name):
    model = _identity_attention_model(model_name)
    tokens = TOKENS.copy()
    tokens[[EDIT.p0 + 1, EDIT.p0 + 3, EDIT.p0 + 5]] = A  # three A's inside e
    tokens[EDIT.p1 + 4] = A  # reads e
    tokens[[3, EDIT.p1 + 9]] = B  # reads the prefix, not e
    request = _request(model, _filled(model, tokens), EDIT, 1)
    scores = att.cachecraft_scores(request)
    assert int(np.argmax(scores)) == 4 and scores[4] > 0.5
    assert int(np.argmin(scores)) == 9 and scores[9] < 0.05
    assert get_allocator("cachecraft")(request).tolist() == [4]


def test_cachecraft_chunking_does_not_change_scores():
    model, dirty, _ = _setup("gemma2")
    one = att.cachecraft_scores(_request(model, dirty, EDIT, 3, chunk=64))
    many = att.cachecraft_scores(_request(model, dirty, EDIT, 3, chunk=5))
    assert np.max(np.abs(one - many)) <= 1e-5


# ---- state-deviation allocators -------------------------------------------------------
def _sliding_request(budget: int, **options) -> AllocationRequest:
    model = tiny_model("llama-sliding")  # layer 0: window 8, layer 1: global
    return _request(model, _filled(model, TOKENS), EDIT, budget, **options)


def test_cacheblend_sees_only_tokens_whose_layer1_state_saw_the_span():
    request = _sliding_request(7)
    scores = kvb.cacheblend_scores(request)
    assert scores[7:].max() <= 1e-8 and scores[:7].min() > 1e-3
    assert get_allocator("cacheblend")(request).tolist() == list(range(7))


def test_speccache_admits_whole_deviating_spans():
    request = _sliding_request(16)
    scores = kvb.speccache_scores(request)  # proxy = layer 0 of 2
    assert kvb.proxy_depth(request.shifted) == 1
    assert scores[7:].max() <= 1e-6 and scores[:7].max() > 1e-3
    assert get_allocator("speccache")(request).tolist() == list(range(16))
    assert get_allocator("speccache")(_sliding_request(8, span=4)).tolist() == list(range(8))
    partial = get_allocator("speccache")(_sliding_request(3)).tolist()
    assert set(partial) <= set(range(7))


def test_span_fill_fills_exactly():
    scores = np.array([0, 0, 5, 5, 1, 9, 1, 0, 0, 0], np.float32)
    assert kvb.span_fill(scores, 2, 4).tolist() == [2, 3, 4, 5]  # spans [2,4), [4,6) (tie)
    assert kvb.span_fill(scores, 4, 5).tolist() == [2, 4, 5, 6, 7]  # [4,8) whole, top of [0,4)
    assert kvb.span_fill(scores, 3, 0).tolist() == []


@pytest.mark.parametrize("model_name", MODELS)
def test_cachetune_unrotates_and_flags_the_odd_token(model_name):
    model = tiny_model(model_name)
    tokens = TOKENS.copy()
    tokens[EDIT.p1:] = 42
    tokens[EDIT.p1 + 17] = 43
    request = _request(model, _filled(model, tokens), EDIT, 1)
    # layer 0 keys of a repeated token are equal once un-rotated (and not before)
    raw = np.array(request.shifted.keys(0)[0, :, EDIT.p0:EDIT.p0 + 17])
    flat = np.array(kvb.unrotated_keys(request.shifted, 0, EDIT.p0))[:, :17]
    assert np.abs(flat - flat[:, :1]).max() <= 1e-5 < np.abs(raw - raw[:, :1]).max()
    assert get_allocator("cachetune")(request).tolist() == [17]


def test_lowpass():
    assert [kvb.lowpass_bins(s) for s in (1, 2, 7, 8, 36)] == [0, 1, 2, 2, 9]
    t = np.arange(16)
    assert np.abs(kvb.lowpass_error(np.ones((16, 3)))).max() <= 1e-8
    alternating = np.cos(np.pi * t)[:, None].astype(np.float32)  # the highest frequency
    assert np.allclose(kvb.lowpass_error(alternating), 1.0, atol=1e-5)
