"""The native CPU INT8 scan: ``csrc/int8_scan.c`` built as a shared library, loaded with ctypes.

Contract: the library computes exactly the scan specified in :mod:`nexus_mlx.kernels.int8_scan`
(its tests hold it to the numpy reference). It is built by ``setup.py`` at install
(``_int8_scan.so`` in the package) or, when missing or built from another source, compiled with
``cc`` into ``$XDG_CACHE_HOME/nexus-mlx/`` on first use. One binary holds a scalar, an AVX2, an
AVX-512 VNNI, a NEON and a NEON dot-product path, picked at run time by CPU feature checks; it
fuses quantization, scan and a size-k heap, so Python receives only k results. It wants rows
padded with zeros to a multiple of 64 bytes (:func:`padded_width`) and, for VNNI, per-row code
sums. :func:`native_scan` returns it, or None (``NEXUS_MLX_INT8_SCAN=0``, or no library and no
compiler); :func:`native_status` says why. This module knows nothing about MLX or tools.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nexus_mlx._platform import cbuild as _cbuild
from nexus_mlx.errors import ArgumentError, BuildError

ISAS = ("scalar", "avx2", "avx512vnni", "neon", "neondot")
ALIGN = 64
MAX_DIM = 65536
ABI_VERSION = 3
ENV_VAR = "NEXUS_MLX_INT8_SCAN"
LIBRARY_NAME = "_int8_scan.so"

_PACKAGE_DIR = Path(__file__).resolve().parent.parent / "_platform"  # csrc/ and the built library
SOURCE = _PACKAGE_DIR / "csrc" / "int8_scan.c"
COMPILE_FLAGS = ("-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-ffp-contract=off",
                 "-pthread")


def padded_width(dim: int) -> int:
    """Row width in bytes the native scan needs: ``dim`` rounded up to a multiple of 64."""
    return -(-int(dim) // ALIGN) * ALIGN


def aligned_rows(n: int, width: int) -> np.ndarray:
    """A zeroed, C-contiguous ``(n, width)`` int8 array whose data starts on a 64-byte line."""
    raw = np.zeros((n * width + ALIGN,), np.int8)
    offset = (-raw.ctypes.data) % ALIGN
    return raw[offset : offset + n * width].reshape(n, width)


@dataclass(frozen=True)
class NativeStatus:
    """Outcome of loading the native scan: ``loaded``, the library ``path``, the ``isas`` this
    CPU can run (fastest-first order of ``best``), and one sentence of ``reason``."""

    loaded: bool
    reason: str
    path: str | None = None
    isas: tuple[str, ...] = ()
    best: str | None = None


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
            raise ArgumentError(
                f"{path} has ABI version {self.abi_version}, this module needs {ABI_VERSION}"
            )
        lib.nexus_i8_plan_size.restype = _I64
        if int(lib.nexus_i8_plan_size()) != ctypes.sizeof(_Plan):
            raise ArgumentError(f"{path}: the plan struct's size differs from this module's")
        lib.nexus_i8_source_id.restype = ctypes.c_char_p
        lib.nexus_i8_best_isa.restype = ctypes.c_int
        lib.nexus_i8_isa_available.argtypes = [ctypes.c_int]
        lib.nexus_i8_isa_available.restype = ctypes.c_int
        lib.nexus_i8_quantize.argtypes = [ctypes.c_int, _P, _I64, _I64, _P, _P]
        lib.nexus_i8_quantize.restype = ctypes.c_int
        lib.nexus_i8_scores.argtypes = [ctypes.c_int, _P, _P, _I64, _I64, _P, _P]
        lib.nexus_i8_scores.restype = ctypes.c_int
        lib.nexus_i8_scores_mt.argtypes = [ctypes.c_int, _P, _P, _I64, _I64, _P, _P,
                                           ctypes.c_int]
        lib.nexus_i8_scores_mt.restype = ctypes.c_int
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
            raise ArgumentError(f"unknown ISA {isa!r}; choose one of {ISAS}")
        if isa not in self.isas:
            raise ArgumentError(f"ISA {isa!r} is not available on this CPU (have {self.isas})")
        return ISAS.index(isa)

    def quantize(
        self, x: np.ndarray, width: int | None = None, isa: str | None = None
    ) -> tuple[np.ndarray, float]:
        """Quantize one vector ``x (D,)`` in C with the quantizer of ``isa``: ``(codes (width,)
        int8 zero-padded, scale)``."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 1 or x.size == 0:
            raise ArgumentError(f"expected a non-empty (D,) vector, got shape {x.shape}")
        width = x.size if width is None else int(width)
        out = np.empty((width,), np.int8)
        scale = np.zeros((1,), np.float32)
        rc = self.lib.nexus_i8_quantize(self.isa_id(isa), x.ctypes.data, x.size, width,
                                        out.ctypes.data, scale.ctypes.data)
        _check_rc(rc, "quantize")
        return out, float(scale[0])

    def scores(
        self, codes: np.ndarray, sums: np.ndarray, query: np.ndarray, isa: str | None = None,
        threads: int = 1,
    ) -> np.ndarray:
        """int32 dots of padded ``codes (N, W)`` with the padded int8 ``query (W,)``, the rows
        split over up to ``threads`` threads (the same dots)."""
        n, width = _check_padded(codes, sums)
        query = _check_query_codes(query, width)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ArgumentError(f"threads must be a positive integer, got {threads!r}")
        out = np.empty((n,), np.int32)
        rc = self.lib.nexus_i8_scores_mt(self.isa_id(isa), codes.ctypes.data, sums.ctypes.data,
                                         n, width, query.ctypes.data, out.ctypes.data, threads)
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
        k = check_k(k)
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
            raise ArgumentError(f"dim {dim} must be in [1, row width {width}]")
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
            k = check_k(k)
        isa_id = -1 if isa is None else self.native.isa_id(isa)
        if (
            query.__class__ is not np.ndarray
            or query.shape != (self.dim,)
            or query.dtype.kind != "f"
        ):
            query = check_float_query(query, self.dim)
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
        raise ArgumentError(f"{what}: the query holds a non-finite value (NaN or inf)")
    reasons = {-1: "bad argument", -3: "ISA not available", -4: "out of memory"}
    raise ArgumentError(f"native {what} failed with code {rc} ({reasons.get(rc, 'unknown')})")


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or int(k) <= 0:
        raise ArgumentError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _check_padded(codes: np.ndarray, sums: np.ndarray) -> tuple[int, int]:
    if not isinstance(codes, np.ndarray) or codes.dtype != np.int8 or codes.ndim != 2:
        raise ArgumentError(f"codes must be a (N, W) int8 numpy array, got {_describe(codes)}")
    n, width = codes.shape
    if width == 0 or width % ALIGN or width > MAX_DIM or not codes.flags.c_contiguous:
        raise ArgumentError(
            f"codes of shape {codes.shape} must be C-contiguous with a row width that is a "
            f"positive multiple of {ALIGN} up to {MAX_DIM} (pad rows with zeros; padded_width)"
        )
    if (
        not isinstance(sums, np.ndarray)
        or sums.dtype != np.int32
        or sums.shape != (n,)
        or not sums.flags.c_contiguous
    ):
        raise ArgumentError(f"sums must be a contiguous ({n},) int32 array, got {_describe(sums)}")
    return int(n), int(width)


