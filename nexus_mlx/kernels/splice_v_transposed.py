"""Transposed-V splice: write a compiled block's V rows into a token-innermost V cache.

Contract:
- ``cache_v (H, D, C)`` (or ``(1, H, D, C)``) is a live V buffer in the "transposed" layout
  (token index innermost, as llama.cpp keeps V for soft-capped models), stored
  row-contiguously. ``block_v (H, S, D)`` (or ``(1, H, S, D)``) holds a block's V rows,
  row-major, in any float dtype. :func:`splice_v_transposed` returns ``cache_v`` with
  ``out[..., h, d, at + s] = block_v[..., h, s, d]`` (cast to the cache's dtype) for ``s < S``
  and every other entry unchanged. Nothing is mutated; the caller stores the result.
- Everything is validated before anything is computed: ranks, head count and width, float
  dtypes, ``[at, at + S)`` inside ``[0, C)``, and (``check_layout=True``) the cache's strides.
  Caller errors raise :class:`~nexus_mlx.kernels.CacheError` or ``CacheError`` naming
  the offending values.
- Where the strided copy is unsafe or pathological, the dispatcher writes nothing and returns
  :class:`~nexus_mlx.kernels.SpliceDeclined` (an expected refusal is a value, house-style rule
  6); the caller then prefills the block's tokens instead. See :func:`decline_reason`.

Design: the kernel emits the transposed block, not the cache. ``mx.fast.metal_kernel`` and
``mx.fast.cuda_kernel`` always allocate fresh outputs (``init_value`` only fills them); a kernel
cannot write into the live cache buffer. Two honest designs follow:

(a) the kernel reads the whole cache and emits the whole updated buffer: one dispatch, but every
    splice reads and writes ``H * D * C`` elements, briefly holds two copies of the layer's V,
    and must be recompiled or re-shaped whenever the capacity grows;
(b) the kernel emits only the transposed block ``(H, D, S)`` and one MLX ``slice_update``
    places it at token columns ``[at, at + S)``: two passes over the block (the kernel's, then
    the slice update's), none over the cache, independent of ``C``. MLX performs the slice update in place (it donates the
    cache buffer) when nothing else references the old cache array at evaluation time, so the
    caller should replace its stored array with the result before evaluating.

We use (b). The price is a second, strided pass (the slice update writes ``H * D`` runs of
``S`` contiguous elements), which is the copy the paper calls the transposed-V splice.

The Metal body lives in ``metal_kernels/splice_v_transposed.metal`` and is also compiled with
g++ against ``metal_shim.h`` by the tests (:mod:`metal_emulation`), which
checks its logic on a CPU, not on Metal. The CUDA twin's logic goes through the same emulation
with a small CUDA shim; it runs for real only on an NVIDIA GPU (``pytest -m gpu``).

It knows nothing about positions, RoPE, layers or the ``NexusCache`` object.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from nexus_mlx.errors import CacheError
from nexus_mlx.kernels import (
    SpliceDeclined,
    active_backend,
    build_cuda_kernel,
    build_metal_kernel,
    check_float,
    check_row_contiguous,
    check_span,
    cuda_available,
    threadgroup_for,
    unified_memory,
)

KERNEL_NAME = "nexus_splice_v_transposed"
INPUT_NAMES = ("block_v",)
OUTPUT_NAMES = ("out",)

CUDA_SOURCE = """
    // Same specification as the Metal body (metal_kernels/splice_v_transposed.metal):
    // out[h, d, s] = T(block_v[h, s, d]); grid (S, D, H) rounded up to whole blocks.
    const unsigned s = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned d = blockIdx.y * blockDim.y + threadIdx.y;
    const unsigned h = blockIdx.z * blockDim.z + threadIdx.z;
    const unsigned H = static_cast<unsigned>(block_v_shape[0]);
    const unsigned S = static_cast<unsigned>(block_v_shape[1]);
    const unsigned D = static_cast<unsigned>(block_v_shape[2]);
    if (s >= S || d >= D || h >= H) {
      return;
    }
    const size_t src = (static_cast<size_t>(h) * S + s) * D + d;
    const size_t dst = (static_cast<size_t>(h) * D + d) * S + s;
    out[dst] = static_cast<T>(static_cast<float>(block_v[src]));
