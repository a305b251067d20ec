"""The splice kernels as equivalence oracles.

- Each pure-MLX reference equals the plain definition (a swapaxes copy; ``reanchor`` of rows).
- Each Metal body, compiled with g++ against ``metal_shim.h`` and run on the CPU (an emulation
  of the kernel's logic, not Metal), equals the reference on a grid of shapes, dtypes and
  splice positions: exactly for the copy, within 1 ulp for the rotation. The CUDA twins get the
  same check through the emulation's CUDA shim; on an NVIDIA GPU (``-m gpu``) they run for real.
- Validation raises before anything is written; the CPU dispatcher uses the reference; the
  transposed-V splice declines where the policy says so.

``conftest.py`` imports ``nexus_mlx`` before any test module imports ``mlx``.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import metal_emulation as emu
import mlx.core as mx
import numpy as np
import pytest

import nexus_mlx.kernels.reanchor_write as rw
import nexus_mlx.kernels.splice_v_transposed as sv
from nexus_mlx.errors import CacheError
from nexus_mlx.kernels import (
    SpliceDeclined,
    active_backend,
    cuda_available,
    metal_available,
    row_contiguous_strides,
)
from nexus_mlx.kv.rope import RopeSpec, reanchor

needs_gxx = pytest.mark.skipif(not emu.compiler_available(), reason="g++ is not installed")

HS = (1, 2, 4)
SS = (1, 7, 33)
DS = (16, 64, 80)
SHAPES = list(itertools.product(HS, SS, DS))  # (H, S, D)
DTYPES = (mx.float32, mx.float16)
DTYPE_IDS = ("f32", "f16")
DELTAS = (37, -5, 4093)


def _rand(shape: tuple[int, ...], dtype: mx.Dtype, seed: int) -> mx.array:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    return mx.array(x).astype(dtype)


def _spans(s: int) -> list[tuple[int, int]]:
    """(capacity, at) pairs: the block at the start, in the middle, and at the very end."""
    c = s + 9
    return [(c, 0), (c, 4), (c, c - s)]


def _specs(d: int) -> list[RopeSpec]:
    """Half-split full rotary, interleaved full rotary, and half-split partial rotary."""
    return [
        RopeSpec(head_dim=d, dims=d, base=10000.0),
        RopeSpec(head_dim=d, dims=d, base=10000.0, traditional=True),
        RopeSpec(head_dim=d, dims=d // 2, base=500000.0),
    ]


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place between float arrays of one dtype."""
    assert a.dtype == b.dtype and a.shape == b.shape
    itype = {np.dtype(np.float32): np.int32, np.dtype(np.float16): np.int16}[a.dtype]
    ia = a.view(itype).astype(np.int64)
    ib = b.view(itype).astype(np.int64)
    lo = np.iinfo(itype).min
    ia = np.where(ia < 0, lo - ia, ia)  # sign-magnitude -> monotone integers
    ib = np.where(ib < 0, lo - ib, ib)
    return np.abs(ia - ib)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Largest elementwise ulp distance."""
    return int(ulps(a, b).max()) if a.size else 0


def rotation_close(got: np.ndarray, want: np.ndarray, scale: float) -> bool:
    """Within 1 ulp, or within 2 float32 ulps of the largest operand: what a GPU compiler that
    fuses ``a * c - b * s`` into an fma may produce when the two products nearly cancel."""
    near = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return bool(np.all((ulps(got, want) <= 1) | (near <= 2 * np.finfo(np.float32).eps * scale)))


@pytest.fixture(scope="module")
def v_kernels() -> dict[str, emu.EmulatedKernel]:
    return {
        "metal": emu.emulate_metal_file(
            "splice_v_transposed", sv.KERNEL_NAME, sv.INPUT_NAMES, sv.OUTPUT_NAMES
        ),
        "cuda": emu.emulated_cuda_kernel(
            sv.KERNEL_NAME, sv.INPUT_NAMES, sv.OUTPUT_NAMES, sv.CUDA_SOURCE
        ),
    }


@pytest.fixture(scope="module")
def k_kernels() -> dict[str, emu.EmulatedKernel]:
    return {
        "metal": emu.emulate_metal_file(
            "reanchor_write", rw.KERNEL_NAME, rw.INPUT_NAMES, rw.OUTPUT_NAMES
        ),
        "cuda": emu.emulated_cuda_kernel(
            rw.KERNEL_NAME, rw.INPUT_NAMES, rw.OUTPUT_NAMES, rw.CUDA_SOURCE
        ),
    }


def _as_mlx_kernel(kernel: emu.EmulatedKernel) -> Any:
    """Adapt an emulated kernel to the MLX kernel interface (mx.array outputs)."""

    def call(**kwargs: Any) -> list[mx.array]:
        return [mx.array(o) for o in kernel(**kwargs)]

    return call


# ---- transposed-V splice: reference ---------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("h,s,d", [(1, 1, 16), (2, 7, 64), (4, 33, 80)])
def test_v_reference_is_the_plain_definition(h: int, s: int, d: int, dtype: mx.Dtype) -> None:
    block = _rand((h, s, d), dtype, 1)
    for c, at in _spans(s):
        cache = _rand((h, d, c), dtype, 2)
        got = np.array(sv.splice_v_transposed_reference(cache, block, at))
        want = np.array(cache).copy()
        want[:, :, at : at + s] = np.array(block).swapaxes(-1, -2)
        np.testing.assert_array_equal(got, want)


def test_v_reference_matches_the_docstring_loop() -> None:
    h, s, d, c, at = 2, 3, 4, 6, 2
    block = _rand((1, h, s, d), mx.float32, 3)
    cache = _rand((1, h, d, c), mx.float32, 4)
    want = np.array(cache).copy()
    b = np.array(block)
    for hh, dd, ss in itertools.product(range(h), range(d), range(s)):
        want[0, hh, dd, at + ss] = b[0, hh, ss, dd]
    np.testing.assert_array_equal(np.array(sv.splice_v_transposed_reference(cache, block, at)), want)


# ---- transposed-V splice: emulated kernels --------------------------------------------------
@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("h,s,d", SHAPES)
def test_v_metal_emulation_equals_reference(
    v_kernels: dict[str, emu.EmulatedKernel], h: int, s: int, d: int, dtype: mx.Dtype
) -> None:
    block = _rand((h, s, d), dtype, h * 100 + s * 10 + d)
    out = v_kernels["metal"](**sv.kernel_launch(block, dtype))[0]
    np.testing.assert_array_equal(out, np.array(sv.transposed_block_reference(block, dtype)))
    for c, at in _spans(s):
        cache = _rand((h, d, c), dtype, c + at)
        spliced = sv._place(cache, mx.array(out), at)
        np.testing.assert_array_equal(
            np.array(spliced), np.array(sv.splice_v_transposed_reference(cache, block, at))
        )


@needs_gxx
@pytest.mark.parametrize("h,s,d", SHAPES)
def test_v_cuda_twin_emulation_equals_reference(
    v_kernels: dict[str, emu.EmulatedKernel], h: int, s: int, d: int
) -> None:
    dtype = DTYPES[(h + s + d) % 2]
    block = _rand((h, s, d), dtype, 7)
    out = v_kernels["cuda"](**sv.kernel_launch(block, dtype))[0]
    np.testing.assert_array_equal(out, np.array(sv.transposed_block_reference(block, dtype)))


@needs_gxx
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_v_emulation_converts_a_float16_block_into_a_float32_cache(
    v_kernels: dict[str, emu.EmulatedKernel], dialect: str
) -> None:
    block = _rand((2, 33, 80), mx.float16, 8)  # .atb blocks are F16; CPU caches are float32
    out = v_kernels[dialect](**sv.kernel_launch(block, mx.float32))[0]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array(sv.transposed_block_reference(block, mx.float32)))


# ---- fused re-anchor and write: reference ---------------------------------------------------
@pytest.mark.parametrize("delta", (0, *DELTAS))
@pytest.mark.parametrize("h,s,d", [(1, 1, 16), (2, 7, 64), (4, 33, 80)])
def test_k_reference_is_reanchor_of_rows(h: int, s: int, d: int, delta: int) -> None:
    for spec in _specs(d):
        block = _rand((h, s, d), mx.float32, 11)
        for c, at in _spans(s):
            cache = _rand((h, c, d), mx.float32, 12)
            got = np.array(rw.reanchor_write_reference(cache, block, at, delta, spec))
            want = np.array(cache).copy()
            want[:, at : at + s, :] = np.array(reanchor(block, delta, spec))
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("delta", DELTAS)
def test_k_reference_rounds_float16_once(delta: int) -> None:
    for spec in _specs(64):
        block = _rand((2, 7, 64), mx.float16, 13)
        cache = _rand((2, 20, 64), mx.float16, 14)
        got = np.array(rw.reanchor_write_reference(cache, block, 5, delta, spec))[:, 5:12]
        once = np.array(reanchor(block.astype(mx.float32), delta, spec).astype(mx.float16))
        np.testing.assert_array_equal(got, once)
        stepwise = np.array(reanchor(block, delta, spec))  # float16 after every operation
        np.testing.assert_allclose(got.astype(np.float32), stepwise.astype(np.float32),
                                   rtol=0, atol=0.05)


def test_k_reference_matches_the_docstring_loop() -> None:
    spec = RopeSpec(head_dim=6, dims=4, base=100.0, traditional=True)
    block = _rand((2, 3, 6), mx.float32, 15)
    cos, sin = (np.array(t) for t in rw.reanchor_tables(9, spec))
    x = np.array(block)
    want = np.empty_like(x)
    for h, s, d in itertools.product(range(2), range(3), range(6)):
        if d >= spec.dims:
            want[h, s, d] = x[h, s, d]
            continue
        i, ia, ib, first = d // 2, 2 * (d // 2), 2 * (d // 2) + 1, d % 2 == 0
        a, b, c, sn = x[h, s, ia], x[h, s, ib], cos[i], sin[i]
        want[h, s, d] = (a * c - b * sn) if first else (b * c + a * sn)
    cache = mx.zeros((2, 3, 6))
    np.testing.assert_array_equal(np.array(rw.reanchor_write_reference(cache, block, 0, 9, spec)),
                                  want)


# ---- fused re-anchor and write: emulated kernels --------------------------------------------
@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("h,s,d", SHAPES)
def test_k_metal_emulation_within_one_ulp_of_reference(
    k_kernels: dict[str, emu.EmulatedKernel], h: int, s: int, d: int, dtype: mx.Dtype
) -> None:
    block = _rand((h, s, d), dtype, h * 100 + s * 10 + d)
    for i, spec in enumerate(_specs(d)):
        delta = DELTAS[(i + s) % len(DELTAS)]
        cos, sin = rw.reanchor_tables(delta, spec)
        out = k_kernels["metal"](**rw.kernel_launch(block, cos, sin, spec, dtype))[0]
        want = np.array(rw.reanchored_rows_reference(block, cos, sin, spec, dtype))
        assert ulp_distance(out, want) <= 1, (spec, delta)
    c, at = _spans(s)[(h + d) % 3]
    cache = _rand((h, c, d), dtype, 21)
    spliced = rw._place(cache, mx.array(out), at)
    want_cache = rw.reanchor_write_reference(cache, block, at, delta, spec)
    assert ulp_distance(np.array(spliced), np.array(want_cache)) <= 1


@needs_gxx
@pytest.mark.parametrize("h,s,d", SHAPES)
def test_k_cuda_twin_emulation_within_one_ulp_of_reference(
    k_kernels: dict[str, emu.EmulatedKernel], h: int, s: int, d: int
) -> None:
    dtype = DTYPES[(h + s + d) % 2]
    block = _rand((h, s, d), dtype, 23)
    for spec in _specs(d):
        cos, sin = rw.reanchor_tables(DELTAS[s % 3], spec)
        out = k_kernels["cuda"](**rw.kernel_launch(block, cos, sin, spec, dtype))[0]
        want = np.array(rw.reanchored_rows_reference(block, cos, sin, spec, dtype))
        assert ulp_distance(out, want) <= 1, spec


@needs_gxx
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_k_emulation_rotates_a_float16_block_into_a_float32_cache(
    k_kernels: dict[str, emu.EmulatedKernel], dialect: str
) -> None:
    spec = RopeSpec.from_config(64, 10000.0, False, {"rope_type": "llama3", "factor": 8.0,
                                                     "original_max_position_embeddings": 256})
    block = _rand((2, 33, 64), mx.float16, 24)
    cos, sin = rw.reanchor_tables(-300, spec)
    out = k_kernels[dialect](**rw.kernel_launch(block, cos, sin, spec, mx.float32))[0]
    want = np.array(rw.reanchored_rows_reference(block, cos, sin, spec, mx.float32))
    assert out.dtype == np.float32 and ulp_distance(out, want) <= 1


@needs_gxx
def test_k_emulation_with_constexpr_template_matches_runtime_template(
    k_kernels: dict[str, emu.EmulatedKernel],
) -> None:
    spec = _specs(80)[2]
    block = _rand((2, 7, 80), mx.float32, 25)
    cos, sin = rw.reanchor_tables(37, spec)
    launch = rw.kernel_launch(block, cos, sin, spec, mx.float32)
    baked = k_kernels["metal"](**launch, bake_template=True)[0]
    np.testing.assert_array_equal(baked, k_kernels["metal"](**launch)[0])


@needs_gxx
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_emulated_kernels_stay_in_bounds_on_padded_grids(
    v_kernels: dict[str, emu.EmulatedKernel], k_kernels: dict[str, emu.EmulatedKernel],
    dialect: str,
) -> None:
    """Under AddressSanitizer, with every grid axis padded past the data, the guards hold."""
    if not emu.sanitizers_available():
        pytest.skip("AddressSanitizer/UBSan do not link here")
    for h, s, d in [(1, 1, 16), (4, 33, 80)]:
        block = _rand((h, s, d), mx.float32, 26)
        launch = sv.kernel_launch(block, mx.float32)
        launch["grid"] = tuple(g + 5 for g in launch["grid"])
        out = v_kernels[dialect](**launch, sanitize=True)[0]
        np.testing.assert_array_equal(out, np.array(block).swapaxes(-1, -2))
        spec = _specs(d)[2]
        cos, sin = rw.reanchor_tables(37, spec)
        launch = rw.kernel_launch(block, cos, sin, spec, mx.float32)
        launch["grid"] = tuple(g + 5 for g in launch["grid"])
        out = k_kernels[dialect](**launch, sanitize=True)[0]
        want = np.array(rw.reanchored_rows_reference(block, cos, sin, spec, mx.float32))
        assert ulp_distance(out, want) <= 1


# ---- dispatchers ------------------------------------------------------------------------------
def test_cpu_dispatchers_use_the_reference() -> None:
    if active_backend() != "cpu":
        pytest.skip("the default device is a GPU")
    assert sv._active_kernel() is None and rw._active_kernel() is None
    if not metal_available():
        assert sv.metal_kernel() is None and rw.metal_kernel() is None
    if not cuda_available():
        assert sv.cuda_kernel() is None and rw.cuda_kernel() is None
    spec = _specs(64)[1]
    block = _rand((2, 7, 64), mx.float32, 31)
    cache_v = _rand((1, 2, 64, 16), mx.float32, 32)
    got_v = sv.splice_v_transposed(cache_v, block[None], 9)
    assert isinstance(got_v, mx.array)
    np.testing.assert_array_equal(
        np.array(got_v), np.array(sv.splice_v_transposed_reference(cache_v, block[None], 9))
    )
    cache_k = _rand((1, 2, 16, 64), mx.float32, 33)
    np.testing.assert_array_equal(
        np.array(rw.reanchor_write(cache_k, block[None], 9, 37, spec)),
        np.array(rw.reanchor_write_reference(cache_k, block[None], 9, 37, spec)),
    )


@needs_gxx
def test_dispatchers_through_the_emulated_metal_kernels(
    v_kernels: dict[str, emu.EmulatedKernel], k_kernels: dict[str, emu.EmulatedKernel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatchers' kernel path (launch arguments, then placement), with the emulation
    standing in for Metal."""
    monkeypatch.setattr(sv, "_active_kernel", lambda: _as_mlx_kernel(v_kernels["metal"]))
    monkeypatch.setattr(rw, "_active_kernel", lambda: _as_mlx_kernel(k_kernels["metal"]))
    spec = _specs(80)[0]
    block = _rand((1, 4, 33, 80), mx.float16, 34)
    cache_v = _rand((1, 4, 80, 40), mx.float32, 35)
    got_v = sv.splice_v_transposed(cache_v, block, 7)
    assert isinstance(got_v, mx.array)
    np.testing.assert_array_equal(
        np.array(got_v), np.array(sv.splice_v_transposed_reference(cache_v, block, 7))
    )
    cache_k = _rand((1, 4, 40, 80), mx.float32, 36)
    got_k = rw.reanchor_write(cache_k, block, 7, 1000, spec)
    want_k = rw.reanchor_write_reference(cache_k, block, 7, 1000, spec)
    assert ulp_distance(np.array(got_k), np.array(want_k)) <= 1


