"""Tests for nexus_mlx._platform.blas: the CBLAS shim really routes MLX's CPU GEMMs, with correct results.

Every check runs in a fresh interpreter, because what matters is the order of imports and the
process-wide symbol resolution, both fixed at the first import. The child prints one JSON line
(or raises); the test asserts on it. No timing here: speed is bench/blas.py's job.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nexus_mlx"

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="shim is Linux-only")


def run_child(
    code: str, env_overrides: dict[str, str | None] | None = None, cwd: Path | None = None
) -> dict:
    """Run ``code`` in a fresh interpreter; return the JSON object on its last stdout line."""
    env = dict(os.environ)
    for key, value in (env_overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env.setdefault("NEXUS_MLX_BLAS", "1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Child prelude: nexus_mlx first, then mlx; helpers comparing one MLX CPU GEMM with numpy.
PRELUDE = """
import json
import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS, shim_call_counts
import mlx.core as mx
import numpy as np

rng = np.random.default_rng(0)

def rand(shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)

def m(x):
    # mx.array would turn float64 into float32; keep the numpy dtype.
    return mx.array(x, dtype=getattr(mx, x.dtype.name))

def cpu_matmul(a, b):
    out = mx.matmul(a, b, stream=mx.cpu)
    mx.eval(out)
    return np.array(out)

def cases(dtype):
    # (name, mlx a, mlx b, numpy expected); shapes M=37, K=23, N=19 keep every dim distinct.
    a, b = rand((37, 23), dtype), rand((23, 19), dtype)
    at, bt = rand((23, 37), dtype), rand((19, 23), dtype)
    wide_a, wide_b = rand((37, 50), dtype), rand((23, 41), dtype)
    batch_a, batch_b = rand((3, 37, 23), dtype), rand((3, 23, 19), dtype)
    yield "plain", m(a), m(b), a @ b
    yield "transposed_a", m(at).T, m(b), at.T @ b
    yield "transposed_b", m(a), m(bt).T, a @ bt.T
    yield "transposed_both", m(at).T, m(bt).T, at.T @ bt.T
    yield "sliced_cols", m(wide_a)[:, 5:28], m(wide_b)[:, 3:22], wide_a[:, 5:28] @ wide_b[:, 3:22]
    tall, wide = rand((74, 23), dtype), rand((23, 38), dtype)
    yield "strided_rows", m(tall)[::2], m(b), tall[::2] @ b
    yield "strided_cols", m(a), m(wide)[:, ::2], a @ wide[:, ::2]
    yield "batched", m(batch_a), m(batch_b), batch_a @ batch_b

def check(dtype, rtol, atol):
    # Names of the failing cases; every case and the addmm is one or more GEMM calls.
    failures = []
    for name, x, y, expected in cases(dtype):
        got = cpu_matmul(x, y)
        if got.dtype != expected.dtype or got.shape != expected.shape or not np.allclose(got, expected, rtol=rtol, atol=atol):
            failures.append(name)
    # addmm: alpha and beta must be forwarded too (beta = 0 everywhere else).
    a, b, c = rand((37, 23), dtype), rand((23, 19), dtype), rand((37, 19), dtype)
    out = mx.addmm(m(c), m(a), m(b), alpha=1.5, beta=-0.5, stream=mx.cpu)
    if not np.allclose(np.array(out), 1.5 * (a @ b) - 0.5 * c, rtol=rtol, atol=atol):
        failures.append("addmm")
    return failures
"""


@linux_only
@pytest.mark.parametrize(
    ("dtype", "gemm", "tol"),
    [("float32", "sgemm", 1e-4), ("float64", "dgemm", 1e-10), ("complex64", "cgemm", 1e-4)],
)
def test_gemm_matches_numpy_through_shim(dtype: str, gemm: str, tol: float) -> None:
    result = run_child(
        PRELUDE
        + f"""
before = shim_call_counts()["{gemm}"]
failures = check(np.{dtype}, rtol={tol}, atol={tol})
after = shim_call_counts()["{gemm}"]
print(json.dumps({{"loaded": BLAS_STATUS.loaded, "reason": BLAS_STATUS.reason,
                   "failures": failures, "calls": after - before,
                   "n_cases": len(list(cases(np.{dtype}))) + 1}}))
