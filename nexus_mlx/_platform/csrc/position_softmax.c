/* position_softmax.c -- the masked softmax of attention scores, masked by absolute position, in
 * place, for the CPU forward pass (MLX's CPU exp is scalar; this is what long-context attention
 * spent its time on).
 *
 * A plain shared library (no Python API), loaded with ctypes by
 * nexus_mlx/kernels/position_softmax.py. One binary holds every SIMD path; the caller picks one
 * at run time (nexus_ps_best_isa() names the fastest this CPU supports):
 *
 *   NEXUS_PS_SCALAR   portable C, libm expf
 *   NEXUS_PS_AVX2     x86-64 AVX2 + FMA, 8 lanes
 *   NEXUS_PS_AVX512   x86-64 AVX-512F, 16 lanes (2^n by vscalefps)
 *
 * Layout contract (checked by the Python wrapper):
 *   scores  (rows, row_stride) float32, row-major, rows >= 1, n <= row_stride; only the first n
 *           entries of a row are read and written. Row r holds query r % t (the layout of
 *           grouped-query attention scores (Hkv, G * T, N) flattened to (Hkv * G * T, N)).
 *   qpos    (t,) int32, the queries' positions; kpos (n,) int32, the keys' positions; all in
 *           [0, 2^31 - 1], so q - k never overflows int32.
 *   window  > 0: a sliding window; <= 0: none.
 *
 * Specification (the MLX reference in kernels/position_softmax.py computes the same):
 *   visible(r, j) = d >= 0 and (window <= 0 or d < window),  d = qpos[r % t] - kpos[j]
 *   m_r = max over visible j of scores[r, j]
 *   out[r, j] = visible ? exp(scores[r, j] - m_r) / sum_visible exp(scores[r, i] - m_r) : 0
 *   A row with no visible key becomes all NaN (as softmax of only -inf does).
 * exp: the SIMD paths use the polynomial of simd_exp.h (within 1e-7 relative of exp over
 * [-87, 0]; below -87 exactly 0); the scalar path calls expf. The sum
 * is accumulated in float32 lanes, as MLX's precise softmax does in float32.
 *
 * Threads: rows are split into contiguous shares over at most `threads` POSIX threads (the
 * caller's thread takes the first share) once a call holds at least NEXUS_PS_PARALLEL scores.
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define NEXUS_PS_X86 1
#include <immintrin.h>
#endif

#include "native_rt.h"
#include "simd_exp.h"

#ifndef NEXUS_PS_SOURCE_ID
#define NEXUS_PS_SOURCE_ID "unknown"
#endif

#define NEXUS_PS_ABI 1
#define NEXUS_PS_PARALLEL (1 << 16) /* scores per call before a second thread pays off */

enum { NEXUS_PS_SCALAR = 0, NEXUS_PS_AVX2 = 1, NEXUS_PS_AVX512 = 2, NEXUS_PS_N_ISA = 3 };
enum { NEXUS_PS_OK = 0, NEXUS_PS_EBADARG = -1, NEXUS_PS_EISA = -2 };

static const char *const isa_names[NEXUS_PS_N_ISA] = {"scalar", "avx2", "avx512"};

typedef struct {
  float *scores;
  int64_t n, row_stride, t;
  const int32_t *qpos, *kpos;
  int32_t window;
} ps_job;

typedef void (*row_fn)(float *row, int64_t n, int32_t q, const int32_t *kpos, int32_t window);

static inline int visible(int32_t q, int32_t k, int32_t window) {
  int32_t d = q - k;
  return d >= 0 && (window <= 0 || d < window);
}

