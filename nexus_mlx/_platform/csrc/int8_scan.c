/* int8_scan.c -- native CPU scan of the semantic lookaside buffer (SLB): INT8 dot products of
 * one query against N stored rows, fused with a top-k selection, so Python receives k results.
 *
 * A plain shared library (no Python API), loaded with ctypes by nexus_mlx/kernels/int8_scan.py.
 * One binary holds every SIMD path; the caller picks one at run time (nexus_i8_best_isa() names
 * the fastest this CPU supports):
 *
 *   NEXUS_I8_SCALAR     portable C, int32 accumulation
 *   NEXUS_I8_AVX2       x86-64 AVX2: _mm256_maddubs_epi16(|q|, sign(r, q)) + _mm256_madd_epi16
 *   NEXUS_I8_AVX512VNNI x86-64 AVX-512 VNNI: _mm512_dpbusd_epi32(q + 128, r) - 128 * sum(r)
 *   NEXUS_I8_NEON       AArch64 NEON: vmull_s8 + vpadalq_s16
 *   NEXUS_I8_NEONDOT    AArch64 NEON dot product: vdotq_s32
 *
 * Layout contract (checked by the Python wrapper, re-checked here where cheap):
 *   codes   (n, stride) int8, row-major; values in [-127, 127]; bytes [dim, stride) are zero;
 *           stride is a positive multiple of 64 (NEXUS_I8_ALIGN), so SIMD loops have no tail.
 *   sums    (n,) int32, sums[i] = sum_j codes[i, j] (used by the VNNI path only; may be NULL
 *           for the others).
 *   scales  (n,) float32, finite and >= 0: the per-row dequantization scale.
 *   query   (stride,) int8 in [-127, 127], zero-padded like a row.
 *
 * Specification (the Python reference in kernels/int8_scan.py computes the same):
 *   dot[i]  = sum_j int32(codes[i, j]) * int32(query[j])               exact int32
 *   key[i]  = float32(dot[i]) * scales[i]                              one float32 rounding
 *   top-k   = the k rows with the largest key, best first; equal keys rank the lower row index
 *             first (so the result is a deterministic function of the inputs on every path).
 *   quantize(x) with m = max_j |x[j]|: scale = m / 127 (float32), code[j] =
 *             clamp(rint(x[j] / scale), -127, 127) with ties to even; m == 0 gives scale 0 and
 *             all-zero codes. Non-finite input is an error.
 *   search  = quantize the float32 query, top-k, score = key * query_scale (float32); one
 *             call through a plan struct (nexus_i8_search), the Python hot path.
 *   The AVX-512 path also quantizes the query with AVX-512 (same result: the maximum does not
 *   depend on order, the division is IEEE, roundscale rounds to nearest even like rintf).
 *
 * Range: |dot| <= 16129 * stride and the VNNI sum (q + 128) * r is at most 32385 * stride, both
 * inside int32 for stride <= NEXUS_I8_MAX_DIM. float32(dot) is exact while |dot| < 2^24 (any
 * dim <= 1040); above that the conversion rounds, identically on every path (one IEEE op).
 *
 * nexus_i8_scores_mt computes nexus_i8_scores's dots with the rows split over POSIX threads
 * (identical output).
 *
 * Compiled with -ffp-contract=off: the only float arithmetic (x / scale, dot * scale,
 * key * query_scale) is one operation per statement, so every path rounds alike.
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_rt.h" /* NEXUS_API, nexus_parallel_rows */

#ifndef NEXUS_I8_SOURCE_ID
#define NEXUS_I8_SOURCE_ID "unknown"
#endif

#define NEXUS_I8_ABI 3
#define NEXUS_I8_ALIGN 64
#define NEXUS_I8_MAX_DIM 65536
#define NEXUS_I8_BLOCK 256 /* rows whose dots are computed before they enter the heap */
#define NEXUS_I8_QBUF 4096 /* query bytes kept on the stack; larger strides use malloc */

