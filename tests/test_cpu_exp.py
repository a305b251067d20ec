"""The vectorized CPU exp, softmax and SiLU against their references, and the CPU cache limit."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from nexus_mlx._platform import cpu_cache as _cpu_cache
from nexus_mlx.kernels import cpu_exp


def test_fast_exp_matches_float64_over_its_range() -> None:
    x = np.linspace(-87.0, 88.0, 400_001, dtype=np.float32)
    got = np.array(cpu_exp.fast_exp(mx.array(x)), dtype=np.float64)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2e-7


def test_fast_exp_gives_exact_zeros_below_its_range_and_saturates_above() -> None:
    x = mx.array([-mx.inf, -1e30, -500.0, -87.5, 89.0, 1e30], mx.float32)
    got = np.array(cpu_exp.fast_exp(x))
    assert np.all(got[:4] == 0.0)
    assert np.all(np.isfinite(got[4:])) and np.all(got[4:] >= np.float32(np.exp(87.9)))


def test_fast_exp_rejects_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float32"):
        cpu_exp.fast_exp(mx.zeros((3,), mx.float16))


@pytest.mark.parametrize("shape", [(1, 7), (2, 3, 5, 129), (1, 3, 48, 2048)])
def test_softmax_kernel_matches_reference_with_masked_entries(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    scores = (rng.standard_normal(shape) * 12).astype(np.float32)
    hidden = rng.random(shape) < 0.4
    hidden[..., 0] = False  # every row keeps at least one key, as causal attention does
    scores[hidden] = -np.inf
    x = mx.array(scores)
    got, want = np.array(cpu_exp.softmax_kernel(x)), np.array(cpu_exp.softmax_reference(x))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-8)
    assert np.all(got[hidden] == 0.0)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def test_softmax_kernel_is_shift_invariant_for_large_logits() -> None:
    x = mx.array(np.array([[1e4, 1e4 - 1.0, 1e4 - 200.0]], np.float32))
    got = np.array(cpu_exp.softmax_kernel(x))
    e = np.exp(np.array([0.0, -1.0]))
    np.testing.assert_allclose(got[0, :2], e / e.sum(), rtol=1e-6)
    assert got[0, 2] == 0.0


def test_silu_kernel_matches_float64() -> None:
    x = np.concatenate([np.linspace(-120, 120, 20_001), [0.0, -0.0]]).astype(np.float32)
    got = np.array(cpu_exp.silu_kernel(mx.array(x)), dtype=np.float64)
    x64 = x.astype(np.float64)
    want = x64 / (1.0 + np.exp(-x64))
    inside = x >= -87.0
    rel = np.abs(got[inside] - want[inside]) / np.maximum(np.abs(want[inside]), 1e-300)
    assert np.max(rel) < 5e-7  # MLX's own nn.silu is within ~4e-6 here
    assert np.all(np.abs(got[~inside]) < 1e-35)


def test_dispatchers_use_the_kernel_only_for_float32_on_the_cpu() -> None:
    assert cpu_exp.kernel_applies(mx.float32) == (mx.default_device().type == mx.DeviceType.cpu)
    assert not cpu_exp.kernel_applies(mx.float16)
    x = mx.array(np.linspace(-4, 4, 9, dtype=np.float16)).reshape(1, 9)
    assert cpu_exp.softmax(x).dtype == mx.float16
    np.testing.assert_allclose(np.array(cpu_exp.softmax(x)), np.array(mx.softmax(x, axis=-1, precise=True)))
    y = mx.array(np.linspace(-4, 4, 9, dtype=np.float32))
    np.testing.assert_allclose(np.array(cpu_exp.silu(y, use_kernel=False)), np.array(nn.silu(y)))


@pytest.fixture
def restore_cache_limit():
    previous = mx.set_cache_limit(0)
    mx.set_cache_limit(previous)
    yield previous
    mx.set_cache_limit(previous)


def test_cpu_cache_limit_env(monkeypatch: pytest.MonkeyPatch, restore_cache_limit: int) -> None:
    if _cpu_cache._has_gpu():
        pytest.skip("the cache limit is only tuned on CPU-only builds")
    monkeypatch.setenv(_cpu_cache.ENV_VAR, "0")
    assert _cpu_cache.tune_cpu_buffer_cache() is None
    monkeypatch.setenv(_cpu_cache.ENV_VAR, str(64 << 20))
    assert _cpu_cache.tune_cpu_buffer_cache() == 64 << 20
    assert mx.set_cache_limit(restore_cache_limit) == 64 << 20
    monkeypatch.setenv(_cpu_cache.ENV_VAR, "lots")
    with pytest.raises(ValueError, match="byte count"):
        _cpu_cache.tune_cpu_buffer_cache()
    monkeypatch.delenv(_cpu_cache.ENV_VAR)
    mx.set_cache_limit(1 << 20)
    assert _cpu_cache.tune_cpu_buffer_cache() == _cpu_cache._default_limit()
