/* swiglu.c -- the SwiGLU activation of an MLP, silu(gate) * up, elementwise over float32, for
 * the CPU forward pass. MLX's CPU exp is scalar, and the compiled polynomial exp of
 * kernels/cpu_exp.py runs at ~2.5 ns per element; at 1,536 features x 512 prefill rows that is
 * ~4 ms per layer, 9% of a SmolLM2 prefill. Here: 16 lanes and the caller's cores.
 *
 * A plain shared library (no Python API), loaded with ctypes by nexus_mlx/kernels/swiglu.py.
 * One binary holds every SIMD path; the caller picks one at run time (nexus_sg_best_isa()):
 *
 *   NEXUS_SG_SCALAR   portable C, libm expf
 *   NEXUS_SG_AVX2     x86-64 AVX2 + FMA, 8 lanes
 *   NEXUS_SG_AVX512   x86-64 AVX-512F, 16 lanes, masked tails
 *
 * Layout contract (checked by the Python wrapper):
 *   gate (rows, g_stride), up (rows, u_stride): float32, row-major, the first f entries of each
 *   row read (the two halves of one fused gate/up product are such views); out (rows, f)
 *   contiguous, written. rows >= 1, 1 <= f <= both strides.
 *
 * Specification (kernels/swiglu.py's reference, nn.silu(gate) * up, computes the same):
 *   out[r, i] = g / (1 + exp(-g)) * u,  g = gate[r, i], u = up[r, i]
 * evaluated without overflow as e = exp(-|g|) in (0, 1], sigmoid = g >= 0 ? 1 / (1 + e)
 * : e / (1 + e). The SIMD exp is simd_exp.h's (within 1e-7 relative over [-87, 0], exactly 0
 * below -87: there sigmoid is 1 or 0 to float32 precision anyway). NaN in gives NaN out.
 *
 * Threads: rows are split into contiguous shares over at most `threads` POSIX threads (the
 * caller's thread takes the first share) once a call holds at least NEXUS_SG_PARALLEL elements.
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#define NEXUS_SG_X86 1
#include <immintrin.h>
#endif

#include "native_rt.h"
#include "simd_exp.h"

#ifndef NEXUS_SG_SOURCE_ID
#define NEXUS_SG_SOURCE_ID "unknown"
#endif

#define NEXUS_SG_ABI 1
#define NEXUS_SG_PARALLEL (1 << 15) /* elements per call before a second thread pays off */

enum { NEXUS_SG_SCALAR = 0, NEXUS_SG_AVX512 = 1, NEXUS_SG_AVX2 = 2, NEXUS_SG_N_ISA = 3 };
enum { NEXUS_SG_OK = 0, NEXUS_SG_EBADARG = -1, NEXUS_SG_EISA = -2 };

static const char *const isa_names[NEXUS_SG_N_ISA] = {"scalar", "avx512", "avx2"};

typedef void (*row_fn)(const float *g, const float *u, float *out, int64_t f);

static inline float silu_mul_scalar(float g, float u) {
  float e = expf(-fabsf(g));
  float s = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return g * s * u;
}

static void row_scalar(const float *g, const float *u, float *out, int64_t f) {
  for (int64_t i = 0; i < f; ++i) out[i] = silu_mul_scalar(g[i], u[i]);
}

#if defined(NEXUS_SG_X86)
PS_AVX512 static inline __m512 silu_mul512(__m512 g, __m512 u) {
  __m512 a = _mm512_abs_ps(g);
  __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), a)); /* exp(-|g|), argument <= 0 */
  __m512 d = _mm512_add_ps(e, _mm512_set1_ps(1.0f));
  __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  __m512 num = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg, e);
  return _mm512_mul_ps(_mm512_mul_ps(g, _mm512_div_ps(num, d)), u);
}