enum {
  NEXUS_I8_SCALAR = 0,
  NEXUS_I8_AVX2 = 1,
  NEXUS_I8_AVX512VNNI = 2,
  NEXUS_I8_NEON = 3,
  NEXUS_I8_NEONDOT = 4,
  NEXUS_I8_N_ISA = 5
};

enum {
  NEXUS_I8_OK = 0,
  NEXUS_I8_EBADARG = -1,   /* null pointer, bad stride/dim/k, negative n */
  NEXUS_I8_ENONFINITE = -2, /* the float query holds a NaN or an infinity */
  NEXUS_I8_EISA = -3,      /* the requested ISA is not built in or not supported by this CPU */
  NEXUS_I8_ENOMEM = -4
};

static const char *const isa_names[NEXUS_I8_N_ISA] = {"scalar", "avx2", "avx512vnni", "neon",
                                                      "neondot"};

typedef void (*dots_fn)(const int8_t *codes, const int32_t *sums, int64_t n, int64_t stride,
                        const int8_t *query, int32_t *out);

/* Quantize x[0:dim] (dim >= 1) into out[0:dim] and *scale, or return NEXUS_I8_ENONFINITE. The
 * caller zeroes out[dim:stride]. */
typedef int (*quantize_fn)(const float *x, int64_t dim, int8_t *out, float *scale);

/* ---- scalar --------------------------------------------------------------------------------- */
static void dots_scalar(const int8_t *codes, const int32_t *sums, int64_t n, int64_t stride,
                        const int8_t *query, int32_t *out) {
  (void)sums;
  for (int64_t i = 0; i < n; ++i) {
    const int8_t *row = codes + i * stride;
    int32_t acc = 0;
    for (int64_t j = 0; j < stride; ++j) acc += (int32_t)row[j] * (int32_t)query[j];
    out[i] = acc;
  }
}

static int quantize_scalar(const float *x, int64_t dim, int8_t *out, float *scale) {
  float m = 0.0f;
  for (int64_t j = 0; j < dim; ++j) {
    if (!isfinite(x[j])) return NEXUS_I8_ENONFINITE;
    const float a = fabsf(x[j]);
    if (a > m) m = a;
  }
  const float s = m / 127.0f;
  *scale = s;
  if (s == 0.0f) {
    memset(out, 0, (size_t)dim);
    return NEXUS_I8_OK;
  }
  for (int64_t j = 0; j < dim; ++j) {
    float v = rintf(x[j] / s); /* default rounding mode: to nearest, ties to even */
    if (v > 127.0f) v = 127.0f;
    if (v < -127.0f) v = -127.0f;
    out[j] = (int8_t)v;
  }
  return NEXUS_I8_OK;
}

/* ---- x86-64 --------------------------------------------------------------------------------- */
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define NEXUS_I8_X86 1
#include <immintrin.h>

/* AVX2. maddubs multiplies unsigned by signed bytes and adds adjacent pairs into int16 with
 * saturation. With a = |q| (0..127) and b = sign(r, q) (r negated where q < 0, zeroed where
 * q == 0), a * b = q * r and a pair sums to at most 2 * 127 * 127 = 32258 < 32767: no
 * saturation. sign() of r = -128 would wrap, which is why codes exclude -128. */