/* ---- scalar ------------------------------------------------------------------------------- */
static void row_scalar(float *row, int64_t n, int32_t q, const int32_t *kpos, int32_t window) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j)
    if (visible(q, kpos[j], window) && row[j] > m) m = row[j];
  if (m == -INFINITY) {
    for (int64_t j = 0; j < n; ++j) row[j] = NAN;
    return;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    float e = visible(q, kpos[j], window) ? expf(row[j] - m) : 0.0f;
    row[j] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

#if defined(NEXUS_PS_X86)
/* ---- AVX-512F ----------------------------------------------------------------------------- */

PS_AVX512 static inline __mmask16 vis512(__m512i q, const int32_t *kpos, __mmask16 lanes,
                                         __m512i w, int windowed) {
  __m512i d = _mm512_sub_epi32(q, _mm512_maskz_loadu_epi32(lanes, kpos));
  __mmask16 ok = _mm512_mask_cmpge_epi32_mask(lanes, d, _mm512_setzero_si512());
  if (windowed) ok = _mm512_mask_cmplt_epi32_mask(ok, d, w);
  return ok;
}

PS_AVX512 static void row_avx512(float *row, int64_t n, int32_t q, const int32_t *kpos,
                                 int32_t window) {
  const __m512i vq = _mm512_set1_epi32(q), vw = _mm512_set1_epi32(window);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const int windowed = window > 0;
  __m512 vmax = ninf;
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 lanes = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
    __mmask16 ok = vis512(vq, kpos + j, lanes, vw, windowed);
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(ninf, ok, row + j));
  }
  float m = _mm512_reduce_max_ps(vmax);
  if (m == -INFINITY) {
    for (int64_t j = 0; j < n; ++j) row[j] = NAN;
    return;
  }
  const __m512 vm = _mm512_set1_ps(m);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 lanes = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
    __mmask16 ok = vis512(vq, kpos + j, lanes, vw, windowed);
    __m512 x = _mm512_sub_ps(_mm512_mask_loadu_ps(ninf, ok, row + j), vm);
    __m512 e = _mm512_maskz_mov_ps(ok, exp512(x));
    vsum = _mm512_add_ps(vsum, e);
    _mm512_mask_storeu_ps(row + j, lanes, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 lanes = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
    _mm512_mask_storeu_ps(row + j, lanes, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + j), inv));
  }
}

/* ---- AVX2 + FMA --------------------------------------------------------------------------- */

PS_AVX2 static inline __m256 vis256(__m256i q, const int32_t *kpos, __m256i w, int windowed) {
  __m256i d = _mm256_sub_epi32(q, _mm256_loadu_si256((const __m256i *)kpos));
  __m256i ok = _mm256_cmpgt_epi32(d, _mm256_set1_epi32(-1)); /* d >= 0 */
  if (windowed) ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(w, d));
  return _mm256_castsi256_ps(ok);
}

