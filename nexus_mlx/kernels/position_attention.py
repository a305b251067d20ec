"""Attention masked by absolute position in one fused, blocked CPU pass (no score matrix).

Why it exists: on the Linux CPU the unfused attention of the forward pass (a scores GEMM, the
native softmax of :mod:`~nexus_mlx.kernels.position_softmax`, a PV GEMM) streams a (rows x keys)
score matrix through memory three times and synchronises between the steps; over thousands of
keys that, not the arithmetic, is what long-context attention costs (a packed refresh of 64 rows
at N = 8,000 spent 262 of its 381 ms in attention). The native kernel walks 64-key blocks with an
online softmax, 4 query rows at a time with their scores in L1, and skips blocks no row of a
panel can see.

Contract: ``position_attention(q, k, v, query_pos, key_pos, scale, window=None)`` takes grouped
queries ``q (1, Hkv, R, D)`` whose row ``r`` is query ``r % T`` (``T = len(query_pos)``; the
layout ``(1, Hkv, G * T, D)`` of grouped-query attention, not yet scaled), keys and values
``k, v (1, Hkv, N, D)`` (row layout; views into a larger cache are fine) and returns
``(1, Hkv, R, D)``:

    visible(t, j) = 0 <= query_pos[t] - key_pos[j]  (and < window when a window is given)
    out[r] = sum_j softmax_visible(scale * q[r] . k[j]) v[j]    (NaN where no key is visible)

Three parts (house-style rule 5):

- :func:`position_attention_reference`: the specification in MLX ops (the grouped GEMM, the
  position softmax's reference, the value GEMM).
- the native CPU kernel, ``_platform/csrc/position_attention.c`` (a scalar path, and AVX-512 and
  AVX2 + FMA paths picked at run time), built with the system C compiler into
  ``$XDG_CACHE_HOME/nexus-mlx/`` on first use and loaded with ctypes. It evaluates its inputs (a
  sync point) and returns a new array. It keeps one scratch buffer per calling thread for the
  transposed keys (Hkv x N x D floats of the largest call so far, e.g. 6 MB for SmolLM2 at 8K
  keys), reused across calls.
  There is no Metal or CUDA builder on purpose: on a GPU the forward pass calls
  ``mx.fast.scaled_dot_product_attention``, which fuses the same steps.
- the dispatcher :func:`position_attention` (``use_kernel=True``): the native kernel where
  :func:`kernel_applies` (float32 on the CPU, an AVX-512 CPU, head_dim a multiple of 16 up to
  512), else the reference (the AVX2 path is slower than the unfused attention at long contexts,
  see ``FAST_ISAS``). Results agree within float32 rounding (the online softmax sums in
  another order; the kernel's exp is within 1e-7 relative).

``NEXUS_MLX_POSITION_ATTENTION=0`` disables the native kernel for the process; ``with
disabled():`` turns the dispatch off for a block (A/B measurements in one run; not thread-safe).
It knows nothing about models, layers, RoPE or the cache object.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from nexus_mlx._platform import cbuild as _cbuild
from nexus_mlx._platform.cbuild import NativeStatus
from nexus_mlx.errors import ArgumentError, BuildError
from nexus_mlx.kernels import active_backend
from nexus_mlx.kernels.position_softmax import MAX_POSITION, position_softmax_reference

ISAS = ("scalar", "avx512", "avx2")
# The paths the dispatcher takes: not the scalar reference, and not AVX2, which over 8,000 keys
# (SmolLM2's shapes, one layer, isolated) took 18.1 ms where the two-GEMM path takes 12-15 ms
# (at 2,048 keys 3.6 ms against 3.7-4.0). Both stay callable (``isa=...``) and tested.
FAST_ISAS = ("avx512",)
ABI_VERSION = 2
ENV_VAR = "NEXUS_MLX_POSITION_ATTENTION"
SOURCE = Path(__file__).resolve().parent.parent / "_platform" / "csrc" / "position_attention.c"
COMPILE_FLAGS = ("-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread")

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


def position_attention_reference(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    query_pos: np.ndarray,
    key_pos: np.ndarray,
    scale: float,
    window: int | None = None,
) -> mx.array:
    """The specification in MLX ops: ``(q * scale) @ k^T``, the position softmax, ``@ v``."""
    scores = (q * scale) @ k.swapaxes(-1, -2)  # (1, Hkv, R, N)
    probs = position_softmax_reference(scores, query_pos, key_pos, window)
    return probs @ v  # (1, Hkv, R, D)


class NativePositionAttention:
    """The loaded library; :meth:`attention` works on float32 numpy arrays."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        lib.nexus_pa_supports_head_dim.argtypes = [ctypes.c_int, _I64]
        lib.nexus_pa_supports_head_dim.restype = ctypes.c_int
        lib.nexus_pa_attention.argtypes = [ctypes.c_int, _P, _I64, _P, _I64, _I64, _P, _I64, _I64,
                                           _P, _I64, _I64, _I64, _I64, _I64, _P, _P,
                                           ctypes.c_int32, ctypes.c_float, ctypes.c_int]
        lib.nexus_pa_attention.restype = ctypes.c_int
        self.source_id, self.isas, self.best = _cbuild.bind_isa_exports(
            lib, "nexus_pa", ABI_VERSION, ISAS, path)
        self.threads = max(1, min(os.cpu_count() or 1, 16))

    def __repr__(self) -> str:
        return f"NativePositionAttention(path={self.path!r}, isas={self.isas}, best={self.best!r})"

    def supports_head_dim(self, d: int, isa: str | None = None) -> bool:
        """Whether ``isa`` (default the best) runs head dimension ``d``."""
        return bool(self.lib.nexus_pa_supports_head_dim(ISAS.index(isa or self.best), int(d)))

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        query_pos: np.ndarray,
        key_pos: np.ndarray,
        scale: float,
        window: int | None = None,
        isa: str | None = None,
    ) -> np.ndarray:
        """``(Hkv, R, D)`` attention of ``q (Hkv, R, D)`` over ``k, v (Hkv, N, D)`` (float32; the
        last axis of each contiguous, any row and head strides); see the module docstring."""
        hkv, rows, d = _shape3(q, "q")
        _, n, _ = _shape3(k, "k")
        if k.shape != (hkv, n, d) or v.shape != (hkv, n, d):
            raise ArgumentError(f"k {k.shape} and v {v.shape} must both be ({hkv}, N, {d})")
        qp = np.ascontiguousarray(query_pos, dtype=np.int32).reshape(-1)
        kp = np.ascontiguousarray(key_pos, dtype=np.int32).reshape(-1)
        t = int(qp.size)
        if t == 0 or rows % t or kp.size != n:
            raise ArgumentError(f"{rows} rows over {n} keys do not fit {t} queries and "
                                f"{kp.size} key positions")
        if isa is not None and isa not in self.isas:
            raise ArgumentError(f"ISA {isa!r} is not available here (have {self.isas})")
        isa_id = ISAS.index(isa or self.best)
        if not self.supports_head_dim(d, ISAS[isa_id]):
            raise ArgumentError(f"the {ISAS[isa_id]} path does not run head_dim {d}")
        win = 0 if window is None else int(window)
        if window is not None and not 0 < win <= MAX_POSITION:
            raise ArgumentError(f"window {window} must be in [1, 2**31)")
        q = np.ascontiguousarray(q)
        out = np.empty((hkv, rows, d), np.float32)
        (q_hs, _), (k_hs, k_rs), (v_hs, v_rs) = (_row_strides(a) for a in (q, k, v))
        rc = self.lib.nexus_pa_attention(
            isa_id, q.ctypes.data, q_hs, k.ctypes.data, k_hs, k_rs, v.ctypes.data, v_hs, v_rs,
            out.ctypes.data, hkv, rows, t, n, d, qp.ctypes.data, kp.ctypes.data, win,
            float(scale), self.threads)
        if rc != 0:
            raise ArgumentError(f"native position attention failed with code {rc}")
        return out