def test_transposed_splice_decline_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sv.decline_reason("metal", cuda_present=False, unified=True) is None
    assert sv.decline_reason("cpu", cuda_present=False, unified=True) is None
    assert sv.decline_reason("cuda", cuda_present=True, unified=False) is None
    reason = sv.decline_reason("cpu", cuda_present=True, unified=False)
    assert reason is not None and "prefill" in reason
    assert sv.decline_reason("cpu", cuda_present=True, unified=True) is None
    if active_backend() == "cpu" and not cuda_available():
        assert sv.can_splice_v_transposed()
    monkeypatch.setattr(sv, "decline_reason", lambda: reason)
    cache = _rand((2, 16, 20), mx.float32, 41)
    before = np.array(cache)
    out = sv.splice_v_transposed(cache, _rand((2, 3, 16), mx.float32, 42), 0)
    assert out == SpliceDeclined(reason)
    np.testing.assert_array_equal(np.array(cache), before)


# ---- validation -------------------------------------------------------------------------------
def test_v_validation_errors_name_the_values() -> None:
    cache = _rand((2, 16, 20), mx.float32, 51)
    block = _rand((2, 3, 16), mx.float32, 52)
    before = np.array(cache)
    cases: list[tuple[Any, Any, Any, type[Exception], str]] = [
        (cache, block[None], 0, CacheError, "both be 3-D"),
        (cache[None], block[None] * mx.ones((2, 1, 1, 1)), 0, CacheError, "batch"),
        (cache, _rand((3, 3, 16), mx.float32, 53), 0, CacheError, "H=3"),
        (_rand((2, 20, 16), mx.float32, 54), block, 0, CacheError, "D=20"),
        (cache.astype(mx.int32), block, 0, CacheError, "int32"),
        (cache, block, 18, CacheError, "[18, 21)"),
        (cache, block, -1, CacheError, "[-1, 2)"),
        (cache, block, 1.0, CacheError, "1.0"),
        (cache, block, True, CacheError, "True"),
    ]
    for c, b, at, exc, text in cases:
        for fn in (sv.splice_v_transposed, sv.splice_v_transposed_reference):
            with pytest.raises(exc, match=re.escape(text)):
                fn(c, b, at)
    assert issubclass(CacheError, CacheError)
    np.testing.assert_array_equal(np.array(cache), before)