__attribute__((target("avx2"))) static void dots_avx2(const int8_t *codes, const int32_t *sums,
                                                      int64_t n, int64_t stride,
                                                      const int8_t *query, int32_t *out) {
  (void)sums;
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const int8_t *r0 = codes + i * stride;
    const int8_t *r1 = r0 + stride;
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (int64_t j = 0; j < stride; j += 32) {
      const __m256i q = _mm256_loadu_si256((const __m256i *)(query + j));
      const __m256i aq = _mm256_abs_epi8(q);
      const __m256i b0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(r0 + j)), q);
      const __m256i b1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(r1 + j)), q);
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(aq, b0), ones));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(aq, b1), ones));
    }
    /* horizontal sums of both accumulators at once */
    __m256i h = _mm256_hadd_epi32(a0, a1);     /* a0 pairs | a1 pairs, per 128-bit lane */
    h = _mm256_hadd_epi32(h, h);               /* a0 quads, a1 quads */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    out[i] = _mm_cvtsi128_si32(s);
    out[i + 1] = _mm_extract_epi32(s, 1);
  }
  for (; i < n; ++i) {
    const int8_t *r0 = codes + i * stride;
    __m256i a0 = _mm256_setzero_si256();
    for (int64_t j = 0; j < stride; j += 32) {
      const __m256i q = _mm256_loadu_si256((const __m256i *)(query + j));
      const __m256i b0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(r0 + j)), q);
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), b0),
                                                   ones));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    out[i] = _mm_cvtsi128_si32(s);
  }
}

/* AVX-512 VNNI. dpbusd multiplies unsigned by signed bytes and adds groups of four into int32
 * (no saturation in this form). The query is the unsigned operand, offset by 128: sum_j
 * (q[j] + 128) * r[j] = dot + 128 * sum_j r[j], so dot = dpbusd - 128 * sums[i]. Zero padding
 * contributes 128 * 0 = 0. Four rows per iteration keep four independent accumulator chains. */
#define NEXUS_VNNI_TARGET "avx512f,avx512bw,avx512vnni"

__attribute__((target(NEXUS_VNNI_TARGET))) static inline int32_t hsum512(__m512i v) {
  __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

__attribute__((target(NEXUS_VNNI_TARGET))) static void dots_vnni(const int8_t *codes,
                                                                 const int32_t *sums, int64_t n,
                                                                 int64_t stride,
                                                                 const int8_t *query,
                                                                 int32_t *out) {
  const __m512i offset = _mm512_set1_epi8((char)0x80);
  int64_t i = 0;
  if (stride == 384) { /* the default embedder's width: the query stays in six registers */
    __m512i q[6];
    for (int c = 0; c < 6; ++c)
      q[c] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(query + 64 * c)), offset);
    for (; i + 4 <= n; i += 4) {
      const int8_t *r = codes + i * stride;
      __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
      __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
      for (int c = 0; c < 6; ++c) {
        a0 = _mm512_dpbusd_epi32(a0, q[c], _mm512_loadu_si512((const void *)(r + 64 * c)));
        a1 = _mm512_dpbusd_epi32(a1, q[c], _mm512_loadu_si512((const void *)(r + 384 + 64 * c)));
        a2 = _mm512_dpbusd_epi32(a2, q[c], _mm512_loadu_si512((const void *)(r + 768 + 64 * c)));
        a3 = _mm512_dpbusd_epi32(a3, q[c],
                                 _mm512_loadu_si512((const void *)(r + 1152 + 64 * c)));
      }
      out[i] = hsum512(a0) - 128 * sums[i];
      out[i + 1] = hsum512(a1) - 128 * sums[i + 1];
      out[i + 2] = hsum512(a2) - 128 * sums[i + 2];
      out[i + 3] = hsum512(a3) - 128 * sums[i + 3];
    }
  }
  for (; i + 4 <= n; i += 4) {
    const int8_t *r0 = codes + i * stride;
    const int8_t *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
    for (int64_t j = 0; j < stride; j += 64) {
      const __m512i q = _mm512_xor_si512(_mm512_loadu_si512((const void *)(query + j)), offset);
      a0 = _mm512_dpbusd_epi32(a0, q, _mm512_loadu_si512((const void *)(r0 + j)));
      a1 = _mm512_dpbusd_epi32(a1, q, _mm512_loadu_si512((const void *)(r1 + j)));
      a2 = _mm512_dpbusd_epi32(a2, q, _mm512_loadu_si512((const void *)(r2 + j)));
      a3 = _mm512_dpbusd_epi32(a3, q, _mm512_loadu_si512((const void *)(r3 + j)));
    }
    out[i] = hsum512(a0) - 128 * sums[i];
    out[i + 1] = hsum512(a1) - 128 * sums[i + 1];
    out[i + 2] = hsum512(a2) - 128 * sums[i + 2];
    out[i + 3] = hsum512(a3) - 128 * sums[i + 3];
  }
  for (; i < n; ++i) {
    const int8_t *r0 = codes + i * stride;
    __m512i a0 = _mm512_setzero_si512();
    for (int64_t j = 0; j < stride; j += 64) {
      const __m512i q = _mm512_xor_si512(_mm512_loadu_si512((const void *)(query + j)), offset);
      a0 = _mm512_dpbusd_epi32(a0, q, _mm512_loadu_si512((const void *)(r0 + j)));
    }
    out[i] = hsum512(a0) - 128 * sums[i];
  }
}
/* The same quantization, 16 floats at a time: the maximum of |x| does not depend on the order,
 * the division is IEEE, roundscale rounds to nearest even like rintf, then the same clamp. */