def _check_scales(scales: np.ndarray, n: int) -> np.ndarray:
    if (
        not isinstance(scales, np.ndarray)
        or scales.dtype != np.float32
        or scales.shape != (n,)
        or not scales.flags.c_contiguous
    ):
        raise ArgumentError(
            f"scales must be a contiguous ({n},) float32 array, got {_describe(scales)}"
        )
    return scales


def _check_query_codes(query: np.ndarray, width: int) -> np.ndarray:
    query = np.asarray(query)
    if query.dtype != np.int8 or query.shape != (width,):
        raise ArgumentError(f"query must be a ({width},) int8 array, got {_describe(query)}")
    if (query == -128).any():
        raise ArgumentError("query codes must lie in [-127, 127]; -128 found")
    return np.ascontiguousarray(query)


def check_float_query(query: Any, dim: int) -> np.ndarray:
    """``query`` as a contiguous float32 ``(dim,)`` vector (a ``(1, dim)`` row is accepted)."""
    try:
        raw = np.asarray(query)
        if raw.dtype.kind not in "biuf":
            raise TypeError(f"dtype {raw.dtype} is not real-valued")
        q = np.ascontiguousarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"query must be a ({dim},) float vector: {exc}") from exc
    if q.ndim == 2 and q.shape[0] == 1:
        q = q[0]
    if q.shape != (dim,):
        raise ArgumentError(f"query has shape {q.shape}, but the buffer holds ({dim},) vectors")
    return q


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__