PS_AVX512 static void row_avx512(const float *g, const float *u, float *out, int64_t f) {
  int64_t i = 0;
  for (; i + 16 <= f; i += 16)
    _mm512_storeu_ps(out + i, silu_mul512(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < f) {
    __mmask16 m = (__mmask16)((1u << (f - i)) - 1u);
    __m512 r = silu_mul512(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(out + i, m, r);
  }
}

PS_AVX2 static inline __m256 silu_mul256(__m256 g, __m256 u) {
  __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 e = exp256(_mm256_or_ps(g, sign)); /* exp(-|g|): the sign bit set */
  __m256 d = _mm256_add_ps(e, _mm256_set1_ps(1.0f));
  __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  __m256 num = _mm256_blendv_ps(_mm256_set1_ps(1.0f), e, neg);
  return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(num, d)), u);
}

PS_AVX2 static void row_avx2(const float *g, const float *u, float *out, int64_t f) {
  int64_t i = 0;
  for (; i + 8 <= f; i += 8)
    _mm256_storeu_ps(out + i, silu_mul256(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  for (; i < f; ++i) out[i] = silu_mul_scalar(g[i], u[i]);
}
#endif

static int cpu_supports(int isa) {
  switch (isa) {
    case NEXUS_SG_SCALAR:
      return 1;
    case NEXUS_SG_AVX2:
      return nexus_has_avx2_fma();
    case NEXUS_SG_AVX512:
      return nexus_has_avx512f();
    default:
      return 0;
  }
}

static row_fn isa_fn(int isa) {
  if (isa < 0 || isa >= NEXUS_SG_N_ISA || !cpu_supports(isa)) return NULL;
  switch (isa) {
#if defined(NEXUS_SG_X86)
    case NEXUS_SG_AVX2:
      return row_avx2;
    case NEXUS_SG_AVX512:
      return row_avx512;
#endif
    default:
      return row_scalar;
  }
}

NEXUS_API int nexus_sg_abi_version(void) { return NEXUS_SG_ABI; }
NEXUS_API const char *nexus_sg_source_id(void) { return NEXUS_SG_SOURCE_ID; }
NEXUS_API const char *nexus_sg_isa_name(int isa) {
  return (isa >= 0 && isa < NEXUS_SG_N_ISA) ? isa_names[isa] : NULL;
}
NEXUS_API int nexus_sg_isa_available(int isa) { return isa_fn(isa) != NULL ? 1 : 0; }
NEXUS_API int nexus_sg_best_isa(void) {
  static const int order[] = {NEXUS_SG_AVX512, NEXUS_SG_AVX2, NEXUS_SG_SCALAR};
  for (size_t k = 0; k < sizeof order / sizeof order[0]; ++k)
    if (isa_fn(order[k]) != NULL) return order[k];
  return NEXUS_SG_SCALAR;
}

typedef struct {
  const float *g, *u;
  float *out;
  int64_t f, g_stride, u_stride;
  row_fn fn;
} sg_call;

static void run_rows(const void *ctx, int64_t row0, int64_t row1) {
  const sg_call *c = (const sg_call *)ctx;
  for (int64_t r = row0; r < row1; ++r)
    c->fn(c->g + r * c->g_stride, c->u + r * c->u_stride, c->out + r * c->f, c->f);
}

/* out = silu(gate) * up over rows [0, rows) (see the specification above). isa < 0 picks the
 * fastest available. Returns NEXUS_SG_OK or a negative error code. */
NEXUS_API int nexus_sg_swiglu(int isa, const float *gate, int64_t g_stride, const float *up,
                              int64_t u_stride, float *out, int64_t rows, int64_t f,
                              int threads) {
  if (gate == NULL || up == NULL || out == NULL || rows < 1 || f < 1 || g_stride < f ||
      u_stride < f)
    return NEXUS_SG_EBADARG;
  row_fn fn = isa_fn(isa < 0 ? nexus_sg_best_isa() : isa);
  if (fn == NULL) return NEXUS_SG_EISA;
  sg_call call = {gate, up, out, f, g_stride, u_stride, fn};
  nexus_parallel_rows(run_rows, &call, rows, threads, rows * f >= NEXUS_SG_PARALLEL);
  return NEXUS_SG_OK;
}
