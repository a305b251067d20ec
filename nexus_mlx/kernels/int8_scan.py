"""INT8 scan of the semantic lookaside buffer: quantization, int32 dot products, fused top-k.

Contract (every path computes exactly this; the tests hold them to it):

- ``quantize_rows(x (M, D) float32) -> (codes (M, D) int8, scales (M,) float32)``: symmetric
  per-vector quantization, ``scale = max|x| / 127`` in float32 and ``code = clip(rint(x /
  scale), -127, 127)`` (ties to even; -128 never occurs). An all-zero row gets scale 0 and zero
  codes. Non-finite values raise :class:`ScanInputError`.
- ``dot[i] = sum_j int32(codes[i, j]) * int32(query[j])``, exact in int32 (``|dot| <= 16129 D``).
- ``key[i] = float32(dot[i]) * scales[i]`` (one float32 rounding); top-k = the k largest keys,
  best first, **equal keys rank the lower row index first**; ``k > N`` returns N rows.
- ``search(query float32)``: quantize the query as above, top-k, ``score = key * query_scale``.

Three implementations of the scan (house-style rule 5, with a native CPU part added):

1. Reference (numpy): :func:`scores_reference`, :func:`topk_reference`, :func:`search_reference`.
2. Native CPU: ``csrc/int8_scan.c``, a plain shared library (``_int8_scan.so``, built by
   ``setup.py`` at install; compiled with ``cc`` into ``$XDG_CACHE_HOME/nexus-mlx/`` when missing
   or older than its source) loaded with ctypes. One binary holds a scalar, an AVX2, an AVX-512
   VNNI, a NEON and a NEON dot-product path, picked at run time by CPU feature checks, and
   fuses quantization, scan and a size-k heap, so Python receives only k results. It wants rows
   padded with zeros to a multiple of 64 bytes (:func:`padded_width`) and, for VNNI, per-row code
   sums. :func:`native_scan` returns it, or None (``NEXUS_MLX_INT8_SCAN=0`` or no library and no
   compiler); :func:`native_status` says why.
3. GPU: a Metal kernel (``metal_kernels/int8_scan.metal``) and a CUDA twin computing the int32
   scores, built lazily (None where the back-end is unavailable), behind the dispatcher
   :func:`int8_scores` whose fallback is the pure-MLX :func:`int8_scores_reference_mlx`.

:func:`int8_search` is the CPU dispatcher (native when available and ``use_kernel``, else the
numpy reference). This module knows nothing about tool names, embedders or files.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import NexusError
from nexus_mlx.kernels import active_backend, build_cuda_kernel, build_metal_kernel

ISAS = ("scalar", "avx2", "avx512vnni", "neon", "neondot")
ALIGN = 64
MAX_DIM = 65536
ABI_VERSION = 2
ENV_VAR = "NEXUS_MLX_INT8_SCAN"
LIBRARY_NAME = "_int8_scan.so"

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../nexus_mlx
SOURCE = _PACKAGE_DIR / "csrc" / "int8_scan.c"
COMPILE_FLAGS = ("-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-ffp-contract=off")

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


class ScanInputError(NexusError, ValueError):
    """Arrays handed to the scan have the wrong shape, dtype, range or layout, or hold NaN/inf."""


# ---- reference ------------------------------------------------------------------------------
def padded_width(dim: int) -> int:
    """Row width in bytes the native scan needs: ``dim`` rounded up to a multiple of 64."""
    return -(-int(dim) // ALIGN) * ALIGN


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row INT8 quantization of ``x (M, D)``: ``(codes (M, D) int8, scales (M,)
    float32)`` with ``x ~ codes * scales[:, None]``."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ScanInputError(f"expected a (M, D) array of vectors, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise ScanInputError(
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


# ---- native CPU library ---------------------------------------------------------------------
@dataclass(frozen=True)
class NativeStatus:
    """Outcome of loading the native scan: ``loaded``, the library ``path``, the ``isas`` this
    CPU can run (fastest-first order of ``best``), and one sentence of ``reason``."""

    loaded: bool
    reason: str
    path: str | None = None
    isas: tuple[str, ...] = ()
    best: str | None = None


class _Unavailable(Exception):
    """Internal: a step failed; the message becomes the status reason."""


_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class _Plan(ctypes.Structure):
    """Mirror of ``nexus_i8_plan`` in ``csrc/int8_scan.c`` (its size is checked at load)."""

    _fields_ = [
        ("codes", _P),
        ("sums", _P),
        ("scales", _P),
        ("n", _I64),
        ("dim", _I64),
        ("stride", _I64),
        ("query", _P),
        ("k", _I64),
        ("out_idx", _P),
        ("out_score", _P),
        ("out_qscale", ctypes.c_float),
        ("isa", ctypes.c_int32),
    ]


class NativeInt8Scan:
    """The loaded ``_int8_scan`` library. Array arguments are checked, then passed by address.

    ``isa`` arguments take a name from :data:`ISAS` or None (the fastest one available).
    """

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib = lib
        self.path = path
        lib.nexus_i8_abi_version.restype = ctypes.c_int
        self.abi_version = int(lib.nexus_i8_abi_version())
        if self.abi_version != ABI_VERSION:
            raise ScanInputError(
                f"{path} has ABI version {self.abi_version}, this module needs {ABI_VERSION}"
            )
        lib.nexus_i8_plan_size.restype = _I64
        if int(lib.nexus_i8_plan_size()) != ctypes.sizeof(_Plan):
            raise ScanInputError(f"{path}: the plan struct's size differs from this module's")
        lib.nexus_i8_source_id.restype = ctypes.c_char_p
        lib.nexus_i8_best_isa.restype = ctypes.c_int
        lib.nexus_i8_isa_available.argtypes = [ctypes.c_int]
        lib.nexus_i8_isa_available.restype = ctypes.c_int
        lib.nexus_i8_quantize.argtypes = [ctypes.c_int, _P, _I64, _I64, _P, _P]
        lib.nexus_i8_quantize.restype = ctypes.c_int
        lib.nexus_i8_scores.argtypes = [ctypes.c_int, _P, _P, _I64, _I64, _P, _P]
        lib.nexus_i8_scores.restype = ctypes.c_int
        lib.nexus_i8_topk.argtypes = [ctypes.c_int, _P, _P, _P, _I64, _I64, _P, _I64, _P, _P]
        lib.nexus_i8_topk.restype = _I64
        lib.nexus_i8_search.argtypes = [ctypes.POINTER(_Plan)]
        lib.nexus_i8_search.restype = _I64
        self.source_id = (lib.nexus_i8_source_id() or b"").decode()
        self.isas = tuple(n for i, n in enumerate(ISAS) if lib.nexus_i8_isa_available(i))
        self.best = ISAS[int(lib.nexus_i8_best_isa())]
        self._isa_ids = {name: ISAS.index(name) for name in self.isas}

    def __repr__(self) -> str:
        return f"NativeInt8Scan(path={self.path!r}, isas={self.isas}, best={self.best!r})"

    def isa_id(self, isa: str | None) -> int:
        """Index of ``isa`` in :data:`ISAS` (-1 for None: the fastest), checked available."""
        if isa is None:
            return -1
        known = self._isa_ids.get(isa)
        if known is not None:
            return known
        if isa not in ISAS:
            raise ScanInputError(f"unknown ISA {isa!r}; choose one of {ISAS}")
        if isa not in self.isas:
            raise ScanInputError(f"ISA {isa!r} is not available on this CPU (have {self.isas})")
        return ISAS.index(isa)

    def quantize(
        self, x: np.ndarray, width: int | None = None, isa: str | None = None
    ) -> tuple[np.ndarray, float]:
        """Quantize one vector ``x (D,)`` in C with the quantizer of ``isa``: ``(codes (width,)
        int8 zero-padded, scale)``."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 1 or x.size == 0:
            raise ScanInputError(f"expected a non-empty (D,) vector, got shape {x.shape}")
        width = x.size if width is None else int(width)
        out = np.empty((width,), np.int8)
        scale = np.zeros((1,), np.float32)
        rc = self.lib.nexus_i8_quantize(self.isa_id(isa), x.ctypes.data, x.size, width,
                                        out.ctypes.data, scale.ctypes.data)
        _check_rc(rc, "quantize")
        return out, float(scale[0])

    def scores(
        self, codes: np.ndarray, sums: np.ndarray, query: np.ndarray, isa: str | None = None
    ) -> np.ndarray:
        """int32 dots of padded ``codes (N, W)`` with the padded int8 ``query (W,)``."""
        n, width = _check_padded(codes, sums)
        query = _check_query_codes(query, width)
        out = np.empty((n,), np.int32)
        rc = self.lib.nexus_i8_scores(self.isa_id(isa), codes.ctypes.data, sums.ctypes.data, n,
                                      width, query.ctypes.data, out.ctypes.data)
        _check_rc(rc, "scores")
        return out

    def topk(
        self,
        codes: np.ndarray,
        sums: np.ndarray,
        scales: np.ndarray,
        query: np.ndarray,
        k: int,
        isa: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, keys)`` of the top ``min(k, N)`` rows for the padded int8 ``query``."""
        n, width = _check_padded(codes, sums)
        scales = _check_scales(scales, n)
        query = _check_query_codes(query, width)
        k = _check_k(k)
        idx = np.empty((min(k, n),), np.int64)
        keys = np.empty((min(k, n),), np.float32)
        got = self.lib.nexus_i8_topk(self.isa_id(isa), codes.ctypes.data, sums.ctypes.data,
                                     scales.ctypes.data, n, width, query.ctypes.data, k,
                                     idx.ctypes.data, keys.ctypes.data)
        _check_rc(got, "topk")
        return idx[:got], keys[:got]

    def bind(
        self, codes: np.ndarray, sums: np.ndarray, scales: np.ndarray, dim: int
    ) -> BoundScan:
        """Check the stored arrays once and return a fast searcher over them."""
        n, width = _check_padded(codes, sums)
        scales = _check_scales(scales, n)
        if not 0 < int(dim) <= width:
            raise ScanInputError(f"dim {dim} must be in [1, row width {width}]")
        return BoundScan(self, codes, sums, scales, int(dim))


class BoundScan:
    """The native search over fixed arrays (kept alive here); rebind after they change.

    ``search(query, k)`` quantizes the float32 ``query (dim,)`` in C, scans and returns
    ``(indices, scores, query_scale)``: the fused hot path, one ctypes call with one pointer.
    The query and result buffers live in this object, so a lock serialises searches (cheaper
    than fetching numpy addresses per call); concurrent searches are safe, just not parallel.
    """

    def __init__(
        self,
        native: NativeInt8Scan,
        codes: np.ndarray,
        sums: np.ndarray,
        scales: np.ndarray,
        dim: int,
    ) -> None:
        self.native = native
        self.arrays = (codes, sums, scales)  # keep the buffers alive while their addresses live
        self.n, self.width = codes.shape
        self.dim = dim
        self._query = np.zeros((dim,), np.float32)
        self._idx = np.zeros((0,), np.int64)
        self._scores = np.zeros((0,), np.float32)
        self._plan = _Plan(codes=codes.ctypes.data, sums=sums.ctypes.data,
                           scales=scales.ctypes.data, n=self.n, dim=dim, stride=self.width,
                           query=self._query.ctypes.data, k=1, isa=-1)
        self._resize(1)
        self._ref = ctypes.byref(self._plan)
        self._fn = native.lib.nexus_i8_search
        self._lock = threading.Lock()

    def _resize(self, m: int) -> None:
        """Make the result buffers hold exactly ``m`` entries (so results copy without a slice)."""
        self._idx = np.zeros((m,), np.int64)
        self._scores = np.zeros((m,), np.float32)
        self._plan.out_idx = self._idx.ctypes.data
        self._plan.out_score = self._scores.ctypes.data

    def search(
        self, query: np.ndarray, k: int, isa: str | None = None
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """``(indices (k',) int64, scores (k',) float32, query_scale)``, ``k' = min(k, N)``."""
        if k.__class__ is not int or k <= 0:
            k = _check_k(k)
        isa_id = -1 if isa is None else self.native.isa_id(isa)
        if (
            query.__class__ is not np.ndarray
            or query.shape != (self.dim,)
            or query.dtype.kind != "f"
        ):
            query = _check_float_query(query, self.dim)
        m = k if k < self.n else self.n
        with self._lock:
            self._query[...] = query  # float16/32/64 -> float32
            if self._idx.shape[0] != m:
                self._resize(m)
            plan = self._plan
            plan.k = k
            plan.isa = isa_id
            got = self._fn(self._ref)
            if got < 0:
                _check_rc(got, "search")
            assert got == m, "the library returns min(k, n) entries"
            return self._idx.copy(), self._scores.copy(), plan.out_qscale


