"""Build step for nexus-mlx: compile the CBLAS forwarding shim (Linux only).

Contract: on Linux, ``pip install .``, ``pip install -e .`` and wheel builds compile
``nexus_mlx/csrc/blas_shim.c`` into ``nexus_mlx/_blas_shim.so`` inside the package (a plain shared
library, not a Python extension module: it has no ``PyInit`` and is loaded with ctypes by
``nexus_mlx/_blas.py``). Elsewhere (macOS uses Accelerate) nothing is compiled. All other metadata
lives in pyproject.toml.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM_MODULE = "nexus_mlx._blas_shim"


class BuildShim(build_ext):
    """build_ext that names the shim ``_blas_shim.so`` (no ABI tag: it does not use Python)."""

    def get_ext_filename(self, fullname: str) -> str:
        # Called with the dotted full name by some setuptools paths and with only the last
        # component by others; both map to the same relative path plus a bare ".so".
        if fullname in (SHIM_MODULE, SHIM_MODULE.rsplit(".", 1)[1]):
            return os.path.join(*fullname.split(".")) + ".so"
        return str(super().get_ext_filename(fullname))


ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            SHIM_MODULE,
            sources=["nexus_mlx/csrc/blas_shim.c"],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildShim})