"""


# ---- reference ------------------------------------------------------------------------------
def transposed_block_reference(block_v: mx.array, dtype: mx.Dtype) -> mx.array:
    """``(..., H, S, D) -> (..., H, D, S)`` in ``dtype``: what the kernels compute."""
    return block_v.swapaxes(-1, -2).astype(dtype)


def splice_v_transposed_reference(cache_v: mx.array, block_v: mx.array, at: int) -> mx.array:
    """Pure-MLX splice: ``cache_v`` with token columns ``[at, at + S)`` set to ``block_v``'s
    rows (validated like the dispatcher, strides not checked)."""
    at = _validate(cache_v, block_v, at)
    if block_v.shape[-2] == 0:
        return cache_v
    return _place(cache_v, transposed_block_reference(block_v, cache_v.dtype), at)


def _place(cache_v: mx.array, block_t: mx.array, at: int) -> mx.array:
    """Write ``block_t (H, D, S)`` at token columns ``[at, at + S)`` of ``cache_v``."""
    n = block_t.shape[-1]
    assert 0 <= at and at + n <= cache_v.shape[-1], "span must be validated before placing"
    update = block_t.reshape(*cache_v.shape[:-1], n)  # (..., H, D, S)
    start = mx.array([at], dtype=mx.int32)
    return mx.slice_update(cache_v, update, start, axes=(cache_v.ndim - 1,))


# ---- kernels --------------------------------------------------------------------------------
@functools.cache
def metal_kernel() -> Any | None:
    """The Metal kernel (built on first use), or None where Metal is unavailable.

    Inputs ``block_v (H, S, D)`` (row-contiguous); output ``out (H, D, S)``; template ``T`` (the
    cache dtype); grid ``(S, D, H)``. Specification, the reference loop::

        for h in range(H):
            for d in range(D):
                for s in range(S):
                    out[h, d, s] = T(float(block_v[h, s, d]))
    """
    return build_metal_kernel(KERNEL_NAME, INPUT_NAMES, OUTPUT_NAMES, "splice_v_transposed")


@functools.cache
def cuda_kernel() -> Any | None:
    """The CUDA twin of :func:`metal_kernel` (same inputs, grid and reference loop), or None
    unless MLX runs on CUDA. Checked only on an NVIDIA GPU (``pytest -m gpu``)."""
    return build_cuda_kernel(KERNEL_NAME, INPUT_NAMES, OUTPUT_NAMES, CUDA_SOURCE)


def kernel_launch(block_v: mx.array, dtype: mx.Dtype) -> dict[str, Any]:
    """Keyword arguments of one kernel call (Metal, CUDA, or the CPU emulation)."""
    h, s, d = block_v.shape[-3:]
    grid = (s, d, h)
    return {
        "inputs": [block_v.reshape(h, s, d)],
        "template": [("T", dtype)],
        "grid": grid,
        "threadgroup": threadgroup_for(grid),
        "output_shapes": [(h, d, s)],
        "output_dtypes": [dtype],
    }


def _active_kernel() -> Any | None:
    backend = active_backend()
    if backend == "metal":
        return metal_kernel()
    if backend == "cuda":
        return cuda_kernel()
    return None


def transposed_block(block_v: mx.array, dtype: mx.Dtype, *, use_kernel: bool = True) -> mx.array:
    """``(..., H, S, D) -> (H, D, S)`` in ``dtype``, by the back-end's kernel when there is one
    (and ``use_kernel``), else by :func:`transposed_block_reference`."""
    kernel = _active_kernel() if use_kernel else None
    if kernel is None or block_v.shape[-2] == 0:
        return transposed_block_reference(block_v, dtype)
    return kernel(**kernel_launch(block_v, dtype))[0]


# ---- policy and dispatcher ------------------------------------------------------------------
def decline_reason(
    backend: str | None = None,
    *,
    cuda_present: bool | None = None,
    unified: bool | None = None,
) -> str | None:
    """Why a transposed-V splice is declined here, or None when it may run.

    Defaults describe the running process (:func:`~nexus_mlx.kernels.active_backend`,
    ``mx.cuda.is_available()``, :func:`~nexus_mlx.kernels.unified_memory`).

    - Metal (unified memory), a CPU-only build, and the CUDA GPU stream may run: the strided
      copy is one kernel over memory the device owns.
    - The CPU stream of a CUDA build without unified memory declines. MLX keeps arrays in CUDA
      managed memory; a CPU write with a token stride of ``C`` elements into a cache whose pages
      live on the GPU faults and migrates about one page per element written, then every page
      migrates back for the next attention kernel (the MLX form of llama.cpp's per-element
      host-to-device copies into a transposed V cache).
    """
    backend = active_backend() if backend is None else backend
    cuda_present = cuda_available() if cuda_present is None else cuda_present
    unified = unified_memory() if unified is None else unified
    if backend == "cpu" and cuda_present and not unified:
        return (
            "transposed-V splice on the CPU stream of a CUDA device without unified memory: "
            "token-strided CPU writes into GPU-resident managed memory migrate about one page "
            "per element; prefill the block instead (or splice on the GPU stream)"
        )
    return None


def can_splice_v_transposed() -> bool:
    """Capability query: a transposed-V splice would not be declined here."""
    return decline_reason() is None


def splice_v_transposed(
    cache_v: mx.array,
    block_v: mx.array,
    at: int,
    *,
    use_kernel: bool = True,
    check_layout: bool = True,
) -> mx.array | SpliceDeclined:
    """Splice ``block_v (H, S, D)`` into the transposed ``cache_v (H, D, C)`` at token ``at``.

    Returns the updated cache (same shape and dtype as ``cache_v``), or
    :class:`~nexus_mlx.kernels.SpliceDeclined` when this back-end should prefill instead (see
    :func:`decline_reason`). ``check_layout`` reads the cache's strides through the buffer
    protocol, which evaluates the cache if it is still lazy; executor code that knows the
    buffer is its own storage may pass False.
    """
    at = _validate(cache_v, block_v, at)
    if check_layout:
        check_row_contiguous(cache_v, "transposed V cache")
    reason = decline_reason()
    if reason is not None:
        return SpliceDeclined(reason)
    if block_v.shape[-2] == 0:
        return cache_v
    return _place(cache_v, transposed_block(block_v, cache_v.dtype, use_kernel=use_kernel), at)


def _validate(cache_v: mx.array, block_v: mx.array, at: int) -> int:
    shapes = f"cache_v {tuple(cache_v.shape)} and block_v {tuple(block_v.shape)}"
    if cache_v.ndim not in (3, 4) or block_v.ndim != cache_v.ndim:
        raise CacheError(
            f"{shapes} must both be 3-D, (H, D, C) and (H, S, D), or both 4-D with batch 1"
        )
    if cache_v.ndim == 4 and (cache_v.shape[0] != 1 or block_v.shape[0] != 1):
        raise CacheError(f"{shapes}: only batch size 1 is supported")
    h, d, c = cache_v.shape[-3:]
    hb, s, db = block_v.shape[-3:]
    if (hb, db) != (h, d):
        raise CacheError(
            f"{shapes}: the block has H={hb}, D={db} but the transposed cache (H, D, C) has "
            f"H={h}, D={d}"
        )
    check_float(cache_v, "cache_v")
    check_float(block_v, "block_v")
    return check_span(at, s, c, "token columns")
