"""Equivalence oracles for the forward pass's fast paths: every attention path (fused SDPA with a
causal/none/boolean mask, the blocked native attention, the native position softmax, the
explicit reference) and the chunked, row-limited, pipelined forward give the explicit
reference's results within 1e-4 (fp32), on random positions and rows, GQA groupings, windows,
soft-caps, V layouts and a real model."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

from nexus_mlx.errors import ArgumentError, TokenError
from nexus_mlx.kernels import cpu_exp, position_attention, position_softmax
from nexus_mlx.kv.rope import RopeSpec
from nexus_mlx.models import attention
from nexus_mlx.models.arch import LayerPlan
from nexus_mlx.models.forward import decode_step, forward, make_cache
from nexus_mlx.models.stages import StageProfile

TOL = 1e-4
SPEC = RopeSpec(head_dim=16, dims=16, base=10000.0)


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _layer(window=None, softcap=None) -> LayerPlan:
    return LayerPlan(rope=SPEC, window=window, softcap=softcap, qk_norm=False, scale=0.25)


def _inputs(rng, heads, kv_heads, t, n, v_layout):
    q = mx.array(rng.normal(size=(1, heads, t, 16)).astype(np.float32))
    k = mx.array(rng.normal(size=(1, kv_heads, n, 16)).astype(np.float32))
    v_np = rng.normal(size=(1, kv_heads, n, 16)).astype(np.float32)
    v = mx.array(v_np.swapaxes(-1, -2).copy() if v_layout == "transposed" else v_np)
    key_pos = rng.choice(np.arange(3 * n), n, replace=False)  # rows in any position order
    query_pos = rng.choice(key_pos, t, replace=False)  # every query sees at least itself
    return q, k, v, attention.KeyView(query_pos, key_pos)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (9, 3), (8, 1)])
@pytest.mark.parametrize("t, n", [(1, 9), (5, 5), (17, 70)])
@pytest.mark.parametrize("window, softcap, v_layout",
                         [(None, None, "row"), (4, None, "row"), (None, 5.0, "transposed"),
                          (6, 5.0, "row")])
def test_attention_paths_equal_the_reference(heads, kv_heads, t, n, window, softcap, v_layout):
    rng = np.random.default_rng(heads * 100 + t * 10 + n)
    q, k, v, keys = _inputs(rng, heads, kv_heads, t, n, v_layout)
    layer = _layer(window, softcap)
    ref, ref_probs = attention.attend(q, k, v, keys, layer, v_layout, want_probs=True,
                                      use_kernel=False)
    out, probs = attention.attend(q, k, v, keys, layer, v_layout, want_probs=True)
    assert _diff(out, ref) <= TOL and _diff(probs, ref_probs) <= 1e-5
    assert out.shape == (1, heads, t, 16) and probs.shape == (1, heads, t, n)
    fast, _ = attention.attend(q, k, v, keys, layer, v_layout)
    assert _diff(fast, ref) <= TOL


def test_cpu_float32_takes_the_native_paths_and_decode_stays_lazy():
    if not position_softmax.kernel_applies(mx.float32):
        pytest.skip(position_softmax.native_status().reason)
    q = mx.zeros((1, 4, 3, 16))
    blocked = position_attention.kernel_applies(mx.float32, 16)
    assert attention.attention_path(q, _layer(), "row", False, True) == (
        "blocked" if blocked else "positional")
    # what the blocked kernel does not do: soft-caps, transposed V, probabilities
    assert attention.attention_path(q, _layer(softcap=5.0), "row", False, True) == "positional"
    assert attention.attention_path(q, _layer(), "transposed", False, True) == "positional"
    assert attention.attention_path(q, _layer(), "row", True, True) == "positional"
    assert attention.attention_path(q[:, :, :1], _layer(), "row", False, True) == "explicit"
    assert attention.attention_path(q, _layer(), "row", False, False) == "explicit"


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (9, 3)])
@pytest.mark.parametrize("window", [None, 3, 100])
@pytest.mark.parametrize("case", ["append", "append-one", "scattered"])
def test_fused_path_masks_equal_the_reference(monkeypatch, heads, kv_heads, window, case):
    """mx.fast.scaled_dot_product_attention with the mask KeyView chooses ("causal" for a
    plain append, None, or a boolean mask) equals the explicit path."""
    rng = np.random.default_rng(7)
    n, t = 40, {"append": 12, "append-one": 1, "scattered": 12}[case]
    q, k, v, keys = _inputs(rng, heads, kv_heads, t, n, "row")
    if case != "scattered":
        keys = attention.KeyView(np.arange(n - t, n), np.arange(n))
    layer = _layer(window)
    ref, _ = attention.attend(q, k, v, keys, layer, "row", use_kernel=False)
    monkeypatch.setattr(cpu_exp, "kernel_applies", lambda dtype: False)  # as on a GPU
    assert attention.attention_path(q, layer, "row", False, True) == "fused"
    out, _ = attention.attend(q, k, v, keys, layer, "row")
    assert _diff(out, ref) <= TOL
    kind = keys.fused_mask(window)
    if case == "scattered" or (window is not None and window < n):
        assert isinstance(kind, mx.array)
    else:
        assert kind == ("causal" if t > 1 else None)


def test_key_view_builds_each_mask_once():
    keys = attention.KeyView(np.array([5, 7]), np.arange(8))
    assert keys.mask(None) is keys.mask(None)
    assert keys.mask(None).shape == (2, 8)
    assert attention.KeyView(np.array([7]), np.arange(8)).mask(None) is None  # all visible


def _prefilled(model, n, seed=1):
    tokens = np.random.default_rng(seed).integers(0, VOCAB, size=n)
    cache = make_cache(model)
    forward(model, tokens, cache)
    return tokens, cache


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_packed_rows_fast_path_equals_the_explicit_reference(name):
    """Re-forwarding scattered rows in place: logits and every layer's K/V equal the explicit
    reference path's (use_kernel=False), chunked or not."""
    model = tiny_model(name)
    tokens, base = _prefilled(model, 40)
    rows = np.array([3, 4, 11, 12, 13, 20, 31, 38, 39])
    outs, caches = [], []
    for kwargs in ({"use_kernel": False, "chunk": None}, {}, {"chunk": 2}):
        cache = base.copy()
        outs.append(forward(model, tokens[rows], cache, positions=rows, rows=rows, **kwargs))
        caches.append(cache)
    for out, cache in zip(outs[1:], caches[1:], strict=True):
        assert _diff(out, outs[0]) <= TOL
        for i in range(cache.num_layers):
            assert _diff(cache.keys(i), caches[0].keys(i)) <= TOL
            assert _diff(cache.values(i), caches[0].values(i)) <= TOL


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3"])
def test_chunks_run_in_position_order_and_answer_in_input_order(name):
    """Tokens in shuffled order, cut into chunks of 5: logits come back in input order and
    equal one unchunked reference call; "last" is the last input token's."""
    model = tiny_model(name)
    t = 23
    tokens = np.random.default_rng(4).integers(0, VOCAB, size=t)
    perm = np.random.default_rng(5).permutation(t)
    ref = forward(model, tokens[perm], make_cache(model), positions=perm, chunk=None,
                  use_kernel=False)
    cache = make_cache(model)
    out = forward(model, tokens[perm], cache, positions=perm, chunk=5)
    assert _diff(out, ref) <= TOL
    assert np.array_equal(cache.positions, perm) and np.array_equal(cache.tokens, tokens[perm])
    last = forward(model, tokens[perm], make_cache(model), positions=perm, chunk=5, logits="last")
    assert last.shape == (1, 1, VOCAB) and _diff(last[0, 0], ref[0, -1]) <= TOL