def test_v_rejects_views_that_are_not_the_cache_storage() -> None:
    block = _rand((2, 3, 16), mx.float32, 55)
    row_major = _rand((2, 20, 16), mx.float32, 56)  # (H, C, D) storage
    view = row_major.swapaxes(-1, -2)  # looks like (H, D, C) but is token-strided by D
    with pytest.raises(CacheError, match=r"strides \(320, 1, 16\)"):
        sv.splice_v_transposed(view, block, 0)
    broadcast = mx.broadcast_to(_rand((1, 16, 20), mx.float32, 57), (2, 16, 20))
    with pytest.raises(CacheError, match="broadcast"):
        sv.splice_v_transposed(broadcast, block, 0)
    # The values are still right when the caller opts out of the layout check.
    got = sv.splice_v_transposed(view, block, 0, check_layout=False)
    np.testing.assert_array_equal(
        np.array(got), np.array(sv.splice_v_transposed_reference(view, block, 0))
    )


def test_k_validation_errors_name_the_values() -> None:
    spec = _specs(16)[0]
    cache = _rand((2, 20, 16), mx.float32, 61)
    block = _rand((2, 3, 16), mx.float32, 62)
    cases: list[tuple[Any, Any, Any, Any, Any, type[Exception], str]] = [
        (cache, block[None], 0, 1, spec, CacheError, "both be 3-D"),
        (cache, _rand((2, 3, 8), mx.float32, 63), 0, 1, spec, CacheError, "D=8"),
        (cache, block, 0, 1, _specs(64)[0], CacheError, "head_dim=64"),
        (cache, block, 18, 1, spec, CacheError, "[18, 21)"),
        (cache, block, 0, 1.5, spec, CacheError, "delta"),
        (cache.astype(mx.uint8), block, 0, 1, spec, CacheError, "uint8"),
    ]
    for c, b, at, delta, sp, exc, text in cases:
        for fn in (rw.reanchor_write, rw.reanchor_write_reference):
            with pytest.raises(exc, match=re.escape(text)):
                fn(c, b, at, delta, sp)
    with pytest.raises(CacheError, match="strides"):
        rw.reanchor_write(_rand((2, 16, 20), mx.float32, 64).swapaxes(-1, -2), block, 0, 1, spec)


