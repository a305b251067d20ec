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
