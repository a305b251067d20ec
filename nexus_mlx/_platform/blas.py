"""Make MLX's Linux CPU build use an optimized BLAS (OpenBLAS from ``scipy-openblas32``).

Contract: importing this module runs :func:`ensure_fast_blas` once and binds ``BLAS_STATUS``. On
Linux it loads OpenBLAS privately, hands the addresses of its ``scipy_cblas_{s,d,c}gemm`` to the
forwarding shim ``_blas_shim.so`` (source: ``csrc/blas_shim.c``), and then promotes the shim to
the process's global symbol scope. libmlx.so imports ``cblas_sgemm``/``cblas_dgemm``/
``cblas_cgemm`` as undefined symbols; the dynamic linker resolves them in the global scope before
mlx's own (reference, 30-50x slower) libblas, so every MLX CPU matmul in float32, float64 and
complex64 then runs on OpenBLAS. This works only if it happens *before* ``mlx.core`` is loaded.

One-row and one-column single-precision products (``m == 1`` or ``n == 1``: every projection of
a decode step) go to OpenBLAS's ``sgemv`` instead of ``sgemm``, which packs the whole weight
matrix for them (2-3x slower than one read of it); :func:`set_gemv_routing` turns that off and
on, ``NEXUS_MLX_GEMV=0`` keeps it off from the start. The product is the same either way (up to
float32 summation order).

Products with 2 to 6 rows against a weight matrix (``A @ W.T``: a forward of a few tokens, such
as the drafted tokens a decoder verifies) go to ``csrc/skinny_gemm.h`` on CPUs with AVX-512F
(2 to 4 rows with AVX2 + FMA only), which reads each weight row once instead of packing the
matrix (with AVX-512F prefetching the rows it reads next) and shares the rows over the cores:
the same product up to float32 summation order. :func:`set_skinny_routing` turns that off and on,
``NEXUS_MLX_SKINNY=0`` keeps it off from the start.

Products of 1 to 4 rows against a weight matrix that has a registered twin (``csrc/twin_gemm.h``:
the same float32 weights, rebuilt exactly from one-byte codes and per-block scales and offsets;
:mod:`nexus_mlx.kernels.weight_twins` builds and registers them) read the twin instead: a decode
step streams 1.25-1.5 bytes a weight instead of 4. Checked before the two routings above.
:func:`twin_register` / :func:`twin_unregister` / :func:`twin_count` manage the shim's table;
:func:`set_twin_routing` turns the reading off and on (``NEXUS_MLX_WEIGHT_TWINS=0``: off from
the start).

OpenBLAS's idle worker threads spin for 2^28 cycles (~0.1 s) after each call before they sleep;
the native CPU kernels that run between MLX's GEMMs (the blocked attention, the position softmax)
then share both cores with a spinning thread (in a probe, one attention call over 2,048 keys took
4.8 ms right after a GEMM against 2.3 ms without the spin). So ``OPENBLAS_THREAD_TIMEOUT`` is set
to ``THREAD_TIMEOUT`` (2^12 cycles, about a microsecond) before OpenBLAS is loaded, unless the
environment sets it already. Probes on SmolLM2 (2 cores, three interleaved processes each): a
1,024-token prefill 1.9-2.2 s instead of 2.4-2.5 s, a 64-row refresh at 2,048 keys 255-343 ms
instead of 360-380 ms, decode steps within the run-to-run noise.

``BlasStatus.core`` names the CPU core OpenBLAS chose kernels for, and ``reason`` says when the
environment named it (``OPENBLAS_CORETYPE``, which OpenBLAS obeys over its own detection and
which this module never changes). A core older than the CPU costs much: on a 2-core AMD Zen 5
with ``OPENBLAS_CORETYPE=Haswell`` (AVX2 kernels), SmolLM2's 1,024-token prefill took 2.35-2.54 s
against 1.38-1.40 s with the core OpenBLAS detects there (``SkylakeX``; float32, best of 3,
two rounds each).

Only the three GEMMs are forwarded. MLX's LAPACK calls (``mx.linalg`` factorizations) keep the
bundled reference LAPACK/BLAS: they are not on any hot path here, and forwarding ~20 Fortran
routines would add surface without speeding up matmul.

It never raises and never imports mlx. Outcomes:
  - not Linux, or ``NEXUS_MLX_BLAS=0``: nothing is loaded (status says why), no warning;
  - ``mlx.core`` already imported, OpenBLAS or the shim missing, or the shim not winning symbol
    resolution: a :class:`BlasWarning` is emitted and MLX keeps its reference BLAS.

If the packaged shim is missing (a source checkout that was never built), it is compiled once
with the system C compiler into ``$XDG_CACHE_HOME/nexus-mlx/`` (default ``~/.cache/nexus-mlx/``).
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from nexus_mlx._platform import cbuild as _cbuild
from nexus_mlx.errors import BuildError

__all__ = ["BLAS_STATUS", "BlasStatus", "BlasWarning", "ensure_fast_blas", "set_gemv_routing",
           "set_skinny_routing", "set_twin_avx2_only", "set_twin_routing", "shim_call_counts",
           "twin_count", "twin_encode", "twin_register", "twin_routing", "twin_unregister"]

ENV_VAR = "NEXUS_MLX_BLAS"
THREAD_TIMEOUT_ENV_VAR = "OPENBLAS_THREAD_TIMEOUT"
THREAD_TIMEOUT = "12"  # log2 of the cycles an idle OpenBLAS thread spins before it sleeps
GEMV_ENV_VAR = "NEXUS_MLX_GEMV"
SKINNY_ENV_VAR = "NEXUS_MLX_SKINNY"
TWINS_ENV_VAR = "NEXUS_MLX_WEIGHT_TWINS"
CORETYPE_ENV_VAR = "OPENBLAS_CORETYPE"
_PACKAGE_DIR = Path(__file__).resolve().parent
_SHIM_NAME = "_blas_shim.so"
_SHIM_SOURCE = _PACKAGE_DIR / "csrc" / "blas_shim.c"
_GEMMS = ("sgemm", "dgemm", "cgemm")
_SYMBOL_PREFIXES = ("scipy_", "")


class BlasWarning(UserWarning):
    """MLX will run on its slow reference BLAS; the message says why and what to do."""


@dataclass(frozen=True)
class BlasStatus:
    """Outcome of :func:`ensure_fast_blas`.

    ``loaded``: the shim is in the global scope and forwards MLX's GEMMs to ``library``.
    ``library``: path of the optimized BLAS library (None if none was loaded).
    ``shim``: path of the forwarding shim that was loaded (None if none).
    ``config``: the BLAS's own build description (e.g. OpenBLAS core and thread count), if known.
    ``reason``: one human-readable sentence explaining the outcome.
    ``core``: the CPU core OpenBLAS chose kernels for (``openblas_get_corename``), if known.
    ``gemv_routing``: whether one-row / one-column products went to sgemv when it loaded (the
    state now: :func:`set_gemv_routing`'s last answer).
    """

    loaded: bool
    library: str | None
    reason: str
    shim: str | None = None
    config: str | None = None
    gemv_routing: bool = False  # one-row/one-column sgemm computed by sgemv (at load time)
    skinny_routing: bool = False  # 2-6-row sgemm computed by skinny_gemm.h (at load time)
    core: str | None = None  # OpenBLAS's kernel family ("SkylakeX", "Haswell"...)
    twin_routing: bool = False  # 1-4-row sgemm read from registered weight twins (at load time)


_status: BlasStatus | None = None
_keep_alive: list[ctypes.CDLL] = []  # dlopen handles must outlive the process's use of them
_shim: ctypes.CDLL | None = None
_sgemv_address: int | None = None
_gemv_on = False
_skinny_on = False
_twins_on = False


def _off(value: str | None) -> bool:
    return (value or "").strip().lower() in ("0", "false", "no", "off")


def _disabled_by_env() -> bool:
    return _off(os.environ.get(ENV_VAR))


def _load_openblas() -> tuple[ctypes.CDLL, str, str]:
    """Load scipy-openblas32 privately; return (handle, path, symbol prefix)."""
    os.environ.setdefault(THREAD_TIMEOUT_ENV_VAR, THREAD_TIMEOUT)  # read once, when it loads
    try:
        import scipy_openblas32  # loads the library
    except ImportError as exc:
        raise BuildError(
            f"scipy-openblas32 is not installed ({exc}); `pip install scipy-openblas32`"
        ) from exc
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    try:
        path = lib_dir / scipy_openblas32.get_library(fullname=True)
    except (OSError, IndexError) as exc:
        raise BuildError(f"no OpenBLAS library found in {lib_dir}: {exc}") from exc
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    except OSError as exc:
        raise BuildError(f"could not load {path}: {exc}") from exc
    for prefix in _SYMBOL_PREFIXES:
        if hasattr(lib, f"{prefix}cblas_sgemm"):
            return lib, str(path), prefix
    raise BuildError(f"{path} exports no cblas_sgemm (tried prefixes {_SYMBOL_PREFIXES})")


def _openblas_string(lib: ctypes.CDLL, prefix: str, name: str) -> str | None:
    """What OpenBLAS's ``openblas_get_<name>`` says (``config``, ``corename``), if it has it."""
    try:
        fn = getattr(lib, f"{prefix}openblas_get_{name}")
    except AttributeError:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    raw = fn()
    return raw.decode(errors="replace").strip() if raw else None


def _core_source(core: str | None) -> str:
    """`` (core X, named by OPENBLAS_CORETYPE)`` when the environment chose OpenBLAS's kernels."""
    named = os.environ.get(CORETYPE_ENV_VAR, "").strip()
    return f" (core {core or named}, named by {CORETYPE_ENV_VAR})" if named else ""


def _compile_shim() -> Path:
    """Compile csrc/blas_shim.c into the user cache (keyed by the source hash); return its path."""
    if not _SHIM_SOURCE.is_file():
        raise BuildError(f"shim not built and its source {_SHIM_SOURCE} is missing")
    digest = _cbuild.source_digest(_SHIM_SOURCE)
    flags = ("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
             f'-DNEXUS_BLAS_SOURCE_ID="{digest}"')
    try:
        return _cbuild.build_shared_library(_SHIM_SOURCE, "blas_shim", flags, timeout=120)
    except BuildError as exc:
        raise BuildError(f"the shim is not built and building it failed: {exc}") from exc


def _built_from_current_source(path: Path) -> bool:
    """Whether the library at ``path`` says it was built from today's csrc/blas_shim.c (True when
    the source is not shipped: nothing to compare with)."""
    if not _SHIM_SOURCE.is_file():
        return True
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
        source_id = getattr(lib, "nexus_blas_source_id", None)
        if source_id is None:
            return False
        source_id.restype = ctypes.c_char_p
        return bool(source_id() == _cbuild.source_digest(_SHIM_SOURCE).encode())
    except OSError:
        return False


def _find_shim() -> Path:
    """The packaged shim when it is current, else one compiled from the source (a checkout whose
    build is older than its source must not run yesterday's shim)."""
    packaged = _PACKAGE_DIR / _SHIM_NAME
    if not packaged.is_file():
        return _compile_shim()
    if _built_from_current_source(packaged):
        return packaged
    try:
        return _compile_shim()
    except BuildError:  # no compiler: an older shim still forwards every GEMM
        return packaged


def _install_shim(openblas: ctypes.CDLL, prefix: str) -> str:
    """Load the shim, point it at OpenBLAS, promote it to global scope; return its path."""
    global _shim
    path = str(_find_shim())
    try:
        shim = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    except OSError as exc:
        raise BuildError(f"could not load the shim {path}: {exc}") from exc
    addresses = [_address(openblas, f"{prefix}cblas_{g}") for g in _GEMMS]
    shim.nexus_blas_init.argtypes = [ctypes.c_void_p] * 3
    shim.nexus_blas_init.restype = ctypes.c_int
    if shim.nexus_blas_init(*addresses) != 0:
        raise BuildError(f"{prefix}cblas_{{s,d,c}}gemm not all found in the BLAS library")
    # Re-opening the already-loaded object with RTLD_GLOBAL promotes it to the global scope.
    try:
        promoted = ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError as exc:
        raise BuildError(f"could not make the shim global: {exc}") from exc
    shim.nexus_blas_call_count.argtypes = [ctypes.c_int]
    shim.nexus_blas_call_count.restype = ctypes.c_longlong
    _keep_alive.extend([openblas, shim, promoted])
    _shim = shim
    global _sgemv_address
    if hasattr(shim, "nexus_blas_set_sgemv"):  # a shim built from an older source has none
        shim.nexus_blas_set_sgemv.argtypes = [ctypes.c_void_p]
        shim.nexus_blas_set_sgemv.restype = None
        _sgemv_address = _address(openblas, f"{prefix}cblas_sgemv")
    set_gemv_routing(not _off(os.environ.get(GEMV_ENV_VAR)))
    if hasattr(shim, "nexus_blas_set_skinny"):
        shim.nexus_blas_set_skinny.argtypes = [ctypes.c_int]
        shim.nexus_blas_set_skinny.restype = None
        set_skinny_routing(not _off(os.environ.get(SKINNY_ENV_VAR)))
    if hasattr(shim, "nexus_blas_set_twins"):
        _bind_twins(shim)
        set_twin_routing(not _off(os.environ.get(TWINS_ENV_VAR)))
    # Check the global scope now resolves cblas_sgemm to the shim (an LD_PRELOADed BLAS would win).
    process = ctypes.CDLL(None)
    for g in _GEMMS:
        if _address(process, f"cblas_{g}") != _address(shim, f"cblas_{g}"):
            raise BuildError(f"another cblas_{g} is already global (LD_PRELOAD?); shim unused")
    return path


def _address(lib: ctypes.CDLL, name: str) -> int | None:
    """Address of symbol ``name`` as seen through handle ``lib`` (None if absent)."""
    fn = getattr(lib, name, None)
    return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value


def _warn(message: str) -> None:
    warnings.warn(message, BlasWarning, stacklevel=3)


def ensure_fast_blas() -> BlasStatus:
    """Route MLX's CPU GEMMs to OpenBLAS if possible; return the (cached) outcome.

    Idempotent: the work is done on the first call only. Never raises; failures become a
    :class:`BlasWarning` and a status with ``loaded=False``.
    """
    global _status
    if _status is not None:
        return _status
    if not sys.platform.startswith("linux"):
        _status = BlasStatus(False, None, f"not needed on {sys.platform}: MLX uses Accelerate")
    elif _disabled_by_env():
        _status = BlasStatus(False, None, f"disabled by {ENV_VAR}={os.environ[ENV_VAR]}")
    elif "mlx.core" in sys.modules:
        reason = (
            "mlx.core was imported before nexus_mlx, so MLX already bound its reference BLAS; "
            "import nexus_mlx before mlx to get the optimized BLAS"
        )
        _warn(reason)
        _status = BlasStatus(False, None, reason)
    else:
        try:
            openblas, library, prefix = _load_openblas()
            shim = _install_shim(openblas, prefix)
            core = _openblas_string(openblas, prefix, "corename")
            _status = BlasStatus(
                True,
                library,
                "MLX CPU GEMMs forwarded to OpenBLAS" + _core_source(core),
                shim,
                _openblas_string(openblas, prefix, "config"),
                _gemv_on,
                _skinny_on,
                core,
                _twins_on,
            )
        except Exception as exc:  # never break `import nexus_mlx` over a speed-up
            reason = f"no optimized BLAS for MLX ({exc}); MLX CPU matmul will be slow"
            _warn(reason)
            _status = BlasStatus(False, None, reason)
    return _status


def set_gemv_routing(enabled: bool) -> bool:
    """Compute one-row / one-column ``sgemm`` calls with ``sgemv`` (``enabled``) or not; return
    whether routing is now on (False when the shim is not loaded or the library has no sgemv)."""
    global _gemv_on
    if _shim is None or _sgemv_address is None:
        return False
    _shim.nexus_blas_set_sgemv(_sgemv_address if enabled else None)
    _gemv_on = bool(enabled)
    return _gemv_on


def set_skinny_routing(enabled: bool) -> bool:
    """Compute ``sgemm`` calls of 2-6 rows against a transposed weight matrix with the
    shim's skinny kernel (``enabled``) or with OpenBLAS; return whether routing is now on (False
    when the shim is not loaded or predates the kernel; the kernel itself declines on CPUs
    without AVX2 + FMA)."""
    global _skinny_on
    if _shim is None or not hasattr(_shim, "nexus_blas_set_skinny"):
        return False
    _shim.nexus_blas_set_skinny(1 if enabled else 0)
    _skinny_on = bool(enabled)
    return _skinny_on


def _bind_twins(shim: ctypes.CDLL) -> None:
    """Argument types of the shim's twin table functions."""
    shim.nexus_blas_set_twins.argtypes = [ctypes.c_int]
    shim.nexus_blas_set_twins.restype = None
    shim.nexus_blas_twin_register.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                              ctypes.c_void_p]
    shim.nexus_blas_twin_register.restype = ctypes.c_int
    shim.nexus_blas_twin_unregister.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    shim.nexus_blas_twin_unregister.restype = ctypes.c_int
    shim.nexus_blas_twin_count.argtypes = []
    shim.nexus_blas_twin_count.restype = ctypes.c_int
    shim.nexus_blas_twin_encode.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                                            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_void_p]
    shim.nexus_blas_twin_encode.restype = ctypes.c_longlong
    shim.nexus_blas_twin_set_avx2_only.argtypes = [ctypes.c_int]
    shim.nexus_blas_twin_set_avx2_only.restype = None


