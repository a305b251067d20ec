"""The SwiGLU activation ``silu(gate) * up`` of an MLP, as one native CPU pass.

Why it exists: on the Linux CPU the activation, not only the MLP's matmuls, costs prefill time.
MLX's CPU exp is scalar, and the compiled polynomial exp of :mod:`~nexus_mlx.kernels.cpu_exp`
runs at ~2.5 ns per element, so ``silu(gate) * up`` over SmolLM2's 1,536 features took 0.4 ms
per layer for 64 rows and 3.9 ms for a 512-row prefill chunk (probe on this project's 2-core
machine, ~9% of a SmolLM2 prefill). The native kernel runs 16 lanes with the shared polynomial
exp, over the caller's cores.

Contract: ``swiglu(gate, up)`` takes two arrays of one shape ``(..., F)`` and returns
``silu(gate) * up`` of that shape. Three parts (house-style rule 5):

- :func:`swiglu_reference`: the specification, ``nn.silu(gate) * up``;
- the native CPU kernel, ``_platform/csrc/swiglu.c`` (scalar, AVX2 + FMA and AVX-512 paths
  picked at run time), built with the system C compiler into ``$XDG_CACHE_HOME/nexus-mlx/`` on
  first use and loaded with ctypes. It evaluates its inputs (a sync point), reads them in place
  (the two halves of one fused gate/up product are strided views) and returns a new array. No
  Metal or CUDA builder on purpose: GPUs have a fast exp, and MLX fuses the elementwise ops;
- the dispatcher :func:`swiglu` (``use_kernel=True``): the native kernel where
  :func:`kernel_applies` (float32 on the CPU, a SIMD path, more than one row and at least
  :data:`MIN_ELEMENTS` elements: a decode step's single row stays lazy, since a sync point
  there would stall the pipelined decode loop, and below that size it costs more than it
  saves), else :func:`~nexus_mlx.kernels.cpu_exp.silu` times ``up`` (the compiled exp, or
  ``nn.silu``).
  Results agree with the reference within float32 rounding (the exp is within 1e-7 relative).

``NEXUS_MLX_SWIGLU=0`` disables the native kernel for the process; ``with disabled():`` turns
the dispatch off for a block (A/B measurements in one run; not thread-safe). It knows nothing
about models or layers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx._platform import cbuild as _cbuild
from nexus_mlx._platform.cbuild import NativeStatus
from nexus_mlx.errors import ArgumentError, BuildError
from nexus_mlx.kernels import active_backend
from nexus_mlx.kernels.cpu_exp import silu

ISAS = ("scalar", "avx512", "avx2")
FAST_ISAS = ("avx512", "avx2")
ABI_VERSION = 1
ENV_VAR = "NEXUS_MLX_SWIGLU"
SOURCE = Path(__file__).resolve().parent.parent / "_platform" / "csrc" / "swiglu.c"
COMPILE_FLAGS = ("-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread")
MIN_ELEMENTS = 4096
"""Below this many elements the dispatcher keeps the lazy MLX path (no sync point): on the
2-core machine the native pass won from 8 rows x 1,536 features (0.04 ms against 0.11) and lost
at one row (0.13 ms against 0.06)."""

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


def swiglu_reference(gate: mx.array, up: mx.array) -> mx.array:
    """The specification: ``nn.silu(gate) * up``."""
    return nn.silu(gate) * up


class NativeSwiGLU:
    """The loaded library; :meth:`swiglu` works on float32 numpy arrays."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        lib.nexus_sg_swiglu.argtypes = [ctypes.c_int, _P, _I64, _P, _I64, _P, _I64, _I64,
                                        ctypes.c_int]
        lib.nexus_sg_swiglu.restype = ctypes.c_int
        self.source_id, self.isas, self.best = _cbuild.bind_isa_exports(
            lib, "nexus_sg", ABI_VERSION, ISAS, path)
        self.threads = max(1, min(os.cpu_count() or 1, 16))

    def __repr__(self) -> str:
        return f"NativeSwiGLU(path={self.path!r}, isas={self.isas}, best={self.best!r})"

    def swiglu(self, gate: np.ndarray, up: np.ndarray, isa: str | None = None) -> np.ndarray:
        """``silu(gate) * up`` of two float32 ``(rows, F)`` arrays (each row's entries
        contiguous, any non-negative row stride), as a new contiguous ``(rows, F)`` array."""
        g_stride, u_stride = _row_stride(gate, "gate"), _row_stride(up, "up")
        if gate.shape != up.shape:
            raise ArgumentError(f"gate {gate.shape} and up {up.shape} differ")
        rows, f = int(gate.shape[0]), int(gate.shape[1])
        out = np.empty((rows, f), np.float32)
        if out.size == 0:
            return out
        if isa is not None and isa not in self.isas:
            raise ArgumentError(f"ISA {isa!r} is not available here (have {self.isas})")
        isa_id = ISAS.index(isa or self.best)
        rc = self.lib.nexus_sg_swiglu(isa_id, gate.ctypes.data, g_stride, up.ctypes.data,
                                      u_stride, out.ctypes.data, rows, f, self.threads)
        if rc != 0:
            raise ArgumentError(f"native SwiGLU failed with code {rc}")
        return out


