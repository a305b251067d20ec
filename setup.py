"""Build step for nexus-mlx: compile two plain shared libraries loaded with ctypes.

Contract: ``pip install .``, ``pip install -e .`` and wheel builds compile, inside the package
(plain shared libraries, not Python extension modules: no ``PyInit``, no ABI tag in the name):

- on Linux, ``nexus_mlx/_platform/csrc/blas_shim.c`` into ``nexus_mlx/_platform/_blas_shim.so``, the CBLAS forwarding
  shim loaded by ``nexus_mlx/_platform/blas.py`` (macOS uses Accelerate and needs none);
- on Linux and macOS, ``nexus_mlx/_platform/csrc/int8_scan.c`` into ``nexus_mlx/_platform/_int8_scan.so``, the native
  SLB scan loaded by ``nexus_mlx/kernels/int8_scan_native.py``. One binary holds every SIMD path (chosen
  at run time), so it is built for the baseline ISA. It is optional: if it fails to build, the
  install goes on and the library is compiled on first use into a cache folder, or numpy is used.
  It records the SHA-256 prefix of its source, so the loader can tell a stale build.

All other metadata lives in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM_MODULE = "nexus_mlx._platform._blas_shim"
SHIM_SOURCE = "nexus_mlx/_platform/csrc/blas_shim.c"
SCAN_MODULE = "nexus_mlx._platform._int8_scan"
SCAN_SOURCE = "nexus_mlx/_platform/csrc/int8_scan.c"
PLAIN_LIBRARIES = (SHIM_MODULE, SCAN_MODULE)


class BuildShim(build_ext):
    """build_ext that names the plain libraries ``<name>.so`` (no ABI tag: they do not use
    Python)."""

    def get_ext_filename(self, fullname: str) -> str:
        # Called with the dotted full name by some setuptools paths and with only the last
        # component by others; both map to the same relative path plus a bare ".so".
        for module in PLAIN_LIBRARIES:
            if fullname in (module, module.rsplit(".", 1)[1]):
                return os.path.join(*fullname.split(".")) + ".so"
        return str(super().get_ext_filename(fullname))


_LOCAL_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]+"([^"/]+)"', re.MULTILINE)


def _source_id(path: str) -> str:
    """The hash the loader compares: first 16 hex digits of the SHA-256 of the source and of the
    headers it includes with quotes from its own folder, in order (as
    ``nexus_mlx._platform.cbuild.source_digest`` computes it; this script cannot import it)."""
    source = Path(__file__).resolve().parent / path
    text = source.read_bytes()
    digest = hashlib.sha256(text)
    for name in _LOCAL_INCLUDE.findall(text):
        digest.update((source.parent / name.decode()).read_bytes())
    return digest.hexdigest()[:16]


ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            SHIM_MODULE,
            sources=[SHIM_SOURCE],
            depends=["nexus_mlx/_platform/csrc/skinny_gemm.h",
                     "nexus_mlx/_platform/csrc/native_rt.h"],
            define_macros=[("NEXUS_BLAS_SOURCE_ID", f'"{_source_id(SHIM_SOURCE)}"')],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread"],
            extra_link_args=["-pthread"],
        )
    )
if sys.platform.startswith("linux") or sys.platform == "darwin":
    ext_modules.append(
        Extension(
            SCAN_MODULE,
            sources=[SCAN_SOURCE],
            depends=["nexus_mlx/_platform/csrc/native_rt.h"],
            define_macros=[("NEXUS_I8_SOURCE_ID", f'"{_source_id(SCAN_SOURCE)}"')],
            extra_compile_args=["-O3", "-fvisibility=hidden", "-ffp-contract=off", "-pthread"],
            extra_link_args=["-pthread"],
            libraries=["m"],
            optional=True,  # the loader compiles it on first use, or falls back to numpy
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildShim})
