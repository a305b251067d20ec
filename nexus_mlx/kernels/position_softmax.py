"""Softmax of attention scores masked by absolute position: the CPU forward pass's attention.

Why it exists: MLX's CPU ``exp`` is scalar and every elementwise pass over a long-context score
matrix is a separate kernel, so on the Linux CPU the mask and the softmax, not the two attention
GEMMs, dominated attention over thousands of keys (a packed refresh of 64 rows at N = 2,048 spent
110 of its 280 ms in the softmax and 15 ms applying the mask). The native kernel does mask,
maximum, exp, sum and normalisation in one sweep per row while the row sits in L1, with the
visibility rule computed from positions (no mask tensor is ever built).

Contract: ``position_softmax(scores, query_pos, key_pos, window=None)`` takes ``scores (..., R,
N)`` whose row ``r`` (counted over all leading axes) belongs to query ``r % T`` (``T =
len(query_pos)``; the layout of grouped-query scores ``(1, Hkv, G * T, N)``) and returns the
softmax over the keys each query sees:

    visible(t, j) = 0 <= query_pos[t] - key_pos[j]  (and < window when a window is given)
    probs[r, j]   = exp(s[r, j] - m_r) / sum_visible exp(s[r, i] - m_r)   where visible, else 0

(a row that sees no key is NaN, as a softmax over only -inf is). Three parts (house-style rule 5):

- :func:`position_softmax_reference`: the specification in MLX ops (a boolean mask, ``mx.where``,
  ``mx.softmax(precise=True)``).
- the native CPU kernel, ``_platform/csrc/position_softmax.c`` (scalar, AVX2 and AVX-512 paths
  picked at run time), built with the system C compiler into ``$XDG_CACHE_HOME/nexus-mlx/`` on
  first use and loaded with ctypes. It works *in place* on the evaluated buffer of ``scores``, so
  the dispatcher evaluates ``scores`` (a sync point) and the caller must not use the pre-softmax
  values afterwards. There is no Metal or CUDA builder on purpose: on a GPU the forward pass calls
  ``mx.fast.scaled_dot_product_attention``, which fuses this step.
- the dispatcher :func:`position_softmax` (``use_kernel=True``): the native kernel for float32 on
  the CPU when it is available (:func:`kernel_applies`), else the reference. Results agree within
  float32 rounding (the kernel's exp is within 1e-7 relative).

``NEXUS_MLX_POSITION_SOFTMAX=0`` disables the native kernel. It knows nothing about models,
layers or the cache.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from nexus_mlx._platform import cbuild as _cbuild
from nexus_mlx._platform.cbuild import NativeStatus
from nexus_mlx.errors import ArgumentError, BuildError
from nexus_mlx.kernels import active_backend

ISAS = ("scalar", "avx2", "avx512")
ABI_VERSION = 1
ENV_VAR = "NEXUS_MLX_POSITION_SOFTMAX"
SOURCE = Path(__file__).resolve().parent.parent / "_platform" / "csrc" / "position_softmax.c"
COMPILE_FLAGS = ("-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread")
MAX_POSITION = 2**31 - 1  # positions travel as int32

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


def visibility(
    query_pos: np.ndarray, key_pos: np.ndarray, window: int | None = None
) -> np.ndarray:
    """Boolean ``(T, N)``: key ``j`` visible to query ``t`` (the rule of the module docstring)."""
    diff = np.asarray(query_pos, np.int64)[:, None] - np.asarray(key_pos, np.int64)[None, :]
    seen = diff >= 0
    if window is not None:
        seen &= diff < window
    return seen


def _check(scores: mx.array, query_pos: np.ndarray, key_pos: np.ndarray) -> tuple[int, int]:
    """``(T, N)`` after checking the shapes agree with the row layout."""
    if scores.ndim < 2:
        raise ArgumentError(f"scores must have shape (..., R, N), got {tuple(scores.shape)}")
    t, n = int(query_pos.shape[0]), int(key_pos.shape[0])
    rows = scores.size // max(int(scores.shape[-1]), 1)
    if t == 0 or scores.shape[-1] != n or scores.shape[-2] % t or rows % t:
        raise ArgumentError(
            f"scores {tuple(scores.shape)} do not fit {t} queries over {n} keys: the last axis "
            f"must be N and the row count a multiple of T"
        )
    return t, n


def position_softmax_reference(
    scores: mx.array, query_pos: np.ndarray, key_pos: np.ndarray, window: int | None = None
) -> mx.array:
    """The specification: mask by :func:`visibility`, then ``mx.softmax`` in float32."""
    qp, kp = np.asarray(query_pos).reshape(-1), np.asarray(key_pos).reshape(-1)
    t, n = _check(scores, qp, kp)
    seen = mx.array(visibility(qp, kp, window))  # (T, N)
    grouped = scores.reshape(-1, t, n)  # (R_total / T, T, N)
    masked = mx.where(seen, grouped, mx.array(-mx.inf, scores.dtype))
    return mx.softmax(masked, axis=-1, precise=True).reshape(scores.shape)


class NativePositionSoftmax:
    """The loaded library; :meth:`softmax_` works on a float32 row-major numpy view in place."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        lib.nexus_ps_softmax.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P, _P,
                                         ctypes.c_int32, ctypes.c_int]
        lib.nexus_ps_softmax.restype = ctypes.c_int
        self.source_id, self.isas, self.best = _cbuild.bind_isa_exports(
            lib, "nexus_ps", ABI_VERSION, ISAS, path)
        self.threads = max(1, min(os.cpu_count() or 1, 16))

    def __repr__(self) -> str:
        return f"NativePositionSoftmax(path={self.path!r}, isas={self.isas}, best={self.best!r})"

    def softmax_(
        self,
        buf: np.ndarray,
        query_pos: np.ndarray,
        key_pos: np.ndarray,
        window: int | None = None,
        isa: str | None = None,
    ) -> None:
        """Overwrite ``buf (..., R, N)`` (float32, C-contiguous, writable) with its position
        softmax; positions are cast to int32 (they must lie in ``[0, 2**31)``)."""
        if buf.dtype != np.float32 or not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ArgumentError("the native softmax needs a writable C-contiguous float32 buffer")
        qp = np.ascontiguousarray(query_pos, dtype=np.int32).reshape(-1)
        kp = np.ascontiguousarray(key_pos, dtype=np.int32).reshape(-1)
        t, n = int(qp.size), int(kp.size)
        if t == 0 or buf.shape[-1] != n or (buf.size // max(n, 1)) % t:
            raise ArgumentError(f"buffer {buf.shape} does not fit {t} queries over {n} keys")
        if isa is not None and isa not in self.isas:
            raise ArgumentError(f"ISA {isa!r} is not available here (have {self.isas})")
        isa_id = -1 if isa is None else ISAS.index(isa)
        win = 0 if window is None else int(window)
        if window is not None and not 0 < win <= MAX_POSITION:
            raise ArgumentError(f"window {window} must be in [1, 2**31)")
        rc = self.lib.nexus_ps_softmax(isa_id, buf.ctypes.data, buf.size // n, n, n, t,
                                       qp.ctypes.data, kp.ctypes.data, win, self.threads)
        if rc != 0:
            raise ArgumentError(f"native position softmax failed with code {rc}")


def compile_native(folder: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the C source into ``folder`` (default the user cache), keyed by its hash."""
    return _cbuild.build_with_source_id(SOURCE, "position_softmax", COMPILE_FLAGS,
                                        "NEXUS_PS_SOURCE_ID",
                                        libraries=("-lm",), folder=folder,
                                        compiler=compiler)


def load_native(path: str | Path) -> NativePositionSoftmax:
    """Load the library at ``path`` (``OSError`` / :class:`ArgumentError` if unusable)."""
    return NativePositionSoftmax(ctypes.CDLL(str(path), mode=os.RTLD_LOCAL), str(path))


_NATIVE = _cbuild.NativeLoader(ENV_VAR, lambda: load_native(compile_native()),
                                "position softmax")


def native_position_softmax() -> NativePositionSoftmax | None:
    """The native library (compiled and loaded on first use), or None."""
    return _NATIVE.library()


def native_status() -> NativeStatus:
    """Why :func:`native_position_softmax` is (not) available."""
    return _NATIVE.status()


def kernel_applies(dtype: mx.Dtype) -> bool:
    """Whether :func:`position_softmax` would run the native kernel for ``dtype`` now."""
    return dtype == mx.float32 and active_backend() == "cpu" and native_position_softmax() is not None


def position_softmax_kernel(
    scores: mx.array, query_pos: np.ndarray, key_pos: np.ndarray, window: int | None = None
) -> mx.array:
    """The native kernel: evaluates ``scores`` and overwrites its buffer with the result, which
    it returns (a contiguous copy is made first if ``scores`` is a strided view)."""
    native = native_position_softmax()
    if native is None:
        raise BuildError(native_status().reason)
    qp, kp = np.asarray(query_pos).reshape(-1), np.asarray(key_pos).reshape(-1)
    _check(scores, qp, kp)
    if scores.dtype != mx.float32:
        raise ArgumentError(f"the native position softmax needs float32, got {scores.dtype}")
    mx.eval(scores)
    buf = np.asarray(memoryview(scores))  # type: ignore[arg-type]  # zero-copy view
    if not (buf.flags.c_contiguous and buf.flags.writeable):
        scores = mx.contiguous(scores)
        mx.eval(scores)
        buf = np.asarray(memoryview(scores))  # type: ignore[arg-type]
    native.softmax_(buf, qp, kp, window)
    return scores


def position_softmax(
    scores: mx.array,
    query_pos: np.ndarray,
    key_pos: np.ndarray,
    window: int | None = None,
    use_kernel: bool = True,
) -> mx.array:
    """The dispatcher: the native kernel for float32 on the CPU (in place, evaluating
    ``scores``), else the lazy reference."""
    if use_kernel and kernel_applies(scores.dtype):
        return position_softmax_kernel(scores, query_pos, key_pos, window)
    return position_softmax_reference(scores, query_pos, key_pos, window)