def test_chunk_must_be_a_positive_integer():
    model = tiny_model("llama")
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ArgumentError, match="chunk"):
            forward(model, [1, 2], make_cache(model), chunk=bad)


def test_decode_step_equals_forward_of_one_token():
    model = tiny_model("qwen3")
    tokens, cache = _prefilled(model, 30)
    other = cache.copy()
    token = mx.array([17])
    got = decode_step(model, token, cache)
    want = forward(model, [17], other, logits="last")
    assert _diff(got, want) <= 1e-5
    assert cache.n_past == other.n_past == 31 and cache.tokens[-1] == -1  # id not read
    cache.record_tokens([30], [17])
    assert np.array_equal(cache.tokens, other.tokens)
    for bad in (mx.array([1, 2]), mx.array([1.0])):
        with pytest.raises(TokenError):
            decode_step(model, bad, cache)


def test_profile_times_every_stage_of_every_layer():
    model = tiny_model("llama")
    tokens, cache = _prefilled(model, 20)
    prof = StageProfile()
    plain = forward(model, tokens[5:9], cache.copy(), positions=np.arange(5, 9),
                    rows=np.arange(5, 9))
    out = forward(model, tokens[5:9], cache, positions=np.arange(5, 9), rows=np.arange(5, 9),
                  profile=prof)
    assert _diff(out, plain) <= 1e-6
    report = prof.as_dict()
    assert report["calls"] == 1 and len(report["layers_ms"]) == 2
    q = mx.zeros((1, 4, 4, 16))
    blocked = attention.attention_path(q, _layer(), "row", False, True) == "blocked"
    attention_stages = ("attention",) if blocked else ("scores", "softmax", "pv")
    for stage in ("embed", "qkv", "rope", "write", *attention_stages, "o_proj", "mlp", "head"):
        assert report["stages_ms"][stage] >= 0.0
    assert report["total_ms"] > 0


def test_real_model_packed_refresh_equals_the_explicit_path(default_model):
    """SmolLM2 on real text (the README): a 600-token prefill in chunks of 128 vs one explicit
    run, then a fragmented refresh of 48 rows, fast path vs the old explicit one. Logits within
    2e-4 (the explicit path itself is ~1e-4 from mlx-lm's forward here), K/V within 1e-4."""
    model, tokenizer = default_model
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    tokens = np.array(tokenizer.encode(text * 4)[:600])
    assert tokens.size == 600
    ref_cache = make_cache(model)
    ref = forward(model, tokens, ref_cache, chunk=None, use_kernel=False)
    cache = make_cache(model)
    out = forward(model, tokens, cache, chunk=128)
    assert _diff(out, ref) <= 2e-4
    for i in range(cache.num_layers):
        assert _diff(cache.keys(i), ref_cache.keys(i)) <= TOL
        assert _diff(cache.values(i), ref_cache.values(i)) <= TOL
    rows = np.sort(np.random.default_rng(1).choice(np.arange(300, 600), 48, replace=False))
    a, b = ref_cache.copy(), ref_cache.copy()
    la = forward(model, tokens[rows], a, positions=rows, rows=rows, use_kernel=False,
                 logits="last")
    lb = forward(model, tokens[rows], b, positions=rows, rows=rows, logits="last")
    assert _diff(la, lb) <= 2e-4
    for i in range(a.num_layers):
        assert _diff(a.keys(i), b.keys(i)) <= TOL and _diff(a.values(i), b.values(i)) <= TOL
