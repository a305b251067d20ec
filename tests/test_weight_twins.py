"""Weight twins: the encoder rebuilds every weight exactly or declines, the native encoder equals
the numpy specification, the shim's twin kernel equals the float32 product, and a model with
twins decodes what it decodes without them.

Shapes cover blocks of 32 and 16, row counts that are not multiples of four, 1-4 activation
rows (and 5, which the kernel leaves to sgemm), nonzero ``beta``, views of fused arrays, and
the table emptied when a model is collected.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from nexus_mlx._platform import blas
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels import weight_twins as wt
from nexus_mlx.models.twins import attach_twins, detach_twins, twin_report

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="shim is Linux-only")
reads_twins = pytest.mark.skipif(not (blas.BLAS_STATUS.loaded and blas.twin_routing()),
                                 reason="the BLAS shim does not read twins here")


def _grid(rng: np.random.Generator, n: int, k: int, kind: str) -> np.ndarray:
    """A float32 matrix as a quantized file's blocks dequantize: ``scale * integer + offset``."""
    if kind == "q4_1":  # 32-blocks, codes 0..15, fp16 scale and minimum
        d = rng.uniform(1e-3, 2e-2, (n, k // 32, 1)).astype(np.float16).astype(np.float32)
        m = rng.uniform(-0.2, 0.0, (n, k // 32, 1)).astype(np.float16).astype(np.float32)
        q = rng.integers(0, 16, (n, k // 32, 32)).astype(np.float32)
        return (q * d + m).astype(np.float32).reshape(n, k)
    if kind == "q8_0":  # 32-blocks, codes -127..127 around zero
        d = rng.uniform(1e-4, 2e-3, (n, k // 32, 1)).astype(np.float16).astype(np.float32)
        q = rng.integers(-127, 128, (n, k // 32, 32)).astype(np.float32)
        return (q * d).astype(np.float32).reshape(n, k)
    if kind == "q6_k":  # 16-weight sub-blocks, each its own scale: fp16 super-scale * int8
        d = (rng.uniform(1e-5, 1e-4, (n, k // 256 + 1, 1)).astype(np.float16).astype(np.float32)
             .repeat(16, axis=1)[:, : k // 16] * rng.integers(1, 64, (n, k // 16, 1)))
        q = rng.integers(-32, 32, (n, k // 16, 16)).astype(np.float32)
        return (q * d).astype(np.float32).reshape(n, k)
    raise ValueError(kind)


@pytest.mark.parametrize(("kind", "shape", "block"), [
    ("q4_1", (37, 96), 32), ("q8_0", (64, 128), 32), ("q6_k", (21, 112), 16),
])
def test_grid_matrices_are_rebuilt_exactly(kind: str, shape: tuple[int, int], block: int) -> None:
    w = _grid(np.random.default_rng(0), *shape, kind)
    twin = wt.encode_twin_reference(w)
    assert twin is not None and twin.block == block
    assert np.array_equal(wt.rebuild(twin), w)
    assert twin.nbytes < w.nbytes / 2


def test_a_sparse_block_is_rebuilt_from_the_gcd_of_its_gaps() -> None:
    d = np.float32(np.float16(0.0123))
    w = np.zeros((3, 32), np.float32)
    w[:, 0], w[:, 1] = -16 * d, 13 * d  # gaps 16d and 13d: neither divided by 1..12 gives d
    for twin in (wt.encode_twin_reference(w), wt.encode_twin(w)):
        assert twin is not None and np.array_equal(wt.rebuild(twin), w)
        assert twin.scale[0, 0] == d


def test_matrices_that_are_not_grids_are_declined() -> None:
    rng = np.random.default_rng(1)
    assert wt.encode_twin_reference(rng.standard_normal((8, 64)).astype(np.float32)) is None
    grid = _grid(rng, 8, 64, "q4_1")
    for bad in (np.nan, np.inf):
        broken = grid.copy()
        broken[3, 5] = bad
        assert wt.encode_twin_reference(broken) is None
        assert wt.encode_twin(broken) is None
    assert wt.encode_twin_reference(grid[:, :24].copy()) is None  # k not a multiple of 16
    one_value = np.full((4, 32), 0.25, np.float32)
    assert np.array_equal(wt.rebuild(wt.encode_twin_reference(one_value)), one_value)
    with pytest.raises(ArgumentError):
        wt.encode_twin_reference(grid.astype(np.float64))


@linux_only
@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "q6_k"])
def test_the_native_encoder_builds_the_reference_twin(kind: str) -> None:
    w = _grid(np.random.default_rng(2), 45, 224, kind)
    native = wt.encode_twin(w)  # the shim's encoder (the reference where there is none)
    reference = wt.encode_twin_reference(w)
    assert native is not None and reference is not None
    for field in ("codes", "scale", "offset"):
        assert np.array_equal(getattr(native, field), getattr(reference, field)), field
    assert native.block == reference.block
    assert wt.encode_twin(np.random.default_rng(3).standard_normal((9, 64)).astype(
        np.float32)) is None


def _counted(fn):  # type: ignore[no-untyped-def]
    before = blas.shim_call_counts()["sgemm_as_twin"]
    out = fn()
    mx.eval(out)
    return np.array(out), blas.shim_call_counts()["sgemm_as_twin"] - before


@linux_only
@reads_twins
@pytest.mark.parametrize("avx2_only", [False, True])
@pytest.mark.parametrize(("kind", "shape"), [("q4_1", (37, 96)), ("q6_k", (130, 112)),
                                              ("q8_0", (2051, 64))])
def test_products_read_the_twin_and_equal_the_float32_product(kind: str, shape: tuple[int, int],
                                                              avx2_only: bool) -> None:
    rng = np.random.default_rng(4)
    w = _grid(rng, *shape, kind)
    weight = mx.array(w)
    assert wt.register(weight, wt.encode_twin(w))
    assert blas.set_twin_avx2_only(avx2_only)
    try:
        for rows in (1, 2, 3, 4, 5):
            x = rng.standard_normal((rows, shape[1])).astype(np.float32)
            got, routed = _counted(lambda x=x: mx.array(x) @ weight.T)
            want = wt.twin_matmul_reference(x, wt.encode_twin_reference(w))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert routed == (1 if rows <= 4 else 0), rows
        c = rng.standard_normal((1, shape[0])).astype(np.float32)
        x = rng.standard_normal((1, shape[1])).astype(np.float32)
        got, routed = _counted(lambda: mx.addmm(mx.array(c), mx.array(x), weight.T, alpha=1.5,
                                                beta=-0.5))
        np.testing.assert_allclose(got, 1.5 * (x @ w.T) - 0.5 * c, rtol=1e-5, atol=1e-5)
        assert blas.set_twin_routing(False) is False
        _, off = _counted(lambda: mx.array(x) @ weight.T)
        assert off == 0
    finally:
        blas.set_twin_routing(True)
        blas.set_twin_avx2_only(False)
        assert wt.unregister(weight)
    _, gone = _counted(lambda: mx.array(x) @ weight.T)
    assert gone == 0 and not wt.unregister(weight)


@linux_only
@reads_twins
def test_row_views_share_the_twin_and_a_wrong_twin_is_refused() -> None:
    w = _grid(np.random.default_rng(5), 48, 64, "q4_1")
    whole = mx.array(w)
    mx.eval(whole)
    top, middle = whole[:16], whole[16:40]
    mx.eval(top, middle)
    with pytest.raises(ArgumentError):
        wt.register(whole, wt.encode_twin(_grid(np.random.default_rng(6), 48, 64, "q4_1")))
    good = wt.encode_twin(w)
    strided = wt.Twin(np.asfortranarray(good.codes), good.scale, good.offset, good.block)
    with pytest.raises(ArgumentError):
        wt.register(whole, strided, check=False)  # a layout the kernel cannot read
    assert wt.register(whole, wt.encode_twin(w))
    try:
        assert not wt.register_view(mx.array(w[:16]), whole)  # another buffer: not a view
        assert wt.register_view(middle, whole) and wt.register_view(top, whole)
        x = np.random.default_rng(7).standard_normal((1, 64)).astype(np.float32)
        got, routed = _counted(lambda: mx.array(x) @ middle.T)
        np.testing.assert_allclose(got, x @ w[16:40].T, rtol=1e-5, atol=1e-5)
        assert routed == 1
    finally:
        for array in (whole, top, middle):
            wt.unregister(array)


def _gridded(model: nn.Module) -> nn.Module:
    """``model`` with every weight matrix snapped to a 4-bit grid per 32-block (as a Q4_1 file
    dequantizes), so twins apply to it."""
    from mlx.utils import tree_flatten, tree_unflatten

    rng = np.random.default_rng(8)
    snapped = []
    for name, a in tree_flatten(model.parameters()):
        if a.ndim == 2 and a.shape[1] % 32 == 0:
            snapped.append((name, mx.array(_grid(rng, a.shape[0], a.shape[1], "q4_1"))))
    model.update(tree_unflatten(snapped))
    mx.eval(model.parameters())
    return model


@linux_only
@reads_twins
def test_a_model_with_twins_decodes_the_same_and_releases_them_when_collected() -> None:
    from tiny_models import random_model

    from nexus_mlx.models.forward import forward, make_cache

    def greedy(model: nn.Module) -> tuple[list[int], list[np.ndarray]]:
        cache = make_cache(model)
        ids, rows = [3, 14, 15, 92], []
        logits = forward(model, ids, cache)[0, -1]
        for _ in range(6):
            ids.append(int(mx.argmax(logits).item()))
            rows.append(np.array(logits))
            logits = forward(model, ids[-1:], cache)[0, -1]
        return ids, rows

    model = _gridded(random_model({"model_type": "llama", "hidden_size": 64,
                                   "num_hidden_layers": 2, "intermediate_size": 96,
                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                   "rms_norm_eps": 1e-5, "vocab_size": 128,
                                   "max_position_embeddings": 256,
                                   "tie_word_embeddings": True}))
    plain_ids, plain_rows = greedy(model)
    before = blas.twin_count()
    report = attach_twins(model)
    assert report.declined == () and report.encoded >= 5 and attach_twins(model) is report
    assert twin_report(model) is report and blas.twin_count() == before + report.matrices
    start = blas.shim_call_counts()["sgemm_as_twin"]
    twin_ids, twin_rows = greedy(model)
    assert blas.shim_call_counts()["sgemm_as_twin"] > start
    assert twin_ids == plain_ids
    np.testing.assert_allclose(np.stack(twin_rows), np.stack(plain_rows), rtol=1e-4, atol=1e-4)
    del model
    gc.collect()
    assert blas.twin_count() == before  # collected: unregistered


@linux_only
@reads_twins
def test_float_weights_get_no_twins_and_detach_frees_them(tiny) -> None:
    from tiny_models import random_model

    report = attach_twins(random_model({"model_type": "llama", "hidden_size": 64,
                                        "num_hidden_layers": 1, "intermediate_size": 96,
                                        "num_attention_heads": 4, "num_key_value_heads": 2,
                                        "rms_norm_eps": 1e-5, "vocab_size": 128,
                                        "max_position_embeddings": 64}))
    assert report.matrices == 0 and report.declined  # random floats are no grid
    model = _gridded(random_model({"model_type": "llama", "hidden_size": 64,
                                   "num_hidden_layers": 1, "intermediate_size": 96,
                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                   "rms_norm_eps": 1e-5, "vocab_size": 128,
                                   "max_position_embeddings": 64}))
    before = blas.twin_count()
    assert attach_twins(model).matrices > 0
    assert detach_twins(model) and blas.twin_count() == before and not detach_twins(model)


@linux_only
@reads_twins
def test_the_default_model_decodes_the_same_with_and_without_twins(default_model) -> None:
    from nexus_mlx.models.forward import forward, make_cache

    model, tokenizer = default_model
    report = twin_report(model)
    assert report is not None and report.declined == () and report.matrices > 0
    ids = tokenizer.encode("The capital of France is")

    def decode() -> tuple[list[int], np.ndarray]:
        cache, out, rows = make_cache(model), list(ids), []
        logits = forward(model, out, cache)[0, -1]
        for _ in range(5):
            out.append(int(mx.argmax(logits).item()))
            rows.append(np.array(logits))
            logits = forward(model, out[-1:], cache)[0, -1]
        return out, np.stack(rows)

    with_twins = decode()
    blas.set_twin_routing(False)
    try:
        without = decode()
    finally:
        blas.set_twin_routing(True)
    assert with_twins[0] == without[0]
    np.testing.assert_allclose(with_twins[1], without[1], rtol=1e-4, atol=1e-4)


@linux_only
def test_twins_can_be_off_from_the_start() -> None:
    from test_blas import run_child

    result = run_child("""
import json
import nexus_mlx
from nexus_mlx._platform import blas
from nexus_mlx.models.twins import attach_twins
from tiny_models import random_model
report = attach_twins(random_model({"model_type": "llama", "hidden_size": 64,
    "num_hidden_layers": 1, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 128,
    "max_position_embeddings": 64}))
print(json.dumps({"routing": blas.twin_routing(), "matrices": report.matrices,
                  "reason": report.reason, "status": blas.BLAS_STATUS.twin_routing}))
""", {"NEXUS_MLX_WEIGHT_TWINS": "0", "PYTHONPATH": str(Path(__file__).parent)})
    assert result["routing"] is False and result["status"] is False
    assert result["matrices"] == 0 and "NEXUS_MLX_WEIGHT_TWINS" in result["reason"]
