"""INT8 scan of the semantic lookaside buffer: quantization, int32 dot products, fused top-k.

Contract (every path computes exactly this; the tests hold them to it):

- ``quantize_rows(x (M, D) float32) -> (codes (M, D) int8, scales (M,) float32)``: symmetric
  per-vector quantization, ``scale = max|x| / 127`` in float32 and ``code = clip(rint(x /
  scale), -127, 127)`` (ties to even; -128 never occurs). An all-zero row gets scale 0 and zero
  codes. Non-finite values raise :class:`ArgumentError`.
- ``dot[i] = sum_j int32(codes[i, j]) * int32(query[j])``, exact in int32 (``|dot| <= 16129 D``).
- ``key[i] = float32(dot[i]) * scales[i]`` (one float32 rounding); top-k = the k largest keys,
  best first, **equal keys rank the lower row index first**; ``k > N`` returns N rows.
- ``search(query float32)``: quantize the query as above, top-k, ``score = key * query_scale``.

Three implementations of the scan (house-style rule 5, with a native CPU part added):

1. Reference (numpy): :func:`scores_reference`, :func:`topk_reference`, :func:`search_reference`.
2. Native CPU: ``csrc/int8_scan.c`` with SIMD paths chosen at run time, in
   :mod:`~nexus_mlx.kernels.int8_scan_native` (re-exported here: :func:`native_scan`,
   :func:`native_status`, :class:`BoundScan`, :func:`padded_width`, ...).
3. GPU: a Metal kernel (``metal_kernels/int8_scan.metal``) and a CUDA twin computing the int32
   scores, built lazily (None where the back-end is unavailable), behind the dispatcher
   :func:`int8_scores` whose fallback is the pure-MLX :func:`int8_scores_reference_mlx`.

:func:`int8_search` is the CPU dispatcher (native when available and ``use_kernel``, else the
numpy reference). This module knows nothing about tool names, embedders or files.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels import active_backend, build_cuda_kernel, build_metal_kernel
from nexus_mlx.kernels.int8_scan_native import (
    ALIGN,
    ISAS,
    MAX_DIM,
    BoundScan,
    NativeInt8Scan,
    NativeStatus,
    aligned_rows,
    check_float_query,
    check_k,
    compile_native,
    load_native,
    native_scan,
    native_status,
    padded_width,
    source_digest,
)

KERNEL_NAME = "nexus_int8_scan"
INPUT_NAMES = ("codes", "query")
OUTPUT_NAMES = ("scores",)

CUDA_SOURCE = """
    // Same specification as the Metal body (metal_kernels/int8_scan.metal).
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned N = static_cast<unsigned>(codes_shape[0]);
    const unsigned W = static_cast<unsigned>(codes_shape[1]);
    if (i >= N) {
      return;
    }
    const size_t row = static_cast<size_t>(i) * W;
    int acc = 0;
    for (unsigned j = 0; j < W; ++j) {
      acc += static_cast<int>(codes[row + j]) * static_cast<int>(query[j]);
    }
    scores[i] = acc;
"""


# ---- reference ------------------------------------------------------------------------------
def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row INT8 quantization of ``x (M, D)``: ``(codes (M, D) int8, scales (M,)
    float32)`` with ``x ~ codes * scales[:, None]``."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ArgumentError(f"expected a (M, D) array of vectors, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise ArgumentError(
            f"vector {int(bad[0])} holds a non-finite value at feature {int(bad[1])}"
        )
    if x.shape[0] == 0:
        return np.zeros(x.shape, np.int8), np.zeros((0,), np.float32)
    m = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)  # (M,)
    scales = (m / np.float32(127.0)).astype(np.float32)  # (M,)
    safe = np.where(scales > 0, scales, np.float32(1.0))  # all-zero rows divide by 1
    q = np.rint(x / safe[:, None])  # (M, D) float32, ties to even
    q[scales == 0] = 0
    return np.clip(q, -127, 127).astype(np.int8), scales


def scores_reference(codes: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``codes (N, W) int8 @ query (W,) int8`` accumulated in int32: ``(N,) int32`` (numpy casts
    in small buffers, so no int32 copy of the codes is made)."""
    return np.matmul(np.asarray(codes), np.asarray(query), dtype=np.int32)


