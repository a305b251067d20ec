"""The native position softmax equals its MLX reference (mask by position + mx.softmax) on every
ISA this CPU runs, over random positions, windows, odd widths and grouped rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels import position_softmax as ps

NATIVE = ps.native_position_softmax()
needs_native = pytest.mark.skipif(NATIVE is None, reason=ps.native_status().reason)
ISAS = NATIVE.isas if NATIVE is not None else ()
TOL = 2e-6  # probabilities; the kernel's exp is within 1e-7 relative


def _case(rng, t: int, n: int, groups: int, *, sorted_keys: bool):
    """Scores (1, Hkv, G*T, N) and positions; each query sees at least its own key."""
    key_pos = rng.choice(np.arange(4 * n), n, replace=False)
    if sorted_keys:
        key_pos = np.sort(key_pos)
    query_pos = rng.choice(key_pos, t, replace=False)
    scores = rng.normal(0.0, 4.0, size=(1, groups, 3 * t, n)).astype(np.float32)
    return scores, query_pos, key_pos


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t, n", [(1, 1), (2, 7), (5, 16), (7, 33), (16, 257), (3, 1030)])
@pytest.mark.parametrize("window", [None, 1, 5, 64])
def test_native_equals_reference(isa, t, n, window):
    rng = np.random.default_rng(t * 1000 + n)
    scores, qp, kp = _case(rng, t, n, 2, sorted_keys=bool(n % 2))
    ref = np.array(ps.position_softmax_reference(mx.array(scores), qp, kp, window))
    buf = scores.copy()
    NATIVE.softmax_(buf, qp, kp, window, isa=isa)
    assert np.allclose(buf, ref, atol=TOL, rtol=0, equal_nan=True)
    assert np.array_equal(np.isnan(buf), np.isnan(ref))
    seen = np.broadcast_to(np.tile(ps.visibility(qp, kp, window), (3, 1)), buf.shape)
    assert np.all(buf[~seen & ~np.isnan(buf)] == 0)  # hidden keys get exactly 0


@needs_native
def test_dispatcher_runs_in_place_and_matches():
    rng = np.random.default_rng(0)
    scores, qp, kp = _case(rng, 64, 2048, 3, sorted_keys=True)
    ref = ps.position_softmax_reference(mx.array(scores), qp, kp)
    s = mx.array(scores) * 1.0  # a fresh array the dispatcher may overwrite
    out = ps.position_softmax(s, qp, kp)
    assert ps.kernel_applies(mx.float32)
    # over 2,048 keys float32 sums round differently: the reference itself is ~1e-5 from the
    # float64 truth, the kernel closer
    assert float(mx.abs(out - ref).max()) <= 2e-5
    seen = np.broadcast_to(np.tile(ps.visibility(qp, kp), (3, 1)), scores.shape)
    x = np.where(seen, scores.astype(np.float64), -np.inf)
    x = np.exp(x - x.max(-1, keepdims=True))
    assert np.abs(np.array(out) - x / x.sum(-1, keepdims=True)).max() <= TOL
    rows = np.array(out).reshape(-1, 2048)
    assert np.allclose(rows.sum(-1), 1.0, atol=1e-5)


@needs_native
def test_strided_scores_are_copied_first():
    rng = np.random.default_rng(1)
    scores, qp, kp = _case(rng, 4, 40, 1, sorted_keys=False)
    wide = mx.array(np.concatenate([scores, scores], axis=-1))  # (1, 1, 12, 80)
    view = wide[..., :40]  # a strided view into a larger buffer
    ref = ps.position_softmax_reference(view, qp, kp)
    out = ps.position_softmax_kernel(view, qp, kp)
    assert float(mx.abs(out - ref).max()) <= TOL
    assert np.array_equal(np.array(wide[..., 40:]), scores)  # the big buffer is untouched


def test_non_float32_takes_the_reference():
    rng = np.random.default_rng(2)
    scores, qp, kp = _case(rng, 3, 10, 1, sorted_keys=True)
    half = mx.array(scores).astype(mx.float16)
    out = ps.position_softmax(half, qp, kp)
    assert out.dtype == mx.float16
    ref = ps.position_softmax_reference(half, qp, kp)
    assert float(mx.abs(out.astype(mx.float32) - ref.astype(mx.float32)).max()) == 0.0


def test_shape_errors_name_the_shapes():
    scores = mx.zeros((1, 2, 6, 8))
    with pytest.raises(ArgumentError, match="do not fit"):
        ps.position_softmax_reference(scores, np.arange(4), np.arange(8))
    with pytest.raises(ArgumentError, match="do not fit"):
        ps.position_softmax(scores, np.arange(3), np.arange(7))
    if NATIVE is not None:
        with pytest.raises(ArgumentError, match="writable C-contiguous float32"):
            NATIVE.softmax_(np.zeros((6, 8), np.float64), np.arange(3), np.arange(8))
        with pytest.raises(ArgumentError, match="window"):
            NATIVE.softmax_(np.zeros((6, 8), np.float32), np.arange(3), np.arange(8), window=0)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv(ps.ENV_VAR, "0")
    ps._NATIVE.cache_clear()
    try:
        assert ps.native_position_softmax() is None
        assert "disabled" in ps.native_status().reason
        assert not ps.kernel_applies(mx.float32)
    finally:
        monkeypatch.delenv(ps.ENV_VAR)
        ps._NATIVE.cache_clear()