def test_empty_blocks_leave_the_cache_as_it_was() -> None:
    spec = _specs(16)[0]
    cache_v = _rand((2, 16, 8), mx.float32, 71)
    cache_k = _rand((2, 8, 16), mx.float32, 72)
    empty = mx.zeros((2, 0, 16))
    assert sv.splice_v_transposed(cache_v, empty, 8) is cache_v
    assert rw.reanchor_write(cache_k, empty, 8, 5, spec) is cache_k


def test_row_contiguous_strides() -> None:
    assert row_contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert row_contiguous_strides((2, 0, 4)) == (4, 4, 1)


# ---- real GPUs ----------------------------------------------------------------------------
def _gpu_check(kernel_name: str) -> None:
    with mx.stream(mx.gpu):
        for (h, s, d), dtype in itertools.product([(1, 1, 16), (2, 7, 64), (4, 33, 80)], DTYPES):
            block = _rand((1, h, s, d), dtype, 81)
            for c, at in _spans(s):
                cache_v = _rand((1, h, d, c), dtype, 82)
                got = sv.splice_v_transposed(cache_v, block, at, use_kernel=True)
                assert isinstance(got, mx.array), got
                want = sv.splice_v_transposed(cache_v, block, at, use_kernel=False)
                assert isinstance(want, mx.array)
                np.testing.assert_array_equal(np.array(got), np.array(want))
                cache_k = _rand((1, h, c, d), dtype, 83)
                for spec in _specs(d):
                    got_k = rw.reanchor_write(cache_k, block, at, 4093, spec, use_kernel=True)
                    want_k = rw.reanchor_write(cache_k, block, at, 4093, spec, use_kernel=False)
                    scale = float(np.abs(np.array(block, dtype=np.float32)).max())
                    assert rotation_close(np.array(got_k), np.array(want_k), scale), (
                        kernel_name, spec, ulp_distance(np.array(got_k), np.array(want_k))
                    )


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs MLX on an NVIDIA GPU (mlx[cuda])")
def test_cuda_twins_on_the_gpu() -> None:
    assert sv.cuda_kernel() is not None and rw.cuda_kernel() is not None
    _gpu_check("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not metal_available(), reason="needs Metal (Apple silicon)")
def test_metal_kernels_on_the_gpu() -> None:
    assert sv.metal_kernel() is not None and rw.metal_kernel() is not None
    _gpu_check("metal")
