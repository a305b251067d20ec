"""The native SwiGLU activation equals its reference (nn.silu(gate) * up) on every ISA this CPU
runs: odd widths (SIMD tails), strided halves of one fused product, extreme and special values,
threaded splits; the dispatcher picks it only where it pays, and the MLP using it still equals
the module's own."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_models import VOCAB, tiny_model

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels import swiglu as sg
from nexus_mlx.models.forward import forward, make_cache

NATIVE = sg.native_swiglu()
needs_native = pytest.mark.skipif(NATIVE is None, reason=sg.native_status().reason)
ISAS = NATIVE.isas if NATIVE is not None else ()
RTOL, ATOL = 2e-6, 1e-6  # the kernel's exp is within 1e-7 relative


def truth(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up in float64."""
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * up.astype(np.float64)


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("rows", "f"), [(1, 1), (3, 7), (2, 15), (5, 16), (4, 17), (2, 33),
                                         (9, 1536), (64, 1536), (40, 4864)])
def test_native_equals_float64_truth_with_tails(isa: str, rows: int, f: int) -> None:
    rng = np.random.default_rng(rows * 10_000 + f)
    gate = rng.normal(0.0, 6.0, (rows, f)).astype(np.float32)
    up = rng.normal(0.0, 2.0, (rows, f)).astype(np.float32)
    out = NATIVE.swiglu(gate, up, isa=isa)
    assert out.shape == (rows, f) and out.dtype == np.float32
    assert np.allclose(out, truth(gate, up), rtol=RTOL, atol=ATOL)


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_extreme_and_special_values_follow_the_reference(isa: str) -> None:
    values = np.array([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 87.0, -87.0, 88.5, -88.5, 100.0,
                       -100.0, 1e30, -1e30, np.inf, -np.inf, np.nan], np.float32)
    gate = np.tile(values, (2, 3))  # widths past one vector: tails and full lanes
    up = np.full_like(gate, 1.5)
    out = NATIVE.swiglu(gate, up, isa=isa)
    ref = np.array(sg.swiglu_reference(mx.array(gate), mx.array(up)))
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    finite = ~np.isnan(ref)
    assert np.allclose(out[finite], ref[finite], rtol=RTOL, atol=ATOL)


@needs_native
def test_strided_halves_of_one_product_are_read_in_place() -> None:
    rng = np.random.default_rng(3)
    both = rng.normal(0.0, 3.0, (48, 2 * 96)).astype(np.float32)
    gate, up = both[:, :96], both[:, 96:]  # row stride 192, as mx.split of a fused matmul
    assert not gate.flags.c_contiguous
    out = NATIVE.swiglu(gate, up)
    assert np.allclose(out, truth(gate, up), rtol=RTOL, atol=ATOL)


@needs_native
def test_kernel_on_mlx_split_views_and_batch_axes() -> None:
    fused = mx.random.normal((1, 70, 2 * 130), key=mx.random.key(5)) * 4
    gate, up = mx.split(fused, [130], axis=-1)
    out = sg.swiglu_kernel(gate, up)
    assert out.shape == (1, 70, 130) and out.dtype == mx.float32
    assert np.allclose(np.array(out), truth(np.array(gate), np.array(up)), rtol=RTOL, atol=ATOL)


@needs_native
def test_dispatcher_uses_the_kernel_only_where_it_pays() -> None:
    f = sg.MIN_ELEMENTS // 4
    assert not sg.kernel_applies(mx.float32, 2, f)  # too small
    assert not sg.kernel_applies(mx.float32, 1, 8 * sg.MIN_ELEMENTS)  # one row: a decode step
    assert sg.kernel_applies(mx.float32, 4, f)
    assert not sg.kernel_applies(mx.float16, 4, f)
    with sg.disabled():
        assert not sg.kernel_applies(mx.float32, 4, f)
    assert sg.kernel_applies(mx.float32, 4, f)
    for shape in ((1, 2, f), (1, 1, 8 * sg.MIN_ELEMENTS), (1, 8, f)):
        gate = mx.random.normal(shape, key=mx.random.key(1)) * 5
        up = mx.random.normal(shape, key=mx.random.key(2))
        out = sg.swiglu(gate, up)
        assert np.allclose(np.array(out), np.array(nn.silu(gate) * up), rtol=RTOL, atol=ATOL)