def _twin_shim() -> ctypes.CDLL | None:
    return _shim if _shim is not None and hasattr(_shim, "nexus_blas_set_twins") else None


def set_twin_routing(enabled: bool) -> bool:
    """Read registered weight twins for products of 1-4 rows (``enabled``) or not; return whether
    that is now on (False when the shim is not loaded or predates twins)."""
    global _twins_on
    shim = _twin_shim()
    if shim is None:
        return False
    shim.nexus_blas_set_twins(1 if enabled else 0)
    _twins_on = bool(enabled)
    return _twins_on


def twin_routing() -> bool:
    """Whether products read registered weight twins (:func:`set_twin_routing`'s last answer)."""
    return _twins_on


def twin_register(src: int, n: int, k: int, block: int, codes: int, scale: int,
                  offset: int) -> bool:
    """Record in the shim that the float32 ``(n, k)`` matrix at address ``src`` equals the twin
    at ``codes`` / ``scale`` / ``offset`` (``csrc/twin_gemm.h`` gives the layout); False when
    the shim cannot take it (not loaded, table full, a shape it does not read). The caller keeps
    all four buffers alive until :func:`twin_unregister`."""
    shim = _twin_shim()
    if shim is None:
        return False
    return bool(shim.nexus_blas_twin_register(src, n, k, block, codes, scale, offset))


