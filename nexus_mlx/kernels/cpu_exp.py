"""A vectorized exp for MLX's CPU back-end, and the softmax and SiLU built on it.

Why it exists: MLX's CPU ``exp`` is evaluated one element at a time (about 16 ns per element on
this project's 2-core Linux machine: 19 ms for the 1.2 M scores of one layer of a 64-query
refresh over 2,048 keys, where numpy's exp takes 0.5 ms and the two attention matmuls 1.6 ms).
So on Linux CPU the softmax, not the matmuls, dominated long-context attention, in
``mx.fast.scaled_dot_product_attention`` as much as in an explicit softmax; and the SiLU of a
SwiGLU MLP (a sigmoid, so an exp per element) cost as much as the MLP's three matmuls.

The kernel builds ``exp`` from vectorized primitives (multiply-add, an integer shift and a
bit-cast) that ``mx.compile`` fuses into one elementwise kernel:

    n = round(x / ln 2)                      # x clamped to [-87, 88]
    r = x - n * ln2_hi - n * ln2_lo          # Cody-Waite reduction, |r| <= ln 2 / 2
    p = 1 + r + r^2 * P(r)                   # degree-5 minimax P (Cephes expf)
    exp(x) = p * bitcast_f32((n + 127) << 23)
    exp(x) = 0 for x < -87 (and -inf)        # exact zeros for masked keys, no subnormals

Accuracy: within 1e-7 relative of a float64 exp over [-87, 88] (MLX's own CPU exp is within
4e-6). Rounding uses the 1.5 * 2^23 trick, which is exact for |x / ln 2| < 2^22.

Three parts (house-style rule 5) for each of softmax and SiLU: references
(:func:`softmax_reference` = ``mx.softmax``, :func:`silu_reference` = ``nn.silu``), kernels
built on the compiled :func:`fast_exp` (CPU, float32), and dispatchers (:func:`softmax`,
:func:`silu`) that use the kernel for float32 on the CPU and the reference everywhere else (Metal
and CUDA have a fast exp). If ``mx.compile`` cannot build the kernel (no C++ compiler at run
time), the dispatchers fall back to the references and warn once. It knows nothing about
attention, masks or models.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.kernels import active_backend

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # ln 2 split so that n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
         1.6666665459e-1, 5.0000001201e-1)  # Cephes expf, highest degree first
_ROUND = 12582912.0  # 1.5 * 2^23: (y + _ROUND) - _ROUND rounds y to the nearest integer
_LOW, _HIGH = -87.0, 88.0  # exp(-87) is the smallest normal-range result we keep


def _exp_graph(x: mx.array) -> mx.array:
    """The elementwise graph of the vectorized exp (float32 in, float32 out)."""
    clamped = mx.minimum(mx.maximum(x, _LOW), _HIGH)
    n = (clamped * _LOG2E + _ROUND) - _ROUND
    r = clamped - n * _LN2_HI - n * _LN2_LO
    poly = mx.array(_POLY[0], mx.float32)
    for c in _POLY[1:]:
        poly = poly * r + c
    mantissa = poly * r * r + r + 1.0
    scale = mx.view(mx.left_shift(n.astype(mx.int32) + 127, 23), mx.float32)  # 2^n
    return mx.where(x < _LOW, 0.0, mantissa * scale)


def _silu_graph(x: mx.array) -> mx.array:
    """``x * sigmoid(x) = x / (1 + exp(-x))``; exp(-x) saturates at exp(88) for x < -88,
    where the true value is below 1e-36 in magnitude."""
    return x / (1.0 + _exp_graph(-x))


@functools.cache
def _compiled_exp() -> Callable[[mx.array], mx.array]:
    return mx.compile(_exp_graph)


@functools.cache
def _compiled_silu() -> Callable[[mx.array], mx.array]:
    return mx.compile(_silu_graph)


def fast_exp(x: mx.array) -> mx.array:
    """``exp(x)`` for float32 ``x`` through the fused vectorized kernel (any back-end runs it;
    it only pays off on the CPU). Values below -87 give exactly 0; above 88 saturate."""
    if x.dtype != mx.float32:
        raise TypeError(f"fast_exp needs float32, got {x.dtype}")
    return _compiled_exp()(x)


def softmax_reference(x: mx.array) -> mx.array:
    """The specification: ``mx.softmax`` over the last axis, accumulated in float32."""
    return mx.softmax(x, axis=-1, precise=True)


def softmax_kernel(x: mx.array) -> mx.array:
    """Softmax over the last axis of float32 ``x`` with :func:`fast_exp`.

    Entries at -inf (or more than 87 below their row's maximum) get exactly 0. A row of only
    -inf gives NaN, as the reference does.
    """
    e = fast_exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@functools.cache
def _kernel_checked() -> bool:
    """Build and check the kernel once; False (with one warning) if it cannot be used."""
    probe = mx.array([[-mx.inf, -100.0, -3.5, 0.0, 2.25]], mx.float32)
    try:
        ok = bool(mx.allclose(softmax_kernel(probe), softmax_reference(probe), rtol=1e-6,
                              atol=1e-7).item())
        finite = probe[:, 1:]
        ok = ok and bool(mx.allclose(silu_kernel(finite), silu_reference(finite), rtol=1e-6,
                                     atol=1e-7).item())
    except Exception as exc:  # compile needs a C++ toolchain on the CPU back-end
        warnings.warn(f"vectorized CPU exp unavailable ({exc}); using mx.softmax and nn.silu, "
                      f"which are several times slower on the CPU", RuntimeWarning, stacklevel=3)
        return False
    if not ok:
        warnings.warn("vectorized CPU exp failed its self-check; using mx.softmax and nn.silu",
                      RuntimeWarning, stacklevel=3)
    return ok


def kernel_applies(dtype: mx.Dtype) -> bool:
    """Whether :func:`softmax` and :func:`silu` would use the kernels for ``dtype`` now."""
    return dtype == mx.float32 and active_backend() == "cpu" and _kernel_checked()


def softmax(x: mx.array, use_kernel: bool = True) -> mx.array:
    """Softmax over the last axis: the vectorized kernel for float32 on the CPU, else
    ``mx.softmax``. Results agree with the reference within float32 rounding."""
    if use_kernel and kernel_applies(x.dtype):
        return softmax_kernel(x)
    return softmax_reference(x)


def silu_reference(x: mx.array) -> mx.array:
    """The specification: ``nn.silu``."""
    return nn.silu(x)


def silu_kernel(x: mx.array) -> mx.array:
    """``x * sigmoid(x)`` of float32 ``x`` in one fused kernel over :func:`fast_exp`'s graph."""
    if x.dtype != mx.float32:
        raise TypeError(f"silu_kernel needs float32, got {x.dtype}")
    return _compiled_silu()(x)


def silu(x: mx.array, use_kernel: bool = True) -> mx.array:
    """SiLU: the vectorized kernel for float32 on the CPU, else ``nn.silu``."""
    if use_kernel and kernel_applies(x.dtype):
        return silu_kernel(x)
    return silu_reference(x)