def _check_rc(rc: int, what: str) -> None:
    if rc >= 0:
        return
    if rc == -2:
        raise ScanInputError(f"{what}: the query holds a non-finite value (NaN or inf)")
    reasons = {-1: "bad argument", -3: "ISA not available", -4: "out of memory"}
    raise ScanInputError(f"native {what} failed with code {rc} ({reasons.get(rc, 'unknown')})")


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or int(k) <= 0:
        raise ScanInputError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _check_padded(codes: np.ndarray, sums: np.ndarray) -> tuple[int, int]:
    if not isinstance(codes, np.ndarray) or codes.dtype != np.int8 or codes.ndim != 2:
        raise ScanInputError(f"codes must be a (N, W) int8 numpy array, got {_describe(codes)}")
    n, width = codes.shape
    if width == 0 or width % ALIGN or width > MAX_DIM or not codes.flags.c_contiguous:
        raise ScanInputError(
            f"codes of shape {codes.shape} must be C-contiguous with a row width that is a "
            f"positive multiple of {ALIGN} up to {MAX_DIM} (pad rows with zeros; padded_width)"
        )
    if (
        not isinstance(sums, np.ndarray)
        or sums.dtype != np.int32
        or sums.shape != (n,)
        or not sums.flags.c_contiguous
    ):
        raise ScanInputError(f"sums must be a contiguous ({n},) int32 array, got {_describe(sums)}")
    return int(n), int(width)