"""
    )
    assert result["loaded"], result["reason"]
    assert result["failures"] == [], f"{dtype} mismatches vs numpy: {result['failures']}"
    # Every case (and the addmm) must have reached OpenBLAS through the shim's forwarder.
    assert result["calls"] >= result["n_cases"], f"only {result['calls']} {gemm} calls via shim"


@linux_only
def test_one_row_and_one_column_products_are_routed_to_sgemv() -> None:
    # Every layout of a one-row (decode step) and a one-column product, with alpha/beta, equals
    # numpy with the routing on, and equals the same call with sgemm; each went through sgemv.
    result = run_child(
        PRELUDE
        + """
from nexus_mlx._platform.blas import set_gemv_routing

def thin_cases():
    for mm, k, n in ((1, 23, 19), (1, 1, 1), (37, 23, 1), (1, 23, 1)):
        a, b = rand((mm, k), np.float32), rand((k, n), np.float32)
        at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
        yield f"{mm}x{k}x{n} plain", m(a), m(b), a @ b
        yield f"{mm}x{k}x{n} transposed_a", m(at).T, m(b), a @ b
        yield f"{mm}x{k}x{n} transposed_b", m(a), m(bt).T, a @ b
        yield f"{mm}x{k}x{n} transposed_both", m(at).T, m(bt).T, a @ b
    wide = rand((23, 41), np.float32)
    yield "1x23x19 sliced_b", m(a := rand((1, 23), np.float32)), m(wide)[:, 3:22], a @ wide[:, 3:22]
    yield "37x23x1 sliced_b", m(t := rand((37, 23), np.float32)), m(wide)[:, 5:6], t @ wide[:, 5:6]
    rows = rand((3, 1, 23), np.float32), rand((3, 23, 19), np.float32)
    yield "batched rows", m(rows[0]), m(rows[1]), rows[0] @ rows[1]

failures, routed = [], []
for on in (True, False):
    assert set_gemv_routing(on) == on
    for name, x, y, expected in thin_cases():
        before = shim_call_counts()["sgemm_as_sgemv"]
        got = cpu_matmul(x, y)
        routed.append((on, shim_call_counts()["sgemm_as_sgemv"] - before))
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
            failures.append((on, name))
    set_gemv_routing(on)
    a, b, c = rand((1, 23), np.float32), rand((23, 19), np.float32), rand((1, 19), np.float32)
    out = np.array(mx.addmm(m(c), m(a), m(b), alpha=1.5, beta=-0.5, stream=mx.cpu))
    if not np.allclose(out, 1.5 * (a @ b) - 0.5 * c, rtol=1e-5, atol=1e-5):
        failures.append((on, "addmm"))
print(json.dumps({"loaded": BLAS_STATUS.loaded, "reason": BLAS_STATUS.reason,
                  "gemv": BLAS_STATUS.gemv_routing, "failures": failures, "routed": routed}))
"""
    )
    assert result["loaded"], result["reason"]
    assert result["gemv"] is True  # on by default
    assert result["failures"] == []
    on = [n for flag, n in result["routed"] if flag]
    off = [n for flag, n in result["routed"] if not flag]
    assert all(n >= 1 for n in on), on
    assert all(n == 0 for n in off), off


@linux_only
def test_gemv_routing_can_be_off_from_the_start() -> None:
    result = run_child(
        PRELUDE
        + """
x, w = m(rand((1, 23), np.float32)), m(rand((23, 19), np.float32))
cpu_matmul(x, w)
print(json.dumps({"routed": shim_call_counts()["sgemm_as_sgemv"],
                  "sgemm": shim_call_counts()["sgemm"], "status": BLAS_STATUS.gemv_routing}))
""",
        {"NEXUS_MLX_GEMV": "0"},
    )
    assert result["routed"] == 0 and result["sgemm"] >= 1 and result["status"] is False


CORE_PROBE = """
import json
import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS
print(json.dumps({"core": BLAS_STATUS.core, "reason": BLAS_STATUS.reason}))
"""


@linux_only
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="Haswell is an x86 core")
def test_the_status_names_the_core_and_says_when_the_environment_chose_it() -> None:
    named = run_child(CORE_PROBE, {"OPENBLAS_CORETYPE": "Haswell"})
    assert named["core"] == "Haswell"
    assert named["reason"].endswith("(core Haswell, named by OPENBLAS_CORETYPE)")
    detected = run_child(CORE_PROBE, {"OPENBLAS_CORETYPE": None})
    assert detected["core"] and "OPENBLAS_CORETYPE" not in detected["reason"]


@linux_only
def test_shim_wins_global_symbol_resolution() -> None:
    result = run_child(
        """