@needs_native
def test_one_row_never_reaches_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step stays a lazy graph: no native call, so no sync point."""
    def refuse(gate: mx.array, up: mx.array) -> mx.array:
        raise AssertionError("the native kernel ran on one row")

    monkeypatch.setattr(sg, "swiglu_kernel", refuse)
    gate = mx.random.normal((1, 1, 8 * sg.MIN_ELEMENTS), key=mx.random.key(3))
    out = sg.swiglu(gate, gate)
    assert np.allclose(np.array(out), np.array(nn.silu(gate) * gate), rtol=RTOL, atol=ATOL)
    with pytest.raises(AssertionError, match="one row"):
        sg.swiglu(mx.concatenate([gate, gate], axis=1), mx.concatenate([gate, gate], axis=1))


def test_other_dtypes_take_the_mlx_path() -> None:
    gate = mx.random.normal((2, 64, 128), key=mx.random.key(0)).astype(mx.float16)
    up = mx.ones_like(gate)
    out = sg.swiglu(gate, up)
    assert out.dtype == mx.float16
    assert mx.allclose(out, sg.swiglu_reference(gate, up), atol=1e-3).item()


def test_mismatched_inputs_are_rejected_naming_them() -> None:
    with pytest.raises(ArgumentError, match=r"gate \(2, 3\) and up \(2, 4\)"):
        sg.swiglu(mx.zeros((2, 3)), mx.zeros((2, 4)))
    with pytest.raises(ArgumentError, match="dtype"):
        sg.swiglu(mx.zeros((2, 3)), mx.zeros((2, 3), mx.float16))
    if NATIVE is not None:
        with pytest.raises(ArgumentError, match="contiguous rows"):
            NATIVE.swiglu(np.zeros((4, 6), np.float32)[:, ::2], np.zeros((4, 3), np.float32))
        with pytest.raises(ArgumentError, match="float32"):
            NATIVE.swiglu(np.zeros((2, 3)), np.zeros((2, 3)))
        with pytest.raises(ArgumentError, match="ISA"):
            NATIVE.swiglu(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), isa="neon")


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sg.ENV_VAR, "0")
    sg._NATIVE.cache_clear()
    try:
        assert sg.native_swiglu() is None
        assert "disabled" in sg.native_status().reason
        assert not sg.kernel_applies(mx.float32, 64, 1 << 14)
        gate = mx.random.normal((1, 64, 256), key=mx.random.key(4))
        assert mx.allclose(sg.swiglu(gate, gate), sg.swiglu_reference(gate, gate),
                           rtol=1e-5, atol=1e-6).item()
    finally:
        monkeypatch.delenv(sg.ENV_VAR)
        sg._NATIVE.cache_clear()


@needs_native
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_prefill_with_the_kernel_equals_mlx_lm_and_the_mlx_path(name: str) -> None:
    model = tiny_model(name)
    tokens = np.random.default_rng(7).integers(0, VOCAB, size=96)  # 96 x 96 features: native
    assert sg.kernel_applies(mx.float32, tokens.size, model.args.intermediate_size)
    ours = np.array(forward(model, tokens, make_cache(model))[0])
    with sg.disabled():
        lazy = np.array(forward(model, tokens, make_cache(model))[0])
    reference = np.array(model(mx.array(tokens)[None])[0])
    np.testing.assert_allclose(ours, lazy, atol=1e-5)
    np.testing.assert_allclose(ours, reference, atol=1e-4)