def _check_scales(scales: np.ndarray, n: int) -> np.ndarray:
    if (
        not isinstance(scales, np.ndarray)
        or scales.dtype != np.float32
        or scales.shape != (n,)
        or not scales.flags.c_contiguous
    ):
        raise ScanInputError(
            f"scales must be a contiguous ({n},) float32 array, got {_describe(scales)}"
        )
    return scales


def _check_query_codes(query: np.ndarray, width: int) -> np.ndarray:
    query = np.asarray(query)
    if query.dtype != np.int8 or query.shape != (width,):
        raise ScanInputError(f"query must be a ({width},) int8 array, got {_describe(query)}")
    if (query == -128).any():
        raise ScanInputError("query codes must lie in [-127, 127]; -128 found")
    return np.ascontiguousarray(query)


def _check_float_query(query: Any, dim: int) -> np.ndarray:
    """``query`` as a contiguous float32 ``(dim,)`` vector (a ``(1, dim)`` row is accepted)."""
    try:
        raw = np.asarray(query)
        if raw.dtype.kind not in "biuf":
            raise TypeError(f"dtype {raw.dtype} is not real-valued")
        q = np.ascontiguousarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ScanInputError(f"query must be a ({dim},) float vector: {exc}") from exc
    if q.ndim == 2 and q.shape[0] == 1:
        q = q[0]
    if q.shape != (dim,):
        raise ScanInputError(f"query has shape {q.shape}, but the buffer holds ({dim},) vectors")
    return q


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__