import ctypes, json
import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS
process = ctypes.CDLL(None)
shim = ctypes.CDLL(BLAS_STATUS.shim)
same = all(
    ctypes.cast(getattr(process, n), ctypes.c_void_p).value
    == ctypes.cast(getattr(shim, n), ctypes.c_void_p).value
    for n in ("cblas_sgemm", "cblas_dgemm", "cblas_cgemm")
)
print(json.dumps({"loaded": BLAS_STATUS.loaded, "library": BLAS_STATUS.library, "same": same}))
"""
    )
    assert result["loaded"]
    assert "openblas" in result["library"].lower()
    assert result["same"]


@linux_only
def test_mlx_imported_first_warns_and_stays_unloaded() -> None:
    result = run_child(
        """
import json, warnings
import mlx.core
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS, BlasWarning
hits = [str(w.message) for w in caught if issubclass(w.category, BlasWarning)]
print(json.dumps({"loaded": BLAS_STATUS.loaded, "warnings": hits}))
"""
    )
    assert not result["loaded"]
    assert len(result["warnings"]) == 1
    assert "before mlx" in result["warnings"][0]


@linux_only
def test_env_var_disables_without_warning() -> None:
    result = run_child(
        """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS, BlasWarning, shim_call_counts
import mlx.core as mx
mx.eval(mx.matmul(mx.ones((8, 8)), mx.ones((8, 8)), stream=mx.cpu))
print(json.dumps({"loaded": BLAS_STATUS.loaded, "shim": BLAS_STATUS.shim,
                  "reason": BLAS_STATUS.reason, "calls": shim_call_counts()["sgemm"],
                  "warned": any(issubclass(w.category, BlasWarning) for w in caught)}))
""",
        {"NEXUS_MLX_BLAS": "0"},
    )
    assert not result["loaded"]
    assert result["shim"] is None
    assert "NEXUS_MLX_BLAS" in result["reason"]
    assert result["calls"] == 0
    assert not result["warned"]


@linux_only
def test_ensure_fast_blas_is_idempotent() -> None:
    result = run_child(
        """
import json
import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS, ensure_fast_blas
print(json.dumps({"same": ensure_fast_blas() is BLAS_STATUS and ensure_fast_blas() is BLAS_STATUS}))
"""
    )
    assert result["same"]


@linux_only
def test_missing_openblas_warns_and_import_still_works() -> None:
    result = run_child(
        """
import json, sys, warnings
sys.modules["scipy_openblas32"] = None  # makes `import scipy_openblas32` fail
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS, BlasWarning
import mlx.core as mx
total = mx.matmul(mx.ones((4, 4)), mx.ones((4, 4)), stream=mx.cpu).sum().item()
hits = [str(w.message) for w in caught if issubclass(w.category, BlasWarning)]
print(json.dumps({"loaded": BLAS_STATUS.loaded, "warnings": hits, "total": total}))
"""
    )
    assert not result["loaded"]
    assert len(result["warnings"]) == 1 and "scipy-openblas32" in result["warnings"][0]
    assert result["total"] == 64.0


@linux_only
@pytest.mark.skipif(shutil.which("cc") is None, reason="no system C compiler")
def test_unbuilt_checkout_compiles_shim_into_cache(tmp_path: Path) -> None:
    shutil.copytree(
        PACKAGE, tmp_path / "nexus_mlx", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    code = """
import json
import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS
print(json.dumps({"loaded": BLAS_STATUS.loaded, "shim": BLAS_STATUS.shim}))
"""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": None}
    first = run_child(code, env, cwd=tmp_path)
    second = run_child(code, env, cwd=tmp_path)
    assert first["loaded"]
    assert first["shim"].startswith(str(tmp_path / "cache" / "nexus-mlx"))
    assert second["shim"] == first["shim"]  # reused, keyed by the source hash


@linux_only
@pytest.mark.skipif(shutil.which("cc") is None, reason="no system C compiler")
def test_a_build_older_than_its_source_is_replaced_by_a_fresh_one(tmp_path: Path) -> None:
    # A checkout whose packaged shim was built from another source (here: one without the source
    # hash) runs a shim compiled from today's source, not the stale one.
    shutil.copytree(
        PACKAGE, tmp_path / "nexus_mlx", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    stale = tmp_path / "nexus_mlx" / "_platform" / "_blas_shim.so"
    source = tmp_path / "nexus_mlx" / "_platform" / "csrc" / "blas_shim.c"
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", str(source), "-o",
                    str(stale)], check=True, timeout=120)
    result = run_child(
        """