def twin_unregister(src: int, n: int, k: int) -> bool:
    """Forget the twin of the ``(n, k)`` matrix at ``src``; whether one was registered. Returns
    after any product reading it has finished."""
    shim = _twin_shim()
    return bool(shim is not None and shim.nexus_blas_twin_unregister(src, n, k))


def twin_encode(src: int, n: int, k: int, block: int, codes: int, scale: int,
                offset: int) -> int | None:
    """Fill the twin buffers at ``codes`` / ``scale`` / ``offset`` from the float32 ``(n, k)``
    matrix at ``src`` with the shim's encoder (``csrc/twin_gemm.h``); the number of blocks that
    are not an exact grid (0: a twin), or None when the shim has no encoder or declines (no
    x86-64 FMA, bad arguments)."""
    shim = _twin_shim()
    if shim is None:
        return None
    failed = int(shim.nexus_blas_twin_encode(src, n, k, block, codes, scale, offset))
    return None if failed < 0 else failed


def set_twin_avx2_only(on: bool) -> bool:
    """Make twin products take their AVX2 path even on an AVX-512F CPU (``on``; for tests that
    check both paths on one machine) or choose by CPU again; whether the shim took it."""
    shim = _twin_shim()
    if shim is None:
        return False
    shim.nexus_blas_twin_set_avx2_only(1 if on else 0)
    return True


def twin_count() -> int:
    """Matrices with a registered twin (0 without the shim)."""
    shim = _twin_shim()
    return int(shim.nexus_blas_twin_count()) if shim is not None else 0


def shim_call_counts() -> dict[str, int]:
    """Number of GEMM calls forwarded so far, e.g. ``{"sgemm": 3, "dgemm": 0, "cgemm": 0,
    "sgemm_as_sgemv": 2, "sgemm_as_skinny": 0, "sgemm_as_twin": 0}`` (the last three: sgemm
    calls of those computed by sgemv, by the skinny kernel, and from a weight twin).

    All zeros when the shim is not loaded.
    """
    names = (*_GEMMS, "sgemm_as_sgemv", "sgemm_as_skinny", "sgemm_as_twin")
    if _shim is None:
        return {g: 0 for g in names}
    return {g: max(0, int(_shim.nexus_blas_call_count(i))) for i, g in enumerate(names)}


BLAS_STATUS: BlasStatus = ensure_fast_blas()
