"""Fused RoPE re-anchor and write of a compiled block's key rows into a live K cache.

Contract:
- ``block_k (H, S, D)`` (or ``(1, H, S, D)``) holds keys rotated at their anchor positions;
  ``cache_k (H, C, D)`` (or ``(1, H, C, D)``) is a live, row-contiguous K buffer.
  :func:`reanchor_write` returns ``cache_k`` with rows ``[at, at + S)`` equal to
  ``reanchor(block_k, delta, spec)`` (:func:`nexus_mlx.kv.rope.reanchor`) cast to the cache's
  dtype, and every other row unchanged. Nothing is mutated; the caller stores the result.
- Every row turns by the same angles: one table ``cos/sin(delta * inv_freq)`` of shape
  ``(dims // 2,)``, computed on the host in float64 and passed to the kernel as float32. The
  rotation runs in float32 whatever the block's dtype (rounded after each multiply and add),
  half-split pairs ``(x[i], x[i + dims/2])`` or interleaved pairs ``(x[2i], x[2i+1])`` as
  ``spec.traditional`` says; features ``[dims, D)`` (partial rotary) pass through unchanged.
  For float32 blocks this equals ``reanchor`` exactly; for float16 it equals
  ``reanchor(block_k.astype(float32))`` rounded once to float16 (``reanchor`` on a float16
  block rounds after every operation instead, up to a few float16 ulps away).
- Shapes, dtypes, ``spec.head_dim``, the span and (``check_layout=True``) the cache's strides
  are validated before anything is computed; caller errors raise
  :class:`~nexus_mlx.kernels.CacheError` or ``CacheError`` naming the values.

Design: the kernel emits the re-rotated rows ``(H, S, D)`` and one MLX ``slice_update`` places
them, because ``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel`` cannot write into an existing
buffer. Emitting the whole updated cache instead would read and write all ``H * C * D``
elements on every splice and hold two copies of the layer's K; placing the rows costs a second
pass over the block only, and MLX donates the cache buffer (writes in place) when the caller
holds no other reference to the old array at evaluation time. Unlike the transposed-V splice,
row writes are contiguous, so no back-end declines.

The Metal body lives in ``metal_kernels/reanchor_write.metal`` and is also compiled with g++
against ``metal_shim.h`` by the tests (:mod:`metal_emulation`), which checks
its logic on a CPU, not on Metal. The CUDA twin uses round-to-nearest intrinsics
(``__fmul_rn``...) so that the compiler cannot contract ``a * c - b * s`` into an fma. The Metal
body keeps each product in its own statement, which stops contraction within an expression but
not a fast-math mode's; a fused result differs from the reference by about an ulp of the
larger product (more than an ulp of the result when the two products nearly cancel). The CUDA
twin's logic goes through the same emulation with a small CUDA shim; the kernels run for real
only on an NVIDIA GPU or Apple silicon (``pytest -m gpu``).

It knows RoPE specs but nothing about positions of other rows, layers or ``NexusCache``.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import CacheError
from nexus_mlx.kernels import (
    active_backend,
    build_cuda_kernel,
    build_metal_kernel,
    check_float,
    check_row_contiguous,
    check_span,
    threadgroup_for,
)
from nexus_mlx.kv.rope import RopeSpec, rope_tables, rotate

KERNEL_NAME = "nexus_reanchor_write"
INPUT_NAMES = ("block_k", "cos_table", "sin_table")
OUTPUT_NAMES = ("out",)

CUDA_SOURCE = """
    // Same specification as the Metal body (metal_kernels/reanchor_write.metal); the _rn
    // intrinsics keep each multiply and add separately rounded (no fma contraction).
    const unsigned d = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned s = blockIdx.y * blockDim.y + threadIdx.y;
    const unsigned h = blockIdx.z * blockDim.z + threadIdx.z;
    const unsigned H = static_cast<unsigned>(block_k_shape[0]);
    const unsigned S = static_cast<unsigned>(block_k_shape[1]);
    const unsigned D = static_cast<unsigned>(block_k_shape[2]);
    if (d >= D || s >= S || h >= H) {
      return;
    }
    const size_t row = (static_cast<size_t>(h) * S + s) * D;
    if (d >= static_cast<unsigned>(DIMS)) {
      out[row + d] = static_cast<T>(static_cast<float>(block_k[row + d]));
      return;
    }
    const unsigned n_pairs = static_cast<unsigned>(DIMS) / 2;
    unsigned i_pair;
    unsigned ia;
    unsigned ib;
    bool first;
    if (TRADITIONAL) {
      i_pair = d / 2;
      ia = 2 * i_pair;
      ib = ia + 1;
      first = (d % 2) == 0;
    } else {
      first = d < n_pairs;
      i_pair = first ? d : d - n_pairs;
      ia = i_pair;
      ib = i_pair + n_pairs;
    }
    const float a = static_cast<float>(block_k[row + ia]);
    const float b = static_cast<float>(block_k[row + ib]);
    const float u = first ? a : b;  // multiplied by cos
    const float v = first ? b : a;  // multiplied by sin
    const float uc = __fmul_rn(u, cos_table[i_pair]);
    const float vs = __fmul_rn(v, sin_table[i_pair]);
    const float y = first ? __fsub_rn(uc, vs) : __fadd_rn(uc, vs);
    out[row + d] = static_cast<T>(y);