def keys_from_scores(scores: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Ranking keys ``float32(dot) * scales`` (one float32 rounding each)."""
    return scores.astype(np.float32) * np.asarray(scales, dtype=np.float32)


def topk_reference(keys: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``min(k, N)`` largest ``keys``, best first, equal keys lower index first."""
    keys = np.asarray(keys)
    n = keys.shape[0]
    k = min(int(k), n)
    if k <= 0:
        return np.zeros((0,), np.int64)
    if k < n:
        # Every row tied with the k-th largest key is a candidate, so the tie rule decides.
        kth = np.partition(keys, n - k)[n - k]
        candidates = np.flatnonzero(keys >= kth)  # ascending indices
    else:
        candidates = np.arange(n)
    order = np.argsort(-keys[candidates], kind="stable")[:k]
    return candidates[order].astype(np.int64)


def search_reference(
    codes: np.ndarray, scales: np.ndarray, query: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """The fused scan in numpy: ``(indices (k',) int64, scores (k',) float32, query_scale)``."""
    codes = np.asarray(codes)
    q, qs = quantize_rows(np.asarray(query, dtype=np.float32).reshape(1, -1))
    width = codes.shape[1]
    qrow = np.zeros((width,), np.int8)
    qrow[: q.shape[1]] = q[0]
    keys = keys_from_scores(scores_reference(codes, qrow), scales)
    idx = topk_reference(keys, k)
    return idx, keys[idx] * qs[0], float(qs[0])


# ---- GPU kernels ----------------------------------------------------------------------------
def int8_scores_reference_mlx(codes: mx.array, query: mx.array) -> mx.array:
    """Pure-MLX int32 scores ``(N,)`` of ``codes (N, W) int8`` against ``query (W,) int8``."""
    return (codes.astype(mx.int32) * query.astype(mx.int32)[None, :]).sum(axis=1)  # (N,)


@functools.cache
def metal_kernel() -> Any | None:
    """The Metal scan kernel (built on first use), or None where Metal is unavailable.

    Inputs ``codes (N, W)`` int8 (row-contiguous) and ``query (W,)`` int8; output ``scores
    (N,)`` int32; grid ``(N, 1, 1)``. Specification, the reference loop::

        for i in range(N):
            acc = 0                      # int32
            for j in range(W):
                acc += int(codes[i, j]) * int(query[j])
            scores[i] = acc
    """
    return build_metal_kernel(KERNEL_NAME, INPUT_NAMES, OUTPUT_NAMES, "int8_scan")


@functools.cache
def cuda_kernel() -> Any | None:
    """The CUDA twin of :func:`metal_kernel` (same inputs, grid and reference loop), or None
    unless MLX runs on CUDA. Checked only on an NVIDIA GPU (``pytest -m gpu``)."""
    return build_cuda_kernel(KERNEL_NAME, INPUT_NAMES, OUTPUT_NAMES, CUDA_SOURCE)


def kernel_launch(codes: mx.array, query: mx.array) -> dict[str, Any]:
    """Keyword arguments of one kernel call (Metal, CUDA, or the CPU emulation)."""
    n = int(codes.shape[0])
    return {
        "inputs": [codes, query],
        "grid": (n, 1, 1),
        "threadgroup": (max(1, min(256, n)), 1, 1),
        "output_shapes": [(n,)],
        "output_dtypes": [mx.int32],
    }


def _active_kernel() -> Any | None:
    backend = active_backend()
    if backend == "metal":
        return metal_kernel()
    if backend == "cuda":
        return cuda_kernel()
    return None


def int8_scores(codes: mx.array, query: mx.array, *, use_kernel: bool = True) -> mx.array:
    """int32 scores ``(N,)`` of ``codes (N, W) int8`` against ``query (W,) int8``: by the
    back-end's kernel when there is one (and ``use_kernel``), else by the MLX reference."""
    if codes.ndim != 2 or codes.dtype != mx.int8:
        raise ArgumentError(f"codes must be (N, W) int8, got {codes.dtype} {tuple(codes.shape)}")
    if query.dtype != mx.int8 or tuple(query.shape) != (codes.shape[1],):
        raise ArgumentError(
            f"query must be ({codes.shape[1]},) int8, got {query.dtype} {tuple(query.shape)}"
        )
    kernel = _active_kernel() if use_kernel else None
    if kernel is None or codes.shape[0] == 0:
        return int8_scores_reference_mlx(codes, query)
    return kernel(**kernel_launch(codes, query))[0]


# ---- CPU dispatcher -------------------------------------------------------------------------
def int8_search(
    codes: np.ndarray,
    sums: np.ndarray,
    scales: np.ndarray,
    dim: int,
    query: np.ndarray,
    k: int,
    *,
    use_kernel: bool = True,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Top-k of the float32 ``query (dim,)`` over padded ``codes (N, W)``: ``(indices, scores,
    query_scale)``, by the native library when there is one (and ``use_kernel``), else numpy."""
    k = check_k(k)
    native = native_scan() if use_kernel else None
    if native is not None:
        return native.bind(codes, sums, scales, dim).search(query, k)
    q = check_float_query(query, int(dim))
    return search_reference(codes, scales, q, k)


__all__ = [
    "ALIGN",
    "ISAS",
    "MAX_DIM",
    "BoundScan",
    "NativeInt8Scan",
    "NativeStatus",
    "ArgumentError",
    "aligned_rows",
    "compile_native",
    "cuda_kernel",
    "int8_scores",
    "int8_scores_reference_mlx",
    "int8_search",
    "kernel_launch",
    "keys_from_scores",
    "load_native",
    "metal_kernel",
    "native_scan",
    "native_status",
    "padded_width",
    "quantize_rows",
    "scores_reference",
    "search_reference",
    "source_digest",
    "topk_reference",
]