def _row_stride(a: np.ndarray, name: str) -> int:
    """The row stride of a float32 ``(rows, F)`` array with contiguous rows, in elements."""
    if a.ndim != 2 or a.dtype != np.float32 or (a.shape[1] > 1 and a.strides[1] != 4):
        raise ArgumentError(f"{name} must be a float32 (rows, F) array with contiguous rows, "
                            f"got {a.dtype} {a.shape} strides {a.strides}")
    stride = a.strides[0] // 4 if a.shape[0] > 1 else a.shape[1]
    if stride < a.shape[1] or a.strides[0] % 4:
        raise ArgumentError(f"{name} has unsupported strides {a.strides}")
    return int(stride)


def compile_native(folder: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the C source into ``folder`` (default the user cache), keyed by its hash."""
    return _cbuild.build_with_source_id(SOURCE, "swiglu", COMPILE_FLAGS, "NEXUS_SG_SOURCE_ID",
                                        libraries=("-lm",), folder=folder, compiler=compiler)


def load_native(path: str | Path) -> NativeSwiGLU:
    """Load the library at ``path`` (``OSError`` / :class:`ArgumentError` if unusable)."""
    return NativeSwiGLU(ctypes.CDLL(str(path), mode=os.RTLD_LOCAL), str(path))


_NATIVE = _cbuild.NativeLoader(ENV_VAR, lambda: load_native(compile_native()), "SwiGLU")


def native_swiglu() -> NativeSwiGLU | None:
    """The native library (compiled and loaded on first use), or None."""
    return _NATIVE.library()


def native_status() -> NativeStatus:
    """Why :func:`native_swiglu` is (not) available."""
    return _NATIVE.status()


def disabled() -> contextlib.AbstractContextManager[None]:
    """Inside the block :func:`kernel_applies` is False (the MLX path runs instead)."""
    return _NATIVE.disabled()


def kernel_applies(dtype: mx.Dtype, rows: int, features: int) -> bool:
    """Whether :func:`swiglu` would run the native kernel on ``rows x features`` of ``dtype``."""
    if (_NATIVE.switched_off or dtype != mx.float32 or rows < 2
            or rows * features < MIN_ELEMENTS or active_backend() != "cpu"):
        return False
    native = native_swiglu()
    return native is not None and native.best in FAST_ISAS


def _rows_view(a: mx.array) -> np.ndarray:
    """A numpy ``(rows, F)`` view of an evaluated array (zero-copy where its rows are
    contiguous and evenly spaced, as slices of one matmul output are; numpy copies otherwise)."""
    view = np.asarray(memoryview(a))  # type: ignore[arg-type]
    return view.reshape(-1, view.shape[-1])


def swiglu_kernel(gate: mx.array, up: mx.array) -> mx.array:
    """The native kernel: evaluates ``gate`` and ``up`` and returns a new array of their shape."""
    native = native_swiglu()
    if native is None:
        raise BuildError(native_status().reason)
    _check(gate, up)
    if gate.dtype != mx.float32:
        raise ArgumentError(f"the native SwiGLU needs float32, got {gate.dtype}")
    if gate.size == 0:
        return mx.zeros(gate.shape, mx.float32)
    mx.eval(gate, up)
    out = native.swiglu(_rows_view(gate), _rows_view(up))
    return mx.array(out).reshape(gate.shape)


def _check(gate: mx.array, up: mx.array) -> None:
    if tuple(gate.shape) != tuple(up.shape) or gate.ndim < 1:
        raise ArgumentError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must share one "
                            f"shape (..., F)")
    if gate.dtype != up.dtype:
        raise ArgumentError(f"gate ({gate.dtype}) and up ({up.dtype}) must share one dtype")


def swiglu(gate: mx.array, up: mx.array, use_kernel: bool = True) -> mx.array:
    """``silu(gate) * up``: the native kernel for float32 on the CPU where
    :func:`kernel_applies`, else the lazy MLX path (:func:`~nexus_mlx.kernels.cpu_exp.silu`)."""
    _check(gate, up)
    features = int(gate.shape[-1])
    if use_kernel and kernel_applies(gate.dtype, gate.size // max(features, 1), features):
        return swiglu_kernel(gate, up)
    return silu(gate, use_kernel) * up