def source_digest() -> str | None:
    """First 16 hex digits of the SHA-256 of ``csrc/int8_scan.c`` (None if not shipped)."""
    try:
        return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nexus-mlx"


def compile_native(folder: Path | None = None, compiler: str | None = None) -> Path:
    """Compile ``csrc/int8_scan.c`` into ``folder`` (default :func:`cache_dir`), keyed by its
    source hash; return the library's path (reused if already built)."""
    digest = source_digest()
    if digest is None:
        raise _Unavailable(f"the source {SOURCE} is missing, so the library cannot be built")
    target = (cache_dir() if folder is None else Path(folder)) / f"int8_scan-{digest}.so"
    if target.is_file():
        return target
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise _Unavailable("no C compiler (cc/gcc) found to build the native scan")
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=target.parent)
        os.close(fd)
        cmd = [cc, *COMPILE_FLAGS, f'-DNEXUS_I8_SOURCE_ID="{digest}"', str(SOURCE), "-o", tmp,
               "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise _Unavailable(f"compiling {SOURCE.name} failed: {proc.stderr.strip()[-800:]}")
        os.replace(tmp, target)  # atomic: concurrent importers never see a partial file
        tmp = None
    except (OSError, subprocess.SubprocessError) as exc:
        raise _Unavailable(f"compiling {SOURCE.name} into {target.parent} failed: {exc}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_native(path: str | Path) -> NativeInt8Scan:
    """Load the library at ``path`` (raises ``OSError`` / :class:`ScanInputError` if unusable)."""
    lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    return NativeInt8Scan(lib, str(path))


def _find_native() -> tuple[NativeInt8Scan, str]:
    packaged = _PACKAGE_DIR / LIBRARY_NAME
    digest = source_digest()
    stale = ""
    if packaged.is_file():
        try:
            native = load_native(packaged)
        except (OSError, ScanInputError) as exc:
            stale = f"the packaged {packaged.name} is unusable ({exc}); "
        else:
            if digest is None or native.source_id == digest:
                return native, f"packaged library {packaged}"
            stale = f"the packaged {packaged.name} was built from another source; "
            try:
                return load_native(compile_native()), stale + "rebuilt into the cache"
            except (_Unavailable, OSError, ScanInputError) as exc:
                return native, stale + f"kept it, since rebuilding failed ({exc})"
    try:
        return load_native(compile_native()), stale + "compiled into the cache"
    except (OSError, ScanInputError) as exc:
        raise _Unavailable(f"{stale}loading the compiled library failed: {exc}") from exc


@functools.cache
def _native() -> tuple[NativeInt8Scan | None, NativeStatus]:
    if os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "no", "off"):
        return None, NativeStatus(False, f"disabled by {ENV_VAR}={os.environ[ENV_VAR]}")
    try:
        native, how = _find_native()
    except _Unavailable as exc:
        return None, NativeStatus(False, f"no native INT8 scan ({exc}); using numpy")
    return native, NativeStatus(True, how, native.path, native.isas, native.best)


def native_scan() -> NativeInt8Scan | None:
    """The native scan library (loaded, or compiled and loaded, on first use), or None."""
    return _native()[0]


def native_status() -> NativeStatus:
    """Why :func:`native_scan` is (not) available, and which ISAs it can run."""
    return _native()[1]


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
        raise ScanInputError(f"codes must be (N, W) int8, got {codes.dtype} {tuple(codes.shape)}")
    if query.dtype != mx.int8 or tuple(query.shape) != (codes.shape[1],):
        raise ScanInputError(
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
    k = _check_k(k)
    native = native_scan() if use_kernel else None
    if native is not None:
        return native.bind(codes, sums, scales, dim).search(query, k)
    q = _check_float_query(query, int(dim))
    return search_reference(codes, scales, q, k)


__all__ = [
    "ALIGN",
    "ISAS",
    "MAX_DIM",
    "BoundScan",
    "NativeInt8Scan",
    "NativeStatus",
    "ScanInputError",
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
    "topk_reference",
]