PS_AVX2 static void row_avx2(float *row, int64_t n, int32_t q, const int32_t *kpos,
                             int32_t window) {
  const __m256i vq = _mm256_set1_epi32(q), vw = _mm256_set1_epi32(window);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const int windowed = window > 0;
  const int64_t body = n & ~(int64_t)7;
  __m256 vmax = ninf;
  for (int64_t j = 0; j < body; j += 8) {
    __m256 ok = vis256(vq, kpos + j, vw, windowed);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_loadu_ps(row + j), ok));
  }
  float m = hmax256(vmax);
  for (int64_t j = body; j < n; ++j)
    if (visible(q, kpos[j], window) && row[j] > m) m = row[j];
  if (m == -INFINITY) {
    for (int64_t j = 0; j < n; ++j) row[j] = NAN;
    return;
  }
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t j = 0; j < body; j += 8) {
    __m256 ok = vis256(vq, kpos + j, vw, windowed);
    __m256 x = _mm256_sub_ps(_mm256_blendv_ps(ninf, _mm256_loadu_ps(row + j), ok), vm);
    __m256 e = _mm256_and_ps(ok, exp256(x));
    vsum = _mm256_add_ps(vsum, e);
    _mm256_storeu_ps(row + j, e);
  }
  float sum = hsum256(vsum);
  for (int64_t j = body; j < n; ++j) { /* the tail through the same polynomial, one lane */
    float e = 0.0f;
    if (visible(q, kpos[j], window)) {
      float lane[8] = {row[j] - m, 0, 0, 0, 0, 0, 0, 0};
      _mm256_storeu_ps(lane, exp256(_mm256_loadu_ps(lane)));
      e = lane[0];
    }
    row[j] = e;
    sum += e;
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (int64_t j = 0; j < body; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
  for (int64_t j = body; j < n; ++j) row[j] *= _mm256_cvtss_f32(inv);
}
#endif /* x86-64 */

/* ---- dispatch ----------------------------------------------------------------------------- */
static int cpu_supports(int isa) {
  switch (isa) {
    case NEXUS_PS_SCALAR:
      return 1;
    case NEXUS_PS_AVX2:
      return nexus_has_avx2_fma();
    case NEXUS_PS_AVX512:
      return nexus_has_avx512f();
    default:
      return 0;
  }
}

static row_fn isa_fn(int isa) {
  if (isa < 0 || isa >= NEXUS_PS_N_ISA || !cpu_supports(isa)) return NULL;
  switch (isa) {
#if defined(NEXUS_PS_X86)
    case NEXUS_PS_AVX2:
      return row_avx2;
    case NEXUS_PS_AVX512:
      return row_avx512;
#endif
    default:
      return row_scalar;
  }
}

NEXUS_API int nexus_ps_abi_version(void) { return NEXUS_PS_ABI; }
NEXUS_API const char *nexus_ps_source_id(void) { return NEXUS_PS_SOURCE_ID; }
NEXUS_API int nexus_ps_n_isa(void) { return NEXUS_PS_N_ISA; }
NEXUS_API const char *nexus_ps_isa_name(int isa) {
  return (isa >= 0 && isa < NEXUS_PS_N_ISA) ? isa_names[isa] : NULL;
}
NEXUS_API int nexus_ps_isa_available(int isa) { return isa_fn(isa) != NULL ? 1 : 0; }
NEXUS_API int nexus_ps_best_isa(void) {
  static const int order[] = {NEXUS_PS_AVX512, NEXUS_PS_AVX2, NEXUS_PS_SCALAR};
  for (size_t k = 0; k < sizeof order / sizeof order[0]; ++k)
    if (isa_fn(order[k]) != NULL) return order[k];
  return NEXUS_PS_SCALAR;
}

typedef struct {
  ps_job job;
  row_fn fn;
} ps_call;

static void run_rows(const void *ctx, int64_t row0, int64_t row1) {
  const ps_call *c = (const ps_call *)ctx;
  const ps_job *job = &c->job;
  for (int64_t r = row0; r < row1; ++r)
    c->fn(job->scores + r * job->row_stride, job->n, job->qpos[r % job->t], job->kpos,
          job->window);
}

/* Softmax rows [0, rows) of `scores` in place (see the specification above). isa < 0 picks
 * the fastest available. Returns NEXUS_PS_OK or a negative error code. */
NEXUS_API int nexus_ps_softmax(int isa, float *scores, int64_t rows, int64_t n, int64_t row_stride,
                               int64_t t, const int32_t *qpos, const int32_t *kpos, int32_t window,
                               int threads) {
  if (scores == NULL || qpos == NULL || kpos == NULL || rows < 1 || n < 1 || row_stride < n ||
      t < 1 || rows % t != 0)
    return NEXUS_PS_EBADARG;
  row_fn fn = isa_fn(isa < 0 ? nexus_ps_best_isa() : isa);
  if (fn == NULL) return NEXUS_PS_EISA;
  ps_call call = {{scores, n, row_stride, t, qpos, kpos, window}, fn};
  nexus_parallel_rows(run_rows, &call, rows, threads, rows * n >= NEXUS_PS_PARALLEL);
  return NEXUS_PS_OK;
}
