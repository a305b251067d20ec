"""Equivalence oracles for the explicit-position engine: logits equal mlx-lm's own forward
(float32, max abs diff <= 1e-4) for every architecture, whatever the chunking or order."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_models import ARCHITECTURES, CONFIGS, VOCAB, tiny_model

from nexus_mlx.errors import CacheError, PositionError, TokenError
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4
T = 24  # longer than the sliding windows (8) of the tiny sliding models
ALL_VARIANTS = tuple(CONFIGS)


def _tokens(n: int = T, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n)


def _reference(model, tokens: np.ndarray) -> np.ndarray:
    out = model(mx.array(tokens)[None])
    return np.array(out[0].astype(mx.float32))


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.fixture(scope="module", params=ALL_VARIANTS)
def model_and_ref(request):
    model = tiny_model(request.param)
    tokens = _tokens()
    return model, tokens, _reference(model, tokens)


def test_full_prefill_matches_mlx_lm(model_and_ref):
    model, tokens, ref = model_and_ref
    cache = make_cache(model)
    logits = forward(model, tokens, cache)
    assert logits.shape == (1, T, VOCAB)
    assert _max_diff(logits[0], ref) <= TOL
    assert cache.n_past == T
    assert np.array_equal(cache.positions, np.arange(T))


def test_chunked_prefill_matches(model_and_ref):
    model, tokens, ref = model_and_ref
    cache = make_cache(model)
    outs = [forward(model, tokens[a:b], cache)[0] for a, b in ((0, 5), (5, 13), (13, T))]
    assert _max_diff(mx.concatenate(outs, axis=0), ref) <= TOL


def test_token_by_token_decode_matches(model_and_ref):
    model, tokens, ref = model_and_ref
    cache = make_cache(model)
    for i, tok in enumerate(tokens):
        out = forward(model, [int(tok)], cache, logits="last")
        assert _max_diff(out[0, 0], ref[i]) <= TOL, f"token {i}"


def test_permuted_positions_in_one_call(model_and_ref):
    """Tokens fed in a shuffled order at their true positions give the prefill logits."""
    model, tokens, ref = model_and_ref
    perm = np.random.default_rng(3).permutation(T)
    cache = make_cache(model)
    out = forward(model, tokens[perm], cache, positions=perm)
    assert _max_diff(out[0], ref[perm]) <= TOL
    assert np.array_equal(cache.positions, perm)


def test_packed_refresh_of_fragmented_rows(model_and_ref):
    """Re-forwarding scattered rows in place (packed repair) reproduces their logits and
    leaves the cache values unchanged."""
    model, tokens, ref = model_and_ref
    cache = make_cache(model)
    forward(model, tokens, cache)
    keys_before = [np.array(cache.keys(i)) for i in range(cache.num_layers)]
    picked = np.array([2, 3, 9, 15, 16, 23])
    out = forward(model, tokens[picked], cache, positions=picked, rows=picked)
    assert _max_diff(out[0], ref[picked]) <= TOL
    assert cache.n_past == T
    for i, before in enumerate(keys_before):
        assert _max_diff(cache.keys(i), before) <= 1e-5


def test_packed_order_of_rows_differs_from_positions(model_and_ref):
    """Row order need not follow position order, across calls: the later half of the sequence
    is written first (rows 0..half-1), the earlier half after it (rows half..T-1), then the later
    half is re-forwarded in place. Attention must follow positions, not rows, at every step."""
    model, tokens, ref = model_and_ref
    half = T // 2
    late, early = np.arange(half, T), np.arange(half)
    cache = make_cache(model)
    forward(model, tokens[late], cache, positions=late)  # rows 0..half-1; no context before them
    # rows half..T-1 at positions 0..half-1: must not see rows 0..half-1 (later positions)
    out = forward(model, tokens[early], cache, positions=early)
    assert _max_diff(out[0], ref[:half]) <= TOL
    assert np.array_equal(cache.positions, np.concatenate([late, early]))
    # now the later half, in place, sees the earlier one in the rows after it
    out = forward(model, tokens[late], cache, positions=late, rows=np.arange(half))
    assert _max_diff(out[0], ref[half:]) <= TOL
    fresh = make_cache(model)
    forward(model, tokens, fresh)
    order = mx.array(np.argsort(cache.positions))  # the rows of positions 0..T-1
    for i in range(cache.num_layers):
        assert _max_diff(cache.keys(i)[:, :, order], fresh.keys(i)) <= 1e-5
        assert _max_diff(cache.values(i)[:, :, order], fresh.values(i)) <= 1e-5


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_mlx_lm_generate_continues_from_nexus_cache(name):
    model = tiny_model(name)
    tokens = _tokens()
    cache = make_cache(model)
    forward(model, tokens[:-1], cache)
    prompt_cache = cache.to_mlx_lm(model)
    out = model(mx.array(tokens[-1:])[None], cache=prompt_cache)
    ref = _reference(model, tokens)
    assert _max_diff(out[0, -1], ref[-1]) <= TOL


def test_gemma2_uses_transposed_v_layout():
    model = tiny_model("gemma2")
    assert make_cache(model).v_layout == "transposed"
    assert make_cache(tiny_model("llama")).v_layout == "row"


def test_row_layout_override_gives_same_logits():
    model = tiny_model("gemma2")
    tokens = _tokens()
    a = forward(model, tokens, make_cache(model, v_layout="row"))
    b = forward(model, tokens, make_cache(model, v_layout="transposed"))
    assert _max_diff(a, b) <= 1e-5


# ---- bad input: specific errors, cache untouched ------------------------------------------
def _snapshot(cache):
    return (
        cache.n_past,
        cache.positions.tobytes(),
        [np.array(cache.keys(i)).tobytes() for i in range(cache.num_layers)],
        [np.array(cache.values(i)).tobytes() for i in range(cache.num_layers)],
    )


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"positions": [-1, 0]}, PositionError),
        ({"positions": [5000, 5001]}, PositionError),  # beyond max_position_embeddings
        ({"positions": [1, 2, 3]}, PositionError),  # count mismatch
        ({"rows": [40, 41]}, Exception),  # leaves a gap
        ({"rows": [3, 3]}, Exception),  # duplicate rows
        ({"tokens": [VOCAB, 1]}, TokenError),
        ({"tokens": []}, TokenError),
        ({"tokens": [0.5, 1.0]}, TokenError),
    ],
)
def test_bad_input_is_rejected_and_cache_unchanged(kwargs, error):
    model = tiny_model("llama")
    cache = make_cache(model)
    forward(model, _tokens(10), cache)
    mx.eval(cache._keys, cache._values)
    before = _snapshot(cache)
    args = {"tokens": [1, 2], **kwargs}
    tokens = args.pop("tokens")
    with pytest.raises(error) as info:
        forward(model, tokens, cache, **args)
    assert str(info.value)
    assert _snapshot(cache) == before


def test_cache_overflow_is_reported():
    model = tiny_model("llama")
    cache = make_cache(model, max_tokens=16)
    forward(model, _tokens(10), cache)
    with pytest.raises(CacheError, match="max_tokens=16"):
        forward(model, _tokens(10), cache)
    assert cache.n_past == 10


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3"])
def test_attention_probe_sees_causal_probabilities(name):
    model = tiny_model(name)
    tokens = _tokens(12)
    seen = {}

    def probe(layer, probs):
        seen[layer] = np.array(probs)

    plain = forward(model, tokens, make_cache(model))
    probed = forward(model, tokens, make_cache(model), probe=probe)
    assert _max_diff(plain, probed) <= 1e-5
    assert sorted(seen) == [0, 1]
    for probs in seen.values():
        assert probs.shape == (1, 4, 12, 12)
        assert np.allclose(probs.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(probs[0, 0], k=1) == 0)  # no attention to later positions


def test_forward_hidden_partial_depth():
    from nexus_mlx.models.forward import forward_hidden, lm_head

    model = tiny_model("qwen3")
    tokens = _tokens(9)
    full = forward_hidden(model, tokens, make_cache(model))
    assert _max_diff(lm_head(model, full), forward(model, tokens, make_cache(model))) <= 1e-6
    one = forward_hidden(model, tokens, make_cache(model), num_layers=1)
    assert one.shape == full.shape and _max_diff(one, full) > 1e-3
    with pytest.raises(PositionError, match="num_layers"):
        forward_hidden(model, tokens, make_cache(model), num_layers=3)