__attribute__((target(NEXUS_VNNI_TARGET))) static int quantize_avx512(const float *x,
                                                                      int64_t dim, int8_t *out,
                                                                      float *scale) {
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t j = 0; j < dim; j += 16) {
    const __mmask16 mk = dim - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dim - j)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(mk, x + j);
    const __m512 d = _mm512_sub_ps(v, v); /* 0 for finite values, NaN for NaN and +-inf */
    bad |= _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
  }
  if (bad) return NEXUS_I8_ENONFINITE;
  const float s = _mm512_reduce_max_ps(vmax) / 127.0f;
  *scale = s;
  if (s == 0.0f) {
    memset(out, 0, (size_t)dim);
    return NEXUS_I8_OK;
  }
  const __m512 vs = _mm512_set1_ps(s);
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  for (int64_t j = 0; j < dim; j += 16) {
    const __mmask16 mk = dim - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dim - j)) - 1u);
    const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + j), vs);
    __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    _mm512_mask_cvtepi32_storeu_epi8(out + j, mk, _mm512_cvttps_epi32(r));
  }
  return NEXUS_I8_OK;
}
#endif /* x86-64 */

/* ---- AArch64 -------------------------------------------------------------------------------- */
#if defined(__aarch64__) || defined(_M_ARM64)
#define NEXUS_I8_ARM 1
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* NEON without dot product: products of two int8 fit int16 (|.| <= 127 * 127); vpadalq_s16 adds
 * adjacent int16 pairs into int32 lanes. */
static void dots_neon(const int8_t *codes, const int32_t *sums, int64_t n, int64_t stride,
                      const int8_t *query, int32_t *out) {
  (void)sums;
  for (int64_t i = 0; i < n; ++i) {
    const int8_t *row = codes + i * stride;
    int32x4_t acc0 = vdupq_n_s32(0), acc1 = vdupq_n_s32(0);
    for (int64_t j = 0; j < stride; j += 16) {
      const int8x16_t q = vld1q_s8(query + j);
      const int8x16_t r = vld1q_s8(row + j);
      acc0 = vpadalq_s16(acc0, vmull_s8(vget_low_s8(r), vget_low_s8(q)));
      acc1 = vpadalq_s16(acc1, vmull_s8(vget_high_s8(r), vget_high_s8(q)));
    }
    out[i] = vaddvq_s32(vaddq_s32(acc0, acc1));
  }
}

/* NEON dot product (ARMv8.2 DotProd, every Apple silicon chip): vdotq_s32 adds groups of four
 * signed products into int32 lanes; no offset trick is needed. */
#if defined(__ARM_FEATURE_DOTPROD)
#define NEXUS_DOTPROD_ATTR
#define NEXUS_I8_HAVE_DOTPROD 1
#elif defined(__clang__) && __clang_major__ >= 16
#define NEXUS_DOTPROD_ATTR __attribute__((target("dotprod")))
#define NEXUS_I8_HAVE_DOTPROD 1
#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10
#define NEXUS_DOTPROD_ATTR __attribute__((target("+dotprod")))
#define NEXUS_I8_HAVE_DOTPROD 1
#endif