def source_digest() -> str | None:
    """First 16 hex digits of the SHA-256 of ``csrc/int8_scan.c`` (None if not shipped)."""
    try:
        return _cbuild.source_digest(SOURCE)
    except OSError:
        return None


def cache_dir() -> Path:
    """Where a missing or stale library is compiled (``$XDG_CACHE_HOME/nexus-mlx``)."""
    return _cbuild.cache_dir()


def compile_native(folder: Path | None = None, compiler: str | None = None) -> Path:
    """Compile ``csrc/int8_scan.c`` into ``folder`` (default :func:`cache_dir`), keyed by its
    source hash; return the library's path (reused if already built)."""
    digest = source_digest()
    if digest is None:
        raise BuildError(f"the source {SOURCE} is missing, so the library cannot be built")
    flags = (*COMPILE_FLAGS, f'-DNEXUS_I8_SOURCE_ID="{digest}"')
    try:
        return _cbuild.build_shared_library(SOURCE, "int8_scan", flags, libraries=("-lm",),
                                            folder=folder, compiler=compiler)
    except BuildError as exc:
        raise BuildError(str(exc)) from exc


def load_native(path: str | Path) -> NativeInt8Scan:
    """Load the library at ``path`` (raises ``OSError`` / :class:`ArgumentError` if unusable)."""
    lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    return NativeInt8Scan(lib, str(path))


def _find_native() -> tuple[NativeInt8Scan, str]:
    packaged = _PACKAGE_DIR / LIBRARY_NAME
    digest = source_digest()
    stale = ""
    if packaged.is_file():
        try:
            native = load_native(packaged)
        except (OSError, ArgumentError) as exc:
            stale = f"the packaged {packaged.name} is unusable ({exc}); "
        else:
            if digest is None or native.source_id == digest:
                return native, f"packaged library {packaged}"
            stale = f"the packaged {packaged.name} was built from another source; "
            try:
                return load_native(compile_native()), stale + "rebuilt into the cache"
            except (BuildError, OSError, ArgumentError) as exc:
                return native, stale + f"kept it, since rebuilding failed ({exc})"
    try:
        return load_native(compile_native()), stale + "compiled into the cache"
    except (OSError, ArgumentError) as exc:
        raise BuildError(f"{stale}loading the compiled library failed: {exc}") from exc


@functools.cache
def _native() -> tuple[NativeInt8Scan | None, NativeStatus]:
    if os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "no", "off"):
        return None, NativeStatus(False, f"disabled by {ENV_VAR}={os.environ[ENV_VAR]}")
    try:
        native, how = _find_native()
    except BuildError as exc:
        return None, NativeStatus(False, f"no native INT8 scan ({exc}); using numpy")
    return native, NativeStatus(True, how, native.path, native.isas, native.best)


def native_scan() -> NativeInt8Scan | None:
    """The native scan library (loaded, or compiled and loaded, on first use), or None."""
    return _native()[0]


def native_status() -> NativeStatus:
    """Why :func:`native_scan` is (not) available, and which ISAs it can run."""
    return _native()[1]