"""


# ---- reference ------------------------------------------------------------------------------
def reanchor_tables(delta: int, spec: RopeSpec) -> tuple[mx.array, mx.array]:
    """``cos, sin`` of ``delta * inv_freq``, float32 ``(dims // 2,)``, angles in float64."""
    cos, sin = rope_tables(np.array([delta], dtype=np.int64), spec, mx.float32)
    return cos.reshape(-1), sin.reshape(-1)


def reanchored_rows_reference(
    block_k: mx.array, cos: mx.array, sin: mx.array, spec: RopeSpec, dtype: mx.Dtype
) -> mx.array:
    """Rotate ``block_k (..., S, D)`` by one table ``(dims // 2,)`` in float32, cast to
    ``dtype``: what the kernels compute."""
    x = block_k.astype(mx.float32)
    return rotate(x, cos.reshape(1, -1), sin.reshape(1, -1), spec).astype(dtype)


def reanchor_write_reference(
    cache_k: mx.array, block_k: mx.array, at: int, delta: int, spec: RopeSpec
) -> mx.array:
    """Pure-MLX fused re-anchor and write (validated like the dispatcher, strides not
    checked)."""
    at, delta = _validate(cache_k, block_k, at, delta, spec)
    if block_k.shape[-2] == 0:
        return cache_k
    if delta == 0:
        return _place(cache_k, block_k.astype(cache_k.dtype), at)
    cos, sin = reanchor_tables(delta, spec)
    return _place(cache_k, reanchored_rows_reference(block_k, cos, sin, spec, cache_k.dtype), at)


def _place(cache_k: mx.array, rows: mx.array, at: int) -> mx.array:
    """Write ``rows (H, S, D)`` at rows ``[at, at + S)`` of ``cache_k``."""
    s = rows.shape[-2]
    assert 0 <= at and at + s <= cache_k.shape[-2], "span must be validated before placing"
    update = rows.reshape(*cache_k.shape[:-2], s, cache_k.shape[-1])  # (..., H, S, D)
    start = mx.array([at], dtype=mx.int32)
    return mx.slice_update(cache_k, update, start, axes=(cache_k.ndim - 2,))


# ---- kernels --------------------------------------------------------------------------------
@functools.cache
def metal_kernel() -> Any | None:
    """The Metal kernel (built on first use), or None where Metal is unavailable.

    Inputs ``block_k (H, S, D)`` (row-contiguous), ``cos_table`` and ``sin_table`` (float32,
    ``(DIMS // 2,)``); output ``out (H, S, D)``; template ``T`` (cache dtype), ``DIMS``,
    ``TRADITIONAL``; grid ``(D, S, H)``. Specification, the reference loop (float32
    arithmetic, each operation rounded)::

        half = DIMS // 2
        for h in range(H):
            for s in range(S):
                x = block_k[h, s, :].astype(float32)
                for d in range(D):
                    if d >= DIMS:
                        out[h, s, d] = T(x[d])
                        continue
                    if TRADITIONAL:
                        i, ia, ib, first = d // 2, 2 * (d // 2), 2 * (d // 2) + 1, d % 2 == 0
                    else:
                        first = d < half
                        i = d if first else d - half
                        ia, ib = i, i + half
                    a, b, c, sn = x[ia], x[ib], cos_table[i], sin_table[i]
                    out[h, s, d] = T(a * c - b * sn if first else b * c + a * sn)
    """
    return build_metal_kernel(KERNEL_NAME, INPUT_NAMES, OUTPUT_NAMES, "reanchor_write")


@functools.cache
def cuda_kernel() -> Any | None:
    """The CUDA twin of :func:`metal_kernel` (same inputs, grid and reference loop), or None
    unless MLX runs on CUDA. Checked only on an NVIDIA GPU (``pytest -m gpu``)."""
    return build_cuda_kernel(KERNEL_NAME, INPUT_NAMES, OUTPUT_NAMES, CUDA_SOURCE)


def kernel_launch(
    block_k: mx.array, cos: mx.array, sin: mx.array, spec: RopeSpec, dtype: mx.Dtype
) -> dict[str, Any]:
    """Keyword arguments of one kernel call (Metal, CUDA, or the CPU emulation)."""
    h, s, d = block_k.shape[-3:]
    grid = (d, s, h)
    return {
        "inputs": [block_k.reshape(h, s, d), cos.astype(mx.float32), sin.astype(mx.float32)],
        "template": [("T", dtype), ("DIMS", int(spec.dims)), ("TRADITIONAL", bool(spec.traditional))],
        "grid": grid,
        "threadgroup": threadgroup_for(grid),
        "output_shapes": [(h, s, d)],
        "output_dtypes": [dtype],
    }


def _active_kernel() -> Any | None:
    backend = active_backend()
    if backend == "metal":
        return metal_kernel()
    if backend == "cuda":
        return cuda_kernel()
    return None


def reanchored_rows(
    block_k: mx.array, delta: int, spec: RopeSpec, dtype: mx.Dtype, *, use_kernel: bool = True
) -> mx.array:
    """``block_k (..., H, S, D)`` moved by ``delta`` positions, in ``dtype``: by the back-end's
    kernel when there is one (and ``use_kernel``), else by the reference."""
    if delta == 0:
        return block_k.astype(dtype)
    cos, sin = reanchor_tables(delta, spec)
    kernel = _active_kernel() if use_kernel else None
    if kernel is None or block_k.shape[-2] == 0:
        return reanchored_rows_reference(block_k, cos, sin, spec, dtype)
    return kernel(**kernel_launch(block_k, cos, sin, spec, dtype))[0]


# ---- dispatcher -----------------------------------------------------------------------------
def reanchor_write(
    cache_k: mx.array,
    block_k: mx.array,
    at: int,
    delta: int,
    spec: RopeSpec,
    *,
    use_kernel: bool = True,
    check_layout: bool = True,
) -> mx.array:
    """Write ``block_k (H, S, D)`` re-anchored by ``delta`` into rows ``[at, at + S)`` of
    ``cache_k (H, C, D)``; return the updated cache (same shape and dtype as ``cache_k``).

    ``check_layout`` reads the cache's strides through the buffer protocol, which evaluates the
    cache if it is still lazy; executor code that knows the buffer is its own storage may pass
    False.
    """
    at, delta = _validate(cache_k, block_k, at, delta, spec)
    if check_layout:
        check_row_contiguous(cache_k, "K cache")
    if block_k.shape[-2] == 0:
        return cache_k
    rows = reanchored_rows(block_k, delta, spec, cache_k.dtype, use_kernel=use_kernel)
    return _place(cache_k, rows, at)


def _validate(
    cache_k: mx.array, block_k: mx.array, at: int, delta: int, spec: RopeSpec
) -> tuple[int, int]:
    shapes = f"cache_k {tuple(cache_k.shape)} and block_k {tuple(block_k.shape)}"
    if cache_k.ndim not in (3, 4) or block_k.ndim != cache_k.ndim:
        raise CacheError(
            f"{shapes} must both be 3-D, (H, C, D) and (H, S, D), or both 4-D with batch 1"
        )
    if cache_k.ndim == 4 and (cache_k.shape[0] != 1 or block_k.shape[0] != 1):
        raise CacheError(f"{shapes}: only batch size 1 is supported")
    h, c, d = cache_k.shape[-3:]
    hb, s, db = block_k.shape[-3:]
    if (hb, db) != (h, d):
        raise CacheError(
            f"{shapes}: the block has H={hb}, D={db} but the cache has H={h}, D={d}"
        )
    if d != spec.head_dim:
        raise CacheError(
            f"{shapes}: head width D={d} differs from the RoPE spec's head_dim={spec.head_dim}"
        )
    check_float(cache_k, "cache_k")
    check_float(block_k, "block_k")
    if isinstance(delta, bool) or not isinstance(delta, int | np.integer):
        raise CacheError(f"delta must be an integer, got {delta!r}")
    return check_span(at, s, c, "rows"), int(delta)