#if defined(NEXUS_I8_HAVE_DOTPROD)
NEXUS_DOTPROD_ATTR static void dots_neondot(const int8_t *codes, const int32_t *sums, int64_t n,
                                            int64_t stride, const int8_t *query, int32_t *out) {
  (void)sums;
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const int8_t *r0 = codes + i * stride;
    const int8_t *r1 = r0 + stride;
    int32x4_t a0 = vdupq_n_s32(0), a1 = vdupq_n_s32(0);
    for (int64_t j = 0; j < stride; j += 16) {
      const int8x16_t q = vld1q_s8(query + j);
      a0 = vdotq_s32(a0, vld1q_s8(r0 + j), q);
      a1 = vdotq_s32(a1, vld1q_s8(r1 + j), q);
    }
    out[i] = vaddvq_s32(a0);
    out[i + 1] = vaddvq_s32(a1);
  }
  for (; i < n; ++i) {
    const int8_t *r0 = codes + i * stride;
    int32x4_t a0 = vdupq_n_s32(0);
    for (int64_t j = 0; j < stride; j += 16) a0 = vdotq_s32(a0, vld1q_s8(r0 + j), vld1q_s8(query + j));
    out[i] = vaddvq_s32(a0);
  }
}
#endif
#endif /* AArch64 */

/* ---- run-time selection ----------------------------------------------------------------------- */
static int cpu_supports(int isa) {
  switch (isa) {
    case NEXUS_I8_SCALAR:
      return 1;
#if defined(NEXUS_I8_X86)
    case NEXUS_I8_AVX2:
      return __builtin_cpu_supports("avx2") ? 1 : 0;
    case NEXUS_I8_AVX512VNNI:
      /* libgcc / compiler-rt report AVX-512 features only when the OS saves the zmm state */
      return (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vnni"))
                 ? 1
                 : 0;
#endif
#if defined(NEXUS_I8_ARM)
    case NEXUS_I8_NEON:
      return 1; /* Advanced SIMD is mandatory on AArch64 */
#if defined(NEXUS_I8_HAVE_DOTPROD)
    case NEXUS_I8_NEONDOT: {
#if defined(__ARM_FEATURE_DOTPROD)
      return 1;
#elif defined(__linux__)
      return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? 1 : 0;
#elif defined(__APPLE__)
      int value = 0;
      size_t size = sizeof value;
      if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &value, &size, NULL, 0) != 0) return 0;
      return value ? 1 : 0;
#else
      return 0;
#endif
    }
#endif
#endif
    default:
      return 0;
  }
}

static dots_fn isa_fn(int isa) {
  if (isa < 0 || isa >= NEXUS_I8_N_ISA || !cpu_supports(isa)) return NULL;
  switch (isa) {
    case NEXUS_I8_SCALAR:
      return dots_scalar;
#if defined(NEXUS_I8_X86)
    case NEXUS_I8_AVX2:
      return dots_avx2;
    case NEXUS_I8_AVX512VNNI:
      return dots_vnni;
#endif
#if defined(NEXUS_I8_ARM)
    case NEXUS_I8_NEON:
      return dots_neon;
#if defined(NEXUS_I8_HAVE_DOTPROD)
    case NEXUS_I8_NEONDOT:
      return dots_neondot;
#endif
#endif
    default:
      return NULL;
  }
}

/* The fastest supported path; -1 (and every entry point) means "this one". */
NEXUS_API int nexus_i8_best_isa(void) {
  static const int order[] = {NEXUS_I8_AVX512VNNI, NEXUS_I8_AVX2, NEXUS_I8_NEONDOT, NEXUS_I8_NEON};
  for (size_t k = 0; k < sizeof order / sizeof order[0]; ++k)
    if (isa_fn(order[k]) != NULL) return order[k];
  return NEXUS_I8_SCALAR;
}

static dots_fn resolve(int isa) { return isa_fn(isa < 0 ? nexus_i8_best_isa() : isa); }

