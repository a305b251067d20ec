// metal_shim.h: just enough of the Metal Shading Language for g++ to compile nexus-mlx kernel
// bodies (metal_kernels/*.metal) as C++17, so that their index arithmetic and numerics can be
// checked on a CPU (see nexus_mlx/kernels/metal_emulation.py).
//
// This emulates a kernel's logic on the CPU; it is NOT Metal. Threads run one after another,
// so there are no threadgroup barriers, no SIMD-group functions, no threadgroup memory, and no
// data races to find. Metal's fast-math contractions (e.g. a*b - c*d fused into an fma) are not
// reproduced: the emulation is compiled with -ffp-contract=off and rounds every operation.
//
// Include every standard header before this one: it defines lower-case macros (`device`,
// `constant`, `thread`, `kernel`) that would break headers included after it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

// Address-space qualifiers and the kernel keyword vanish: the CPU has one address space.
#define device
#define constant
#define thread
#define kernel

typedef unsigned int uint;
typedef unsigned long ulong;

struct uint3 {
  uint x, y, z;
};

// Metal `half` is IEEE binary16; GCC >= 12 implements _Float16 on x86-64 and AArch64 with
// correctly rounded (round-to-nearest-even) conversions, as Metal's float -> half casts are.
typedef _Float16 half;
typedef half float16_t;  // MLX's name for half in generated kernels

// The few metal:: math functions a body may call (MLX adds `using namespace metal;`).
namespace metal {
using std::abs;
using std::cos;
using std::exp;
using std::fma;
using std::sin;
using std::sqrt;
template <typename U>
inline U min(U a, U b) { return b < a ? b : a; }
template <typename U>
inline U max(U a, U b) { return a < b ? b : a; }
}  // namespace metal