import json
import nexus_mlx
from nexus_mlx._platform.blas import BLAS_STATUS
print(json.dumps({"loaded": BLAS_STATUS.loaded, "shim": BLAS_STATUS.shim}))
""",
        {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": None},
        cwd=tmp_path,
    )
    assert result["loaded"]
    assert result["shim"].startswith(str(tmp_path / "cache" / "nexus-mlx"))


@linux_only
def test_few_row_products_are_routed_to_the_skinny_kernel() -> None:
    # A @ W.T with 2-6 rows of A, with k tails, n tails and alpha/beta, equals numpy and the
    # same call on OpenBLAS; past 6 rows (4 without AVX-512F), with few columns instead of few
    # rows, with W not transposed or narrow, OpenBLAS computes it.
    result = run_child(
        PRELUDE
        + """
from nexus_mlx._platform.blas import set_skinny_routing

def few_row_cases():  # (name, x, y, expected, rows of A if the kernel may take it)
    for rows in (2, 3, 4, 5, 6):
        for k, n in ((64, 64), (37, 101), (576, 130), (15, 67)):
            a, w = rand((rows, k), np.float32), rand((n, k), np.float32)
            yield f"{rows}x{k}x{n}", m(a), m(w).T, a @ w.T, rows
            yield f"{rows}x{k}x{n} few columns", m(w), m(a).T, w @ a.T, None
    a, w = rand((7, 64), np.float32), rand((80, 64), np.float32)
    yield "7 rows", m(a), m(w).T, a @ w.T, None
    a, w = rand((6, 600), np.float32), rand((3000, 600), np.float32)  # shared over threads
    yield "6x600x3000", m(a), m(w).T, a @ w.T, 6
    a, w = rand((3, 64), np.float32), rand((64, 80), np.float32)
    yield "w not transposed", m(a), m(w), a @ w, None
    a, w = rand((3, 64), np.float32), rand((40, 64), np.float32)
    yield "narrow w", m(a), m(w).T, a @ w.T, None

avx2 = __import__("platform").machine() == "x86_64"
failures, routed = [], []
for on in (True, False):
    assert set_skinny_routing(on) == on
    for name, x, y, expected, eligible in few_row_cases():
        before = shim_call_counts()["sgemm_as_skinny"]
        got = cpu_matmul(x, y)
        routed.append((on, eligible, shim_call_counts()["sgemm_as_skinny"] - before))
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
            failures.append((on, name))
    a, w, c = rand((3, 96), np.float32), rand((70, 96), np.float32), rand((3, 70), np.float32)
    out = np.array(mx.addmm(m(c), m(a), m(w).T, alpha=1.5, beta=-0.5, stream=mx.cpu))
    if not np.allclose(out, 1.5 * (a @ w.T) - 0.5 * c, rtol=1e-4, atol=1e-4):
        failures.append((on, "addmm"))
print(json.dumps({"loaded": BLAS_STATUS.loaded, "reason": BLAS_STATUS.reason,
                  "skinny": BLAS_STATUS.skinny_routing, "failures": failures, "routed": routed,
                  "x86": avx2}))
"""
    )
    assert result["loaded"], result["reason"]
    assert result["skinny"] is True  # on by default
    assert result["failures"] == []
    assert all(n == 0 for on, rows, n in result["routed"] if not on or rows is None)
    with open("/proc/cpuinfo") as f:
        flags = f.read() if result["x86"] else ""
    most = 6 if " avx512f " in flags else 4 if " avx2 " in flags else 0
    eligible_on = [(rows, n) for on, rows, n in result["routed"] if on and rows is not None]
    assert all(n == (1 if rows <= most else 0) for rows, n in eligible_on), eligible_on


@linux_only
def test_skinny_routing_can_be_off_from_the_start() -> None:
    result = run_child(
        PRELUDE
        + """
a, w = rand((3, 64), np.float32), rand((80, 64), np.float32)
got = cpu_matmul(m(a), m(w).T)
print(json.dumps({"skinny": BLAS_STATUS.skinny_routing, "ok": bool(np.allclose(got, a @ w.T, atol=1e-4)),
                  "routed": shim_call_counts()["sgemm_as_skinny"]}))
""",
        {"NEXUS_MLX_SKINNY": "0"},
    )
    assert result == {"skinny": False, "ok": True, "routed": 0}