/* The query quantizer that goes with a scan path (NULL if the path is unavailable). */
static quantize_fn quantizer(int isa) {
  if (isa < 0) isa = nexus_i8_best_isa();
  if (isa_fn(isa) == NULL) return NULL;
#if defined(NEXUS_I8_X86)
  if (isa == NEXUS_I8_AVX512VNNI) return quantize_avx512;
#endif
  return quantize_scalar;
}

NEXUS_API int nexus_i8_abi_version(void) { return NEXUS_I8_ABI; }

NEXUS_API const char *nexus_i8_source_id(void) { return NEXUS_I8_SOURCE_ID; }

NEXUS_API int nexus_i8_n_isa(void) { return NEXUS_I8_N_ISA; }

NEXUS_API const char *nexus_i8_isa_name(int isa) {
  return (isa >= 0 && isa < NEXUS_I8_N_ISA) ? isa_names[isa] : NULL;
}

/* 1 if `isa` is compiled into this binary and this CPU (and OS) can run it. */
NEXUS_API int nexus_i8_isa_available(int isa) { return isa_fn(isa) != NULL ? 1 : 0; }

static int check_layout(const int8_t *codes, int64_t n, int64_t stride) {
  if (n < 0 || stride <= 0 || stride % NEXUS_I8_ALIGN != 0 || stride > NEXUS_I8_MAX_DIM)
    return NEXUS_I8_EBADARG;
  if (n > 0 && codes == NULL) return NEXUS_I8_EBADARG;
  return NEXUS_I8_OK;
}

/* ---- entry points ----------------------------------------------------------------------------- */
/* int32 dot products of every row with the (padded) int8 query. */
NEXUS_API int nexus_i8_scores(int isa, const int8_t *codes, const int32_t *sums, int64_t n,
                              int64_t stride, const int8_t *query, int32_t *out) {
  int rc = check_layout(codes, n, stride);
  if (rc != NEXUS_I8_OK) return rc;
  const dots_fn dots = resolve(isa);
  if (dots == NULL) return NEXUS_I8_EISA;
  if (query == NULL || (n > 0 && out == NULL)) return NEXUS_I8_EBADARG;
#if defined(NEXUS_I8_X86)
  if (dots == dots_vnni && n > 0 && sums == NULL) return NEXUS_I8_EBADARG;
#endif
  dots(codes, sums, n, stride, query, out);
  return NEXUS_I8_OK;
}

/* The arguments of one nexus_i8_scores_mt call; scores_rows computes rows [r0, r1). */
typedef struct {
  dots_fn dots;
  const int8_t *codes;
  const int32_t *sums;
  int64_t stride;
  const int8_t *query;
  int32_t *out;
} scores_call;

static void scores_rows(const void *ctx, int64_t r0, int64_t r1) {
  const scores_call *c = (const scores_call *)ctx;
  c->dots(c->codes + r0 * c->stride, c->sums == NULL ? NULL : c->sums + r0, r1 - r0, c->stride,
          c->query, c->out + r0);
}

/* nexus_i8_scores with the rows split into contiguous shares over up to `threads` POSIX threads
 * (nexus_parallel_rows). Every dot is computed exactly as by nexus_i8_scores, so the output is
 * identical. */
NEXUS_API int nexus_i8_scores_mt(int isa, const int8_t *codes, const int32_t *sums, int64_t n,
                                 int64_t stride, const int8_t *query, int32_t *out, int threads) {
  int rc = check_layout(codes, n, stride);
  if (rc != NEXUS_I8_OK) return rc;
  const dots_fn dots = resolve(isa);
  if (dots == NULL) return NEXUS_I8_EISA;
  if (query == NULL || (n > 0 && out == NULL) || threads < 1) return NEXUS_I8_EBADARG;
#if defined(NEXUS_I8_X86)
  if (dots == dots_vnni && n > 0 && sums == NULL) return NEXUS_I8_EBADARG;
#endif
  if (n == 0) return NEXUS_I8_OK;
  const scores_call call = {dots, codes, sums, stride, query, out};
  nexus_parallel_rows(scores_rows, &call, n, threads, threads > 1);
  return NEXUS_I8_OK;
}

