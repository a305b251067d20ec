"""The native blocked position attention equals its MLX reference (grouped GEMM, position softmax,
value GEMM) on every ISA this CPU runs: random and unsorted positions, windows, block and panel
tails, head dims, strided cache views, rows that see no key, and the forward pass that uses it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels import position_attention as pa

NATIVE = pa.native_position_attention()
needs_native = pytest.mark.skipif(NATIVE is None, reason=pa.native_status().reason)
ISAS = NATIVE.isas if NATIVE is not None else ()
TOL = 2e-5  # float32 sums in another order over up to ~1,000 keys


def _case(rng, hkv: int, group: int, t: int, n: int, d: int, *, sorted_keys: bool,
          capacity: int | None = None):
    """q (Hkv, G*T, D), k/v views (Hkv, N, D) into (Hkv, capacity, D) storage, positions where
    each query sees at least its own key."""
    key_pos = rng.choice(np.arange(4 * n), n, replace=False)
    if sorted_keys:
        key_pos = np.sort(key_pos)
    query_pos = rng.choice(key_pos, t, replace=t > n)
    q = rng.normal(size=(hkv, group * t, d)).astype(np.float32)
    cap = capacity or n
    k = rng.normal(size=(hkv, cap, d)).astype(np.float32)[:, :n]
    v = rng.normal(size=(hkv, cap, d)).astype(np.float32)[:, :n]
    return q, k, v, query_pos, key_pos


def _reference(q, k, v, qp, kp, scale, window=None) -> np.ndarray:
    return np.array(pa.position_attention_reference(
        mx.array(q)[None], mx.array(np.ascontiguousarray(k))[None],
        mx.array(np.ascontiguousarray(v))[None], qp, kp, scale, window))[0]


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("hkv, group, t, n, d", [
    (1, 1, 2, 1, 16), (2, 3, 5, 63, 16), (3, 3, 7, 64, 64), (2, 7, 4, 65, 64),
    (1, 2, 9, 300, 128), (2, 1, 3, 130, 80), (1, 1, 6, 97, 256)])
@pytest.mark.parametrize("window", [None, 1, 5, 64])
def test_native_equals_reference(isa, hkv, group, t, n, d, window):
    rng = np.random.default_rng(hkv * 1000 + t * 100 + n + d)
    q, k, v, qp, kp = _case(rng, hkv, group, t, n, d, sorted_keys=bool(n % 2),
                            capacity=n + 11)
    scale = d ** -0.5
    ref = _reference(q, k, v, qp, kp, scale, window)
    out = NATIVE.attention(q, k, v, qp, kp, scale, window, isa=isa)
    assert out.shape == (hkv, group * t, d)
    assert np.allclose(out, ref, atol=TOL, rtol=0, equal_nan=True)
    assert np.array_equal(np.isnan(out), np.isnan(ref))


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_rows_that_see_no_key_are_nan_and_the_rest_unaffected(isa):
    """A query before every key (and one whose window holds nothing) gets NaN, as its softmax
    does; the other queries of the same panels are exact."""
    rng = np.random.default_rng(3)
    n, d = 150, 16
    kp = np.arange(100, 100 + n)
    qp = np.array([5, 120, 249, 3000])  # before all keys / sees some / sees all / window empty
    q = rng.normal(size=(2, 2 * 4, d)).astype(np.float32)
    k, v = (rng.normal(size=(2, n, d)).astype(np.float32) for _ in range(2))
    ref = _reference(q, k, v, qp, kp, 0.25, window=100)
    out = NATIVE.attention(q, k, v, qp, kp, 0.25, window=100, isa=isa)
    rows = np.arange(8) % 4
    assert np.all(np.isnan(out[:, (rows == 0) | (rows == 3)]))
    assert np.allclose(out, ref, atol=TOL, rtol=0, equal_nan=True)


@needs_native
def test_long_context_against_float64_truth():
    """8 queries over 2,100 keys (33 blocks, the last partial), sorted positions as after a
    prefill: within 2e-5 of a float64 computation, and the MLX reference no closer."""
    rng = np.random.default_rng(4)
    q, k, v, qp, kp = _case(rng, 2, 3, 8, 2100, 64, sorted_keys=True)
    scale = 0.125
    out = NATIVE.attention(q, k, v, qp, kp, scale)
    seen = (qp[:, None] - kp[None, :] >= 0)  # (T, N)
    s = np.einsum("hrd,hnd->hrn", q.astype(np.float64), k.astype(np.float64)) * scale
    s = np.where(np.tile(seen, (3, 1))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    truth = np.einsum("hrn,hnd->hrd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
    assert np.abs(out - truth).max() <= 2e-5
    ref = _reference(q, k, v, qp, kp, scale)
    assert np.abs(out - truth).max() <= np.abs(ref - truth).max() + 1e-5


@needs_native
def test_dispatcher_reads_strided_cache_views():
    """k/v as MLX views into a larger storage (what the forward pass passes): no copy needed,
    and the result equals the reference."""
    rng = np.random.default_rng(5)
    storage_k = mx.array(rng.normal(size=(1, 2, 300, 64)).astype(np.float32))
    storage_v = mx.array(rng.normal(size=(1, 2, 300, 64)).astype(np.float32))
    k, v = storage_k[:, :, :257, :], storage_v[:, :, :257, :]
    q = mx.array(rng.normal(size=(1, 2, 3 * 4, 64)).astype(np.float32))
    kp = np.arange(257)
    qp = np.array([10, 100, 200, 256])
    ref = pa.position_attention_reference(q, k, v, qp, kp, 0.125)
    out = pa.position_attention(q, k, v, qp, kp, 0.125)
    assert out.shape == (1, 2, 12, 64)
    assert float(mx.abs(out - ref).max()) <= TOL
    assert pa.kernel_applies(mx.float32, 64) == (NATIVE.best in pa.FAST_ISAS)


def test_non_float32_and_odd_head_dims_take_the_reference():
    rng = np.random.default_rng(6)
    q, k, v, qp, kp = _case(rng, 1, 2, 3, 20, 16, sorted_keys=True)
    half = [mx.array(x)[None].astype(mx.float16) for x in (q, k, v)]
    out = pa.position_attention(*half, qp, kp, 0.25)
    assert out.dtype == mx.float16
    ref = pa.position_attention_reference(*half, qp, kp, 0.25)
    assert float(mx.abs(out.astype(mx.float32) - ref.astype(mx.float32)).max()) == 0.0
    assert not pa.kernel_applies(mx.float32, 24)  # not a multiple of 16
    assert not pa.kernel_applies(mx.float16, 64)


@needs_native
def test_bad_arguments_name_the_problem():
    q = np.zeros((2, 6, 16), np.float32)
    k = np.zeros((2, 8, 16), np.float32)
    with pytest.raises(ArgumentError, match="do not fit"):
        NATIVE.attention(q, k, k, np.arange(4), np.arange(8), 1.0)
    with pytest.raises(ArgumentError, match=r"must both be \(2, N, 16\)"):
        NATIVE.attention(q, k, np.zeros((2, 8, 32), np.float32), np.arange(3), np.arange(8), 1.0)
    with pytest.raises(ArgumentError, match="float32"):
        NATIVE.attention(q.astype(np.float64), k, k, np.arange(3), np.arange(8), 1.0)
    with pytest.raises(ArgumentError, match="window"):
        NATIVE.attention(q, k, k, np.arange(3), np.arange(8), 1.0, window=0)
    if "avx512" in NATIVE.isas:
        odd = np.zeros((2, 6, 24), np.float32)
        with pytest.raises(ArgumentError, match="head_dim 24"):
            NATIVE.attention(odd, odd[:, :4], odd[:, :4], np.arange(3), np.arange(4), 1.0,
                             isa="avx512")
    with pytest.raises(ArgumentError, match="float32 \\(1, Hkv, rows, D\\)"):
        pa.position_attention_kernel(mx.zeros((2, 6, 16)), mx.zeros((1, 2, 8, 16)),
                                     mx.zeros((1, 2, 8, 16)), np.arange(3), np.arange(8), 1.0)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv(pa.ENV_VAR, "0")
    pa._NATIVE.cache_clear()
    try:
        assert pa.native_position_attention() is None
        assert "disabled" in pa.native_status().reason
        assert not pa.kernel_applies(mx.float32, 64)
    finally:
        monkeypatch.delenv(pa.ENV_VAR)
        pa._NATIVE.cache_clear()


def test_disabled_block_turns_dispatch_off_and_back_on():
    before = pa.kernel_applies(mx.float32, 64)
    with pa.disabled():
        assert not pa.kernel_applies(mx.float32, 64)
        with pa.disabled():
            assert not pa.kernel_applies(mx.float32, 64)
        assert not pa.kernel_applies(mx.float32, 64)
    assert pa.kernel_applies(mx.float32, 64) == before
