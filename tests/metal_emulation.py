"""Run an MLX custom-kernel body on the CPU by compiling it with g++: a test harness.

This emulates a kernel's *logic* (index arithmetic, bounds guards, dtype conversions, float
rounding) on the CPU. It is not Metal and not CUDA: threads run one after another, so barriers,
threadgroup memory, SIMD-group functions and atomics are unsupported, races cannot show, and
the GPU compilers' freedom to contract ``a * b + c`` into an fma is not reproduced (we compile
with ``-ffp-contract=off``).

Contract:
- :func:`emulated_metal_kernel` / :func:`emulated_cuda_kernel` take the same arguments as
  ``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel`` and return a callable taking the same
  keywords as the real kernel (``inputs, output_shapes, output_dtypes, grid, threadgroup,
  template, init_value``); inputs may be ``mx.array`` or numpy arrays; it returns numpy arrays.
- A Metal body is compiled after ``#include "metal_shim.h"`` (``metal_kernels/``: address-space
  qualifiers as empty macros, ``half`` as ``_Float16``, ``uint3``), inside a function whose
  signature is generated as MLX generates it (``const device T* x``, ``x_shape``,
  ``x_strides``, ``x_ndim`` when the body names them). ``main`` loops over the grid (in
  threadgroups, launching exactly ``grid`` threads as ``dispatchThreads`` does) and supplies
  ``thread_position_in_grid`` and the other thread-position attributes.
- A CUDA body gets a small inline shim (``blockIdx``/``threadIdx``/``blockDim``/``gridDim``,
  ``__half`` as ``_Float16``, the ``__f*_rn`` intrinsics, ``Shape``/``Strides``) and, as MLX
  launches it, whole blocks: ``ceil(grid / threadgroup)`` of them, so guards are exercised.
- Type template arguments are compile-time typedefs. Integer and boolean template arguments are
  passed at run time as ``static`` globals unless ``bake_template=True`` (then ``constexpr``, as
  MLX does, at one build per value); run-time values keep the number of g++ builds small.
- Each translation unit is built once per content hash (source, shim, flags, compiler) into a
  cache folder (``$NEXUS_MLX_EMULATION_CACHE`` or ``<tmp>/nexus_mlx_emulation_<uid>``) and run
  as an executable that reads and writes raw binary files. ``sanitize=True`` builds with
  AddressSanitizer and UBSan (when they link), so an out-of-bounds read or write in the body
  fails the run. Outputs start as all-ones bytes (NaN for floats) unless ``init_value`` is
  given, so elements a kernel forgets to write do not look like zeros.

It knows nothing about what the kernels compute. Importing it needs no compiler;
:func:`compiler_available` says whether g++ is on PATH.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.kernels import metal_kernels_dir

DIALECTS = ("metal", "cuda")
BASE_FLAGS = ("-O1", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-w")
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer")
_MAX_NDIM = 8

# numpy dtype -> C type per dialect (MLX's names for Metal; MLX's cuda types for CUDA).
_C_TYPES: dict[str, dict[str, str]] = {
    "metal": {"float32": "float", "float16": "float16_t", "int32": "int", "uint32": "uint",
              "int64": "int64_t", "uint64": "uint64_t", "int16": "int16_t", "uint16": "uint16_t",
              "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"},
    "cuda": {"float32": "float", "float16": "__half", "int32": "int32_t", "uint32": "uint32_t",
             "int64": "int64_t", "uint64": "uint64_t", "int16": "int16_t", "uint16": "uint16_t",
             "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"},
}
_MX_TO_NP = {mx.float32: np.float32, mx.float16: np.float16, mx.int32: np.int32,
             mx.uint32: np.uint32, mx.int64: np.int64, mx.uint64: np.uint64,
             mx.int16: np.int16, mx.uint16: np.uint16, mx.int8: np.int8, mx.uint8: np.uint8,
             mx.bool_: np.bool_}

_METAL_ATTRS = ("thread_position_in_grid", "thread_position_in_threadgroup",
                "threadgroup_position_in_grid", "threads_per_threadgroup",
                "threadgroups_per_grid")

_CUDA_SHIM = r"""
// Inline CUDA shim for the g++ emulation (not CUDA): just what nexus-mlx bodies use.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
struct nexus_dim3 { unsigned x, y, z; };
static nexus_dim3 threadIdx, blockIdx, blockDim, gridDim;
typedef _Float16 __half;
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
using Shape = std::array<int32_t, 8>;
using Strides = std::array<int64_t, 8>;
"""

_PRELUDE = """\
// Generated by metal_emulation; a CPU emulation, not GPU code.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
"""

_IO_HELPERS = r"""
static long long nexus_next(FILE* m) {
  long long v = 0;
  if (std::fscanf(m, "%lld", &v) != 1) { std::fprintf(stderr, "bad meta\n"); std::exit(3); }
  return v;
}
static double nexus_next_double(FILE* m) {
  double v = 0;
  if (std::fscanf(m, "%lf", &v) != 1) { std::fprintf(stderr, "bad meta\n"); std::exit(3); }
  return v;
}
static unsigned char* nexus_read(const char* dir, const char* name, size_t n) {
  char path[4096];
  std::snprintf(path, sizeof path, "%s/%s", dir, name);
  unsigned char* p = new unsigned char[n];
  FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(3); }
  if (n && std::fread(p, 1, n, f) != n) { std::fprintf(stderr, "short %s\n", path); std::exit(3); }
  std::fclose(f);
  return p;
}
static void nexus_write(const char* dir, const char* name, const unsigned char* p, size_t n) {
  char path[4096];
  std::snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = std::fopen(path, "wb");
  if (!f) { std::perror(path); std::exit(3); }
  if (n && std::fwrite(p, 1, n, f) != n) { std::fprintf(stderr, "short %s\n", path); std::exit(3); }
  std::fclose(f);
}
"""


class EmulationError(RuntimeError):
    """The emulated kernel failed to compile or to run (compiler or sanitizer output inside)."""


def compiler() -> str | None:
    """Path of g++, or None."""
    return shutil.which("g++")


def compiler_available() -> bool:
    return compiler() is not None


@functools.cache
def _compiler_id() -> str:
    exe = compiler()
    if exe is None:
        raise EmulationError("g++ is not on PATH; the Metal emulation needs it")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0] if out.stdout else exe


@functools.cache
def sanitizers_available() -> bool:
    """AddressSanitizer and UBSan compile, link and run here."""
    exe = compiler()
    if exe is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text("int main() { int* p = new int[2]; p[1] = 1; int r = p[1] - 1; "
                       "delete[] p; return r; }\n")
        binary = Path(tmp) / "probe"
        built = subprocess.run([exe, *SANITIZE_FLAGS, str(src), "-o", str(binary)],
                               capture_output=True)
        if built.returncode != 0:
            return False
        ran = subprocess.run([str(binary)], capture_output=True, env=_run_env())
        return ran.returncode == 0


def cache_dir() -> Path:
    env = os.environ.get("NEXUS_MLX_EMULATION_CACHE")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = Path(env) if env else Path(tempfile.gettempdir()) / f"nexus_mlx_emulation_{uid}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _run_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    return env


def _np_dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, mx.Dtype):
        if dtype not in _MX_TO_NP:
            raise EmulationError(f"dtype {dtype} has no numpy counterpart to emulate with")
        return np.dtype(_MX_TO_NP[dtype])
    return np.dtype(dtype)


def _c_type(dtype: Any, dialect: str) -> str:
    name = _np_dtype(dtype).name
    if name not in _C_TYPES[dialect]:
        raise EmulationError(f"dtype {name} is not supported by the {dialect} emulation")
    return _C_TYPES[dialect][name]


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, mx.array):
        return np.array(x)
    if isinstance(x, bool):
        return np.array(x, dtype=np.bool_)
    if isinstance(x, int):
        return np.array(x, dtype=np.int32)  # MLX makes Python ints int32 arrays
    if isinstance(x, float):
        return np.array(x, dtype=np.float32)
    return np.asarray(x)


class EmulatedKernel:
    """A kernel body compiled with g++ for the CPU; call it like an MLX custom kernel."""

    def __init__(
        self,
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str,
        header: str = "",
        *,
        dialect: str = "metal",
        source_name: str | None = None,
    ) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"dialect {dialect!r} is not one of {DIALECTS}")
        if not output_names:
            raise ValueError("an emulated kernel needs at least one output")
        self.name = name
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.source = source
        self.header = header
        self.dialect = dialect
        self.source_name = source_name or f"{name}.body"

    # ---- code generation ----------------------------------------------------------------
    def translation_unit(
        self,
        inputs: Sequence[np.ndarray],
        output_dtypes: Sequence[np.dtype],
        template: Sequence[tuple[str, Any]],
        bake_template: bool,
    ) -> str:
        """The C++ source: shim, template arguments, the body as a function, and ``main``."""
        d = self.dialect
        out = [_PRELUDE]
        out.append('#include "metal_shim.h"\n' if d == "metal" else _CUDA_SHIM)
        runtime: list[tuple[str, str]] = []
        for tname, value in template:
            if isinstance(value, mx.Dtype | np.dtype | type):
                out.append(f"typedef {_c_type(value, d)} {tname};\n")
            elif isinstance(value, bool | np.bool_):
                if bake_template:
                    out.append(f"constexpr bool {tname} = {'true' if value else 'false'};\n")
                else:
                    out.append(f"static bool {tname} = false;\n")
                    runtime.append((tname, "bool"))
            elif isinstance(value, int | np.integer):
                if bake_template:
                    out.append(f"constexpr int {tname} = {int(value)};\n")
                else:
                    out.append(f"static int {tname} = 0;\n")
                    runtime.append((tname, "int"))
            else:
                raise EmulationError(f"template argument {tname}={value!r} is not a dtype/int/bool")
        out.append(self.header + "\n")

        params: list[str] = []
        args: list[str] = []
        setup: list[str] = []
        for i, (nm, arr) in enumerate(zip(self.input_names, inputs, strict=True)):
            ct = _c_type(arr.dtype, d)
            setup.append(f"  size_t in{i}_n = (size_t)nexus_next(m);\n"
                         f"  int in{i}_ndim = (int)nexus_next(m);\n")
            shape_t = "int" if d == "metal" else "int32_t"
            setup.append(f"  {'Shape' if d == 'cuda' else 'std::array<int, 8>'} in{i}_shape{{}};\n"
                         f"  {'Strides' if d == 'cuda' else 'std::array<int64_t, 8>'} in{i}_strides{{}};\n"
                         f"  for (int k = 0; k < in{i}_ndim; ++k) in{i}_shape[k] = ({shape_t})nexus_next(m);\n"
                         f"  for (int k = 0; k < in{i}_ndim; ++k) in{i}_strides[k] = nexus_next(m);\n"
                         f"  unsigned char* in{i} = nexus_read(dir, \"in{i}.bin\", in{i}_n);\n")
            if arr.ndim == 0:
                if d == "metal":
                    params.append(f"const constant {ct}& {nm}")
                    args.append(f"*reinterpret_cast<const {ct}*>(in{i})")
                else:
                    params.append(f"const {ct}* {nm}")
                    args.append(f"reinterpret_cast<const {ct}*>(in{i})")
                continue
            if d == "metal":
                params.append(f"const device {ct}* {nm}")
            else:
                params.append(f"const {ct}* {nm}")
            args.append(f"reinterpret_cast<const {ct}*>(in{i})")
            if f"{nm}_shape" in self.source:
                params.append(f"const constant int* {nm}_shape" if d == "metal"
                              else f"const Shape {nm}_shape")
                args.append(f"in{i}_shape.data()" if d == "metal" else f"in{i}_shape")
            if f"{nm}_strides" in self.source:
                params.append(f"const constant int64_t* {nm}_strides" if d == "metal"
                              else f"const Strides {nm}_strides")
                args.append(f"in{i}_strides.data()" if d == "metal" else f"in{i}_strides")
            if f"{nm}_ndim" in self.source:
                params.append(f"const constant int& {nm}_ndim" if d == "metal"
                              else f"const int {nm}_ndim")
                args.append(f"in{i}_ndim")
        for j, (nm, dt) in enumerate(zip(self.output_names, output_dtypes, strict=True)):
            ct = _c_type(dt, d)
            params.append(f"device {ct}* {nm}" if d == "metal" else f"{ct}* {nm}")
            args.append(f"reinterpret_cast<{ct}*>(out{j})")
            setup.append(
                f"  size_t out{j}_n = (size_t)nexus_next(m);\n"
                f"  int out{j}_init = (int)nexus_next(m);\n"
                f"  double out{j}_value = nexus_next_double(m);\n"
                f"  unsigned char* out{j} = new unsigned char[out{j}_n];\n"
                f"  if (out{j}_init) {{\n"
                f"    for (size_t k = 0; k < out{j}_n / sizeof({ct}); ++k)\n"
                f"      reinterpret_cast<{ct}*>(out{j})[k] = static_cast<{ct}>(out{j}_value);\n"
                f"  }} else {{\n"
                f"    std::memset(out{j}, 0xFF, out{j}_n);\n"
                f"  }}\n")
        if d == "metal":
            params += [f"uint3 {a}" for a in _METAL_ATTRS]

        out.append("static void nexus_emu_body(\n    " + ",\n    ".join(params) + ") {\n")
        out.append(f'#line 1 "{self.source_name}"\n')
        out.append(self.source)
        out.append("\n}\n")
        out.append(_IO_HELPERS)

        main = ["int main(int argc, char** argv) {\n",
                "  if (argc != 2) { std::fprintf(stderr, \"usage: emu DIR\\n\"); return 3; }\n",
                "  const char* dir = argv[1];\n",
                "  char meta_path[4096];\n",
                "  std::snprintf(meta_path, sizeof meta_path, \"%s/meta.txt\", dir);\n",
                "  FILE* m = std::fopen(meta_path, \"r\");\n",
                "  if (!m) { std::perror(meta_path); return 3; }\n",
                "  const unsigned gx = (unsigned)nexus_next(m), gy = (unsigned)nexus_next(m),"
                " gz = (unsigned)nexus_next(m);\n",
                "  const unsigned tx = (unsigned)nexus_next(m), ty = (unsigned)nexus_next(m),"
                " tz = (unsigned)nexus_next(m);\n"]
        for tname, kind in runtime:
            main.append(f"  {tname} = ({kind})nexus_next(m);\n")
        main += setup
        main.append("  std::fclose(m);\n")
        main.append("  const unsigned bx = (gx + tx - 1) / tx, by = (gy + ty - 1) / ty,"
                    " bz = (gz + tz - 1) / tz;\n")
        call = "nexus_emu_body(" + ", ".join(args)
        if d == "metal":
            main.append(
                "  for (unsigned kz = 0; kz < bz; ++kz)\n"
                "  for (unsigned ky = 0; ky < by; ++ky)\n"
                "  for (unsigned kx = 0; kx < bx; ++kx)\n"
                "  for (unsigned lz = 0; lz < tz; ++lz)\n"
                "  for (unsigned ly = 0; ly < ty; ++ly)\n"
                "  for (unsigned lx = 0; lx < tx; ++lx) {\n"
                "    const uint3 pos = {kx * tx + lx, ky * ty + ly, kz * tz + lz};\n"
                "    if (pos.x >= gx || pos.y >= gy || pos.z >= gz) continue;  // dispatchThreads\n"
                f"    {call}, pos, uint3{{lx, ly, lz}}, uint3{{kx, ky, kz}}, uint3{{tx, ty, tz}},"
                " uint3{bx, by, bz});\n"
                "  }\n")
        else:
            main.append(
                "  blockDim = {tx, ty, tz};\n"
                "  gridDim = {bx, by, bz};\n"
                "  for (unsigned kz = 0; kz < bz; ++kz)\n"
                "  for (unsigned ky = 0; ky < by; ++ky)\n"
                "  for (unsigned kx = 0; kx < bx; ++kx)\n"
                "  for (unsigned lz = 0; lz < tz; ++lz)\n"
                "  for (unsigned ly = 0; ly < ty; ++ly)\n"
                "  for (unsigned lx = 0; lx < tx; ++lx) {  // whole blocks, as CUDA launches\n"
                "    blockIdx = {kx, ky, kz};\n"
                "    threadIdx = {lx, ly, lz};\n"
                f"    {call});\n"
                "  }\n")
        for j in range(len(self.output_names)):
            main.append(f"  nexus_write(dir, \"out{j}.bin\", out{j}, out{j}_n);\n")
        for i in range(len(self.input_names)):
            main.append(f"  delete[] in{i};\n")
        for j in range(len(self.output_names)):
            main.append(f"  delete[] out{j};\n")
        main.append("  return 0;\n}\n")
        out += main
        return "".join(out)

    # ---- build and run ------------------------------------------------------------------
    def build(self, tu: str, sanitize: bool) -> Path:
        """Compile ``tu`` (cached by content hash) and return the executable's path."""
        exe = compiler()
        if exe is None:
            raise EmulationError("g++ is not on PATH; the Metal emulation needs it")
        flags = list(BASE_FLAGS) + (list(SANITIZE_FLAGS) if sanitize else [])
        shim_dir = metal_kernels_dir()
        shim = (shim_dir / "metal_shim.h").read_text() if self.dialect == "metal" else ""
        key = hashlib.sha256("\0".join([tu, shim, " ".join(flags), _compiler_id()]).encode())
        folder = cache_dir() / key.hexdigest()[:24]
        binary = folder / "emu"
        if binary.is_file():
            return binary
        folder.mkdir(parents=True, exist_ok=True)
        src = folder / "emu.cpp"
        src.write_text(tu)
        tmp = folder / f"emu.{os.getpid()}.tmp"
        cmd = [exe, *flags, "-I", str(shim_dir), str(src), "-o", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise EmulationError(f"g++ failed on {src}:\n{done.stderr[-6000:]}")
        os.replace(tmp, binary)
        return binary

    def __call__(
        self,
        *,
        inputs: Sequence[Any],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[Any],
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        template: Sequence[tuple[str, Any]] | None = None,
        init_value: float | None = None,
        verbose: bool = False,
        sanitize: bool = False,
        bake_template: bool = False,
    ) -> list[np.ndarray]:
        """Run the body over ``grid`` and return the outputs as numpy arrays."""
        if len(inputs) != len(self.input_names):
            raise ValueError(f"{len(inputs)} inputs for names {self.input_names}")
        if len(output_shapes) != len(self.output_names) or len(output_dtypes) != len(
            self.output_names
        ):
            raise ValueError(f"output shapes/dtypes must match names {self.output_names}")
        if any(int(g) < 1 for g in grid) or any(int(t) < 1 for t in threadgroup):
            raise ValueError(f"grid {grid} and threadgroup {threadgroup} must be positive")
        arrays = [np.ascontiguousarray(_to_numpy(x)) for x in inputs]
        for nm, a in zip(self.input_names, arrays, strict=True):
            if a.ndim > _MAX_NDIM:
                raise ValueError(f"input {nm} has {a.ndim} > {_MAX_NDIM} dimensions")
        out_np = [_np_dtype(dt) for dt in output_dtypes]
        tmpl = list(template or [])
        tu = self.translation_unit(arrays, out_np, tmpl, bake_template)
        if verbose:
            print(tu)
        use_san = sanitize and sanitizers_available()
        binary = self.build(tu, use_san)

        meta: list[str] = [" ".join(str(int(g)) for g in grid),
                           " ".join(str(int(t)) for t in threadgroup)]
        if not bake_template:
            meta += [str(int(v)) for _, v in tmpl
                     if not isinstance(v, mx.Dtype | np.dtype | type)]
        with tempfile.TemporaryDirectory(prefix="nexus_emu_run_") as tmp:
            for i, a in enumerate(arrays):
                strides = [s // a.itemsize for s in a.strides] if a.ndim else []
                meta.append(" ".join(str(v) for v in [a.nbytes, a.ndim, *a.shape, *strides]))
                (Path(tmp) / f"in{i}.bin").write_bytes(a.tobytes())
            for shape, dt in zip(output_shapes, out_np, strict=True):
                nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                init = "0 0" if init_value is None else f"1 {float(init_value)!r}"
                meta.append(f"{nbytes} {init}")
            (Path(tmp) / "meta.txt").write_text("\n".join(meta) + "\n")
            ran = subprocess.run([str(binary), tmp], capture_output=True, text=True,
                                 env=_run_env(), timeout=600)
            if ran.returncode != 0:
                raise EmulationError(
                    f"emulated kernel {self.name} exited with {ran.returncode}:\n"
                    f"{(ran.stdout + ran.stderr)[-6000:]}"
                )
            results = []
            for j, (shape, dt) in enumerate(zip(output_shapes, out_np, strict=True)):
                raw = (Path(tmp) / f"out{j}.bin").read_bytes()
                results.append(np.frombuffer(raw, dtype=dt).reshape(tuple(shape)).copy())
        return results


def emulated_metal_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    atomic_outputs: bool = False,
    source_name: str | None = None,
) -> EmulatedKernel:
    """Same arguments as ``mx.fast.metal_kernel``; a CPU emulation of the Metal body.

    Inputs are always passed row-contiguous (``ensure_row_contiguous=False`` is accepted but
    emulated with contiguous copies); atomic outputs are not supported.
    """
    if atomic_outputs:
        raise EmulationError("atomic outputs are not supported by the CPU emulation")
    return EmulatedKernel(name, input_names, output_names, source, header,
                          dialect="metal", source_name=source_name)


def emulated_cuda_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    shared_memory: int = 0,
    source_name: str | None = None,
) -> EmulatedKernel:
    """Same arguments as ``mx.fast.cuda_kernel``; a CPU emulation of the CUDA body (no shared
    memory, no cooperative groups)."""
    if shared_memory:
        raise EmulationError("shared memory is not supported by the CPU emulation")
    return EmulatedKernel(name, input_names, output_names, source, header,
                          dialect="cuda", source_name=source_name)


def emulate_metal_file(
    file_stem: str,
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
) -> EmulatedKernel:
    """Emulate ``metal_kernels/<file_stem>.metal`` (the text the library hands to MLX)."""
    path = metal_kernels_dir() / f"{file_stem}.metal"
    return emulated_metal_kernel(name, input_names, output_names, path.read_text(),
                                 source_name=str(path))