/* Quantize x[0:dim] into out[0:stride] (zero padding after dim) with the quantizer of `isa`;
 * *scale receives the scale. */
NEXUS_API int nexus_i8_quantize(int isa, const float *x, int64_t dim, int64_t stride,
                                int8_t *out, float *scale) {
  if (x == NULL || out == NULL || scale == NULL || dim <= 0 || stride < dim)
    return NEXUS_I8_EBADARG;
  const quantize_fn quantize = quantizer(isa);
  if (quantize == NULL) return NEXUS_I8_EISA;
  const int rc = quantize(x, dim, out, scale);
  if (rc == NEXUS_I8_OK && stride > dim) memset(out + dim, 0, (size_t)(stride - dim));
  return rc;
}

/* A size-k binary min-heap of (key, index) whose root is the worst kept entry. "Worse" means a
 * smaller key, or an equal key with a larger index. */
typedef struct {
  float key;
  int64_t idx;
} entry;

static inline int worse(entry a, entry b) {
  return a.key < b.key || (a.key == b.key && a.idx > b.idx);
}

static void sift_down(entry *h, int64_t k, int64_t p) {
  for (;;) {
    int64_t c = 2 * p + 1;
    if (c >= k) return;
    if (c + 1 < k && worse(h[c + 1], h[c])) ++c;
    if (!worse(h[c], h[p])) return;
    const entry t = h[p];
    h[p] = h[c];
    h[c] = t;
    p = c;
  }
}

static void sift_up(entry *h, int64_t p) {
  while (p > 0) {
    const int64_t parent = (p - 1) / 2;
    if (!worse(h[p], h[parent])) return;
    const entry t = h[p];
    h[p] = h[parent];
    h[parent] = t;
    p = parent;
  }
}

/* Scan rows block by block: dots into a small buffer, keys, then the heap. Writes min(k, n)
 * entries best first and returns that count. */
static int64_t topk_with(dots_fn dots, const int8_t *codes, const int32_t *sums,
                         const float *scales, int64_t n, int64_t stride, const int8_t *query,
                         int64_t k, int64_t *out_idx, float *out_key) {
  if (k > n) k = n;
  if (k == 0) return 0;
  entry stack_heap[64];
  entry *heap = k <= 64 ? stack_heap : (entry *)malloc((size_t)k * sizeof(entry));
  if (heap == NULL) return NEXUS_I8_ENOMEM;
  int32_t block[NEXUS_I8_BLOCK];
  float keys[NEXUS_I8_BLOCK];
  int64_t size = 0;
  for (int64_t start = 0; start < n; start += NEXUS_I8_BLOCK) {
    const int64_t m = n - start < NEXUS_I8_BLOCK ? n - start : NEXUS_I8_BLOCK;
    dots(codes + start * stride, sums == NULL ? NULL : sums + start, m, stride, query, block);
    for (int64_t t = 0; t < m; ++t) keys[t] = (float)block[t] * scales[start + t];
    int64_t t = 0;
    for (; t < m && size < k; ++t) { /* fill the heap */
      heap[size].key = keys[t];
      heap[size].idx = start + t;
      sift_up(heap, size);
      ++size;
    }
    /* Rows arrive in increasing index order, so a row whose key equals the root's is worse than
     * the root: only a strictly larger key enters. */
    float threshold = heap[0].key;
    for (; t < m; ++t) {
      if (keys[t] > threshold) {
        heap[0].key = keys[t];
        heap[0].idx = start + t;
        sift_down(heap, k, 0);
        threshold = heap[0].key;
      }
    }
  }
  /* Heap sort: pop the worst into the back, so out[0] is the best. */
  for (int64_t last = k - 1; last >= 0; --last) {
    out_idx[last] = heap[0].idx;
    out_key[last] = heap[0].key;
    heap[0] = heap[last];
    sift_down(heap, last, 0);
  }
  if (heap != stack_heap) free(heap);
  return k;
}