def _shape3(a: np.ndarray, name: str) -> tuple[int, int, int]:
    if a.ndim != 3 or a.dtype != np.float32 or a.strides[-1] != 4:
        raise ArgumentError(f"{name} must be a float32 (Hkv, rows, D) array with a contiguous "
                            f"last axis, got {a.dtype} {a.shape} strides {a.strides}")
    return int(a.shape[0]), int(a.shape[1]), int(a.shape[2])


def _row_strides(a: np.ndarray) -> tuple[int, int]:
    """(head stride, row stride) in elements; both non-negative, as the kernel requires."""
    head, row = a.strides[0] // 4, a.strides[1] // 4
    if head < 0 or row < 0 or a.strides[0] % 4 or a.strides[1] % 4:
        raise ArgumentError(f"unsupported strides {a.strides}")
    return head, row


def compile_native(folder: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the C source into ``folder`` (default the user cache), keyed by its hash."""
    return _cbuild.build_with_source_id(SOURCE, "position_attention", COMPILE_FLAGS,
                                        "NEXUS_PA_SOURCE_ID",
                                        libraries=("-lm",), folder=folder,
                                        compiler=compiler)


def load_native(path: str | Path) -> NativePositionAttention:
    """Load the library at ``path`` (``OSError`` / :class:`ArgumentError` if unusable)."""
    return NativePositionAttention(ctypes.CDLL(str(path), mode=os.RTLD_LOCAL), str(path))


_NATIVE = _cbuild.NativeLoader(ENV_VAR, lambda: load_native(compile_native()),
                                "position attention")


def native_position_attention() -> NativePositionAttention | None:
    """The native library (compiled and loaded on first use), or None."""
    return _NATIVE.library()


def native_status() -> NativeStatus:
    """Why :func:`native_position_attention` is (not) available."""
    return _NATIVE.status()


def disabled() -> contextlib.AbstractContextManager[None]:
    """Inside the block :func:`kernel_applies` is False, so the forward pass takes its unfused
    path (for benchmarks that compare both in one run)."""
    return _NATIVE.disabled()


def kernel_applies(dtype: mx.Dtype, head_dim: int) -> bool:
    """Whether :func:`position_attention` would run a fast native path for these inputs now."""
    if _NATIVE.switched_off or dtype != mx.float32 or active_backend() != "cpu":
        return False
    native = native_position_attention()
    return native is not None and native.best in FAST_ISAS and native.supports_head_dim(head_dim)


def _numpy_view(a: mx.array) -> np.ndarray:
    """A numpy view of an evaluated array ``(1, ...)`` without its batch axis: zero-copy where its
    last axis is contiguous (a cache view is), else a contiguous copy."""
    view = np.asarray(memoryview(a))[0]  # type: ignore[arg-type]
    return view if view.strides[-1] == view.itemsize else np.ascontiguousarray(view)


def position_attention_kernel(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    query_pos: np.ndarray,
    key_pos: np.ndarray,
    scale: float,
    window: int | None = None,
) -> mx.array:
    """The native kernel: evaluates ``q``, ``k`` and ``v`` and returns a new ``(1, Hkv, R, D)``
    array."""
    native = native_position_attention()
    if native is None:
        raise BuildError(native_status().reason)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim != 4 or a.shape[0] != 1 or a.dtype != mx.float32:
            raise ArgumentError(f"{name} must be a float32 (1, Hkv, rows, D) array, got "
                                f"{a.dtype} {tuple(a.shape)}")
    mx.eval(q, k, v)
    qn, kn, vn = (_numpy_view(a) for a in (q, k, v))
    out = native.attention(qn, kn, vn, np.asarray(query_pos).reshape(-1),
                           np.asarray(key_pos).reshape(-1), scale, window)
    return mx.array(out)[None]


def position_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    query_pos: np.ndarray,
    key_pos: np.ndarray,
    scale: float,
    window: int | None = None,
    use_kernel: bool = True,
) -> mx.array:
    """The dispatcher: the native kernel where :func:`kernel_applies`, else the reference."""
    if use_kernel and kernel_applies(q.dtype, int(q.shape[-1])):
        return position_attention_kernel(q, k, v, query_pos, key_pos, scale, window)
    return position_attention_reference(q, k, v, query_pos, key_pos, scale, window)
