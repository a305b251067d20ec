"""Building C sources into the cache: content-keyed reuse, clear errors, nothing partial left."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from nexus_mlx._platform import cbuild as _cbuild

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")),
                                reason="needs a C compiler")
FLAGS = ("-O2", "-fPIC", "-shared")


def test_builds_loads_and_reuses_by_content(tmp_path: Path) -> None:
    src = tmp_path / "add.c"
    src.write_text("int nexus_add(int a, int b) { return a + b; }\n")
    lib = _cbuild.build_shared_library(src, "add", FLAGS, folder=tmp_path / "out")
    assert lib.name == f"add-{_cbuild.source_digest(src)}.so"
    assert ctypes.CDLL(str(lib)).nexus_add(2, 3) == 5
    stamp = lib.stat().st_mtime_ns
    assert _cbuild.build_shared_library(src, "add", FLAGS, folder=tmp_path / "out") == lib
    assert lib.stat().st_mtime_ns == stamp  # reused, not rebuilt
    src.write_text("int nexus_add(int a, int b) { return a + b + 1; }\n")
    assert _cbuild.build_shared_library(src, "add", FLAGS, folder=tmp_path / "out") != lib


def test_compile_errors_are_one_readable_error_and_leave_nothing(tmp_path: Path) -> None:
    src = tmp_path / "bad.c"
    src.write_text("int broken( {\n")
    with pytest.raises(_cbuild.BuildError, match="compiling bad.c failed"):
        _cbuild.build_shared_library(src, "bad", FLAGS, folder=tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_source_and_missing_compiler(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(_cbuild.BuildError, match="cannot read the source"):
        _cbuild.build_shared_library(tmp_path / "nope.c", "nope", FLAGS, folder=tmp_path)
    src = tmp_path / "ok.c"
    src.write_text("int x;\n")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(_cbuild.shutil, "which", lambda name: None)
    with pytest.raises(_cbuild.BuildError, match="no C compiler"):
        _cbuild.build_shared_library(src, "ok", FLAGS, folder=tmp_path / "out")


def test_an_edited_local_header_gets_a_new_build(tmp_path: Path) -> None:
    """The cache key covers the headers a source includes with quotes from its folder (the
    attention kernels share simd_exp.h), not system headers."""
    header = tmp_path / "step.h"
    header.write_text("#define STEP 1\n")
    src = tmp_path / "inc.c"
    src.write_text('#include <stddef.h>\n#include "step.h"\nint nexus_inc(int a) { return a + STEP; }\n')
    lib = _cbuild.build_shared_library(src, "inc", FLAGS, folder=tmp_path / "out")
    assert ctypes.CDLL(str(lib)).nexus_inc(1) == 2
    header.write_text("#define STEP 5\n")
    rebuilt = _cbuild.build_shared_library(src, "inc", FLAGS, folder=tmp_path / "out")
    assert rebuilt != lib and ctypes.CDLL(str(rebuilt)).nexus_inc(1) == 6
    header.unlink()
    with pytest.raises(_cbuild.BuildError, match="cannot read the source"):
        _cbuild.build_shared_library(src, "inc", FLAGS, folder=tmp_path / "out")


class _Library:
    def __init__(self, path: str) -> None:
        self.path, self.isas, self.best = path, ("scalar",), "scalar"


def test_native_loader_loads_once_explains_failures_and_switches_off(monkeypatch) -> None:
    calls: list[int] = []

    def load() -> _Library:
        calls.append(1)
        return _Library("/lib.so")

    loader = _cbuild.NativeLoader("NEXUS_MLX_TEST_KERNEL", load, "test kernel")
    assert loader.library() is loader.library() and len(calls) == 1
    assert loader.status().loaded and loader.status().path == "/lib.so"
    assert not loader.switched_off
    with loader.disabled():
        with loader.disabled():
            assert loader.switched_off
        assert loader.switched_off
    assert not loader.switched_off
    monkeypatch.setenv("NEXUS_MLX_TEST_KERNEL", "off")
    assert loader.library() is not None  # the outcome is kept until cleared
    loader.cache_clear()
    assert loader.library() is None
    assert "disabled by NEXUS_MLX_TEST_KERNEL" in loader.status().reason

    def broken() -> _Library:
        raise _cbuild.BuildError("no C compiler (cc/gcc) found")

    failing = _cbuild.NativeLoader("NEXUS_MLX_TEST_OTHER", broken, "test kernel")
    assert failing.library() is None
    assert "no native test kernel (no C compiler" in failing.status().reason


def test_isa_exports_are_checked_and_read(tmp_path: Path) -> None:
    src = tmp_path / "isa.c"
    src.write_text(
        'int t_abi_version(void) { return 3; }\n'
        'const char *t_source_id(void) { return "abc"; }\n'
        'int t_isa_available(int isa) { return isa != 1; }\n'
        'int t_best_isa(void) { return 2; }\n')
    lib = ctypes.CDLL(str(_cbuild.build_shared_library(src, "isa", FLAGS, folder=tmp_path)))
    assert _cbuild.bind_isa_exports(lib, "t", 3, ("scalar", "avx512", "avx2"), "isa.so") == (
        "abc", ("scalar", "avx2"), "avx2")
    with pytest.raises(_cbuild.ArgumentError, match="isa.so has another ABI version than 4"):
        _cbuild.bind_isa_exports(lib, "t", 4, ("scalar",), "isa.so")