/* Top-k rows by key = float32(dot) * scales[i] for a padded int8 query; writes min(k, n)
 * entries best first and returns that count (or a negative error). */
NEXUS_API int64_t nexus_i8_topk(int isa, const int8_t *codes, const int32_t *sums,
                                const float *scales, int64_t n, int64_t stride,
                                const int8_t *query, int64_t k, int64_t *out_idx,
                                float *out_key) {
  int rc = check_layout(codes, n, stride);
  if (rc != NEXUS_I8_OK) return rc;
  if (query == NULL || k <= 0 || (n > 0 && (out_idx == NULL || out_key == NULL || scales == NULL)))
    return NEXUS_I8_EBADARG;
  const dots_fn dots = resolve(isa);
  if (dots == NULL) return NEXUS_I8_EISA;
#if defined(NEXUS_I8_X86)
  if (dots == dots_vnni && n > 0 && sums == NULL) return NEXUS_I8_EBADARG;
#endif
  return topk_with(dots, codes, sums, scales, n, stride, query, k, out_idx, out_key);
}

/* One search over a fixed buffer. The caller fills it once per buffer and, per query, writes
 * `query`, `k` and `isa`; ctypes then passes a single pointer (the hot path's call overhead). */
typedef struct {
  const int8_t *codes;   /* (n, stride) */
  const int32_t *sums;   /* (n,) */
  const float *scales;   /* (n,) */
  int64_t n;
  int64_t dim;           /* floats in query, <= stride */
  int64_t stride;
  const float *query;    /* (dim,) float32 */
  int64_t k;
  int64_t *out_idx;      /* room for min(k, n) entries */
  float *out_score;      /* room for min(k, n) entries: key * out_qscale */
  float out_qscale;
  int32_t isa;           /* -1: the fastest available */
} nexus_i8_plan;

NEXUS_API int64_t nexus_i8_plan_size(void) { return (int64_t)sizeof(nexus_i8_plan); }

/* The whole scan in one call: quantize the float32 query, top-k, dequantize the scores. */
NEXUS_API int64_t nexus_i8_search(nexus_i8_plan *p) {
  if (p == NULL || p->query == NULL || p->dim <= 0 || p->dim > p->stride) return NEXUS_I8_EBADARG;
  int rc = check_layout(p->codes, p->n, p->stride);
  if (rc != NEXUS_I8_OK) return rc;
  if (p->k <= 0 ||
      (p->n > 0 && (p->out_idx == NULL || p->out_score == NULL || p->scales == NULL)))
    return NEXUS_I8_EBADARG;
  const dots_fn dots = resolve(p->isa);
  const quantize_fn quantize = quantizer(p->isa);
  if (dots == NULL || quantize == NULL) return NEXUS_I8_EISA;
#if defined(NEXUS_I8_X86)
  if (dots == dots_vnni && p->n > 0 && p->sums == NULL) return NEXUS_I8_EBADARG;
#endif
  _Alignas(64) int8_t stack_q[NEXUS_I8_QBUF];
  int8_t *q = p->stride <= NEXUS_I8_QBUF ? stack_q : (int8_t *)malloc((size_t)p->stride);
  if (q == NULL) return NEXUS_I8_ENOMEM;
  float qscale = 0.0f;
  int64_t got = quantize(p->query, p->dim, q, &qscale);
  if (got == NEXUS_I8_OK) {
    memset(q + p->dim, 0, (size_t)(p->stride - p->dim));
    got = topk_with(dots, p->codes, p->sums, p->scales, p->n, p->stride, q, p->k, p->out_idx,
                    p->out_score);
    for (int64_t t = 0; t < got; ++t) p->out_score[t] = p->out_score[t] * qscale;
    p->out_qscale = qscale;
  }
  if (q != stack_q) free(q);
  return got;
}
